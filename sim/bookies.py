"""Simulated bookies and a versioned metadata register, for driving the pure ledger operations.

A SimBookie decides every request with a real bookie's rules (bookie/ledger_rules.py, the
LedgerRules BookieStorage runs): a ledger bound to the first master key that wrote or fenced
it, a persisted fence flag (adds refused afterwards unless they are recovery adds; reads may
fence), a LAC per ledger (the highest piggybacked LAC of its entries, or a higher explicit one).
What the simulation adds is a disk that never fails and answers at once: an accepted add is
stored right away (a real bookie acks after fsync), so everything a bookie acknowledged
survives its crash. A bookie can also lose its data ("wipe"): with `limbo=True` it then
answers every read of a ledger it held with BookieUnavailable, an unknown (what BookKeeper's
limbo state does, BP-46); with `limbo=False` it answers NoSuchLedger, the dangerous "nothing
here" that cookies exist to prevent.

MetaRegister is the metadata store as the ledger needs it: one versioned CAS
register per ledger.

sim/ledger_world.py drives clients (Writer, RecoveryOp, ...) against these over
a seeded lossy network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie import errors as B
from bookie.index import Index, pack_position
from bookie.ledger_rules import AddRequest, Fence, LedgerRules, Outcome, ReadEntry, ReadLac, Request, WriteLac
from ledger.metadata import LedgerMetadata


def _rules() -> LedgerRules:
    return LedgerRules(Index())


@dataclass
class SimBookie:
    """One simulated bookie. `entries` is what its disk holds (ledger -> entry id -> the packaged
    bytes as they came); `rules` decides, over its own index of them."""

    id: int
    alive: bool = True
    rules: LedgerRules = field(default_factory=_rules)
    entries: dict[int, dict[int, bytes]] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)   # ledgers it held before losing its data
    limbo: bool = True
    adds: int = 0
    _stored: int = 0  # entries stored so far: their made-up places in the rules' index

    # -- requests ---------------------------------------------------------------------------
    def _step(self, request: Request) -> Outcome:
        outcome = self.rules.step(request)
        if outcome.error is not None:
            raise outcome.error
        return outcome

    def _unknown(self, ledger_id: int) -> None:
        """Limbo (BP-46): what it held is unknown, never "not here". Adds and fences still land."""
        if ledger_id in self.lost and self.limbo:
            raise B.BookieUnavailable(f"bookie {self.id} lost its data and is in limbo for ledger {ledger_id}")

    def add(self, ledger_id: int, entry_id: int, data: bytes, master_key: bytes, recovery: bool) -> None:
        outcome = self._step(AddRequest(ledger_id, entry_id, master_key, data, recovery))
        if outcome.stored is not None:  # its records are durable at once: stored now
            self._stored += 1
            self.rules.stored([outcome.stored], [pack_position(0, self._stored)])
            # A stored entry keeps its first bytes: a recovery add of a stored entry is a no-op.
            self.entries.setdefault(ledger_id, {}).setdefault(entry_id, data)
        self.adds += 1

    def read(self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes) -> bytes:
        if fence:
            self._step(Fence(ledger_id, master_key))  # persisted before the answer (recovery reads fence too, #2614)
        else:
            self._unknown(ledger_id)
        data = self.has(ledger_id, entry_id)
        if data is None and ledger_id in self.lost and self.limbo:
            raise B.BookieUnavailable(f"bookie {self.id} lost its data: entry {entry_id} of ledger {ledger_id} "
                                      "is unknown (limbo)")
        if data is None:
            raise self.rules.step(ReadEntry(ledger_id, entry_id)).error or AssertionError(
                f"bookie {self.id}: ledger {ledger_id} entry {entry_id} is indexed but not on its disk")
        return data

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence (creating the ledger fenced if unknown, as BookKeeper does) and return the LAC."""
        return self._step(Fence(ledger_id, master_key)).lac

    def read_lac(self, ledger_id: int) -> int:
        self._unknown(ledger_id)
        return self._step(ReadLac(ledger_id)).lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        self._step(WriteLac(ledger_id, lac, master_key))

    def long_poll(self, ledger_id: int, entry_id: int) -> tuple[int, bytes | None]:
        """Answers at once (the simulated long-poll timeout is zero): the LAC and the entry if held."""
        return self.read_lac(ledger_id), self.has(ledger_id, entry_id)

    def has(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.entries.get(ledger_id, {}).get(entry_id)

    def wipe(self, *, limbo: bool = True) -> None:
        """The disk is lost. limbo=True: answers 'unknown' for what it held (what cookies + limbo give)."""
        self.lost |= set(self.rules.index.ledgers)
        self.rules = _rules()
        self.entries.clear()
        self.limbo = limbo


class MetaRegister:
    """One versioned compare-and-set register per ledger: the metastore as the ledger sees it."""

    def __init__(self) -> None:
        self.ledgers: dict[int, tuple[LedgerMetadata, int]] = {}
        self.writes = 0
        self.history: list[tuple[int, LedgerMetadata]] = []

    def create(self, metadata: LedgerMetadata) -> int:
        assert metadata.ledger_id not in self.ledgers
        self.ledgers[metadata.ledger_id] = (metadata, 0)
        self.history.append((0, metadata))
        return 0

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return self.ledgers[ledger_id]

    def cas(self, metadata: LedgerMetadata, expected_version: int) -> int | None:
        """The new version, or None on BadVersion."""
        _, version = self.ledgers[metadata.ledger_id]
        if version != expected_version:
            return None
        self.writes += 1
        self.ledgers[metadata.ledger_id] = (metadata, version + 1)
        self.history.append((version + 1, metadata))
        return version + 1
