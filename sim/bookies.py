"""Simulated bookies and a versioned metadata register, for driving the pure ledger operations.

A SimBookie decides every request with a real bookie's rules (bookie/ledger_rules.py, the
LedgerRules BookieStorage runs): a ledger bound to the first master key that wrote or fenced
it, a persisted fence flag (adds refused afterwards unless they are recovery adds; reads may
fence), a LAC per ledger (the highest piggybacked LAC of its entries, or a higher explicit one).
Without a journal (the default) its disk never fails and answers at once: an accepted add is
stored right away, so everything a bookie acknowledged survives its crash. With a journal
(sim/bookie_journal.py SimJournal) the rules' records are durable only after a simulated
fsync: `wait_for` is then the journal seq the answer to the last request must wait for (the
world holds the answer until the fsync), an accepted add becomes readable only once durable
(`synced`), and a crash keeps only what the journal kept, replayed through the same rules
(`recover`). A bookie can also lose its data ("wipe"): with `limbo=True` it then
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
from bookie.ledger_rules import (AddRequest, Admitted, Fence, LedgerRules, Outcome, ReadEntry, ReadLac, Request,
                                 WriteLac)
from bookie.storage_codec import Kind
from ledger.metadata import LedgerMetadata
from sim.bookie_journal import SimJournal, add_of


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
    journal: SimJournal | None = None  # None: every record durable at once
    wait_for: int = 0  # with a journal: the seq the last request's answer waits for (0: none)
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
        self.wait_for = 0
        outcome = self._step(AddRequest(ledger_id, entry_id, master_key, data, recovery))
        self.adds += 1
        if self.journal is not None:  # readable once its records are durable (synced)
            self.wait_for = self.journal.append(outcome.records, outcome.stored)
        elif outcome.stored is not None:  # its records are durable at once: stored now
            self._store(outcome.stored)

    def _store(self, add: Admitted) -> None:
        self._stored += 1
        self.rules.stored([add], [pack_position(0, self._stored)])
        # A stored entry keeps its first bytes: a recovery add of a stored entry is a no-op.
        self.entries.setdefault(add[0], {}).setdefault(add[1], add[2])

    def synced(self, adds: list[Admitted]) -> None:
        """The journal's fsync made these accepted adds durable: they are readable now."""
        for add in adds:
            self._store(add)

    def recover(self) -> None:
        """After a crash: the state is what the journal kept, replayed through the rules
        (bookie/storage_recovery.py replay: LedgerRules.replay, needs_entry)."""
        assert self.journal is not None
        self.rules, self.entries, self._stored, self.wait_for = _rules(), {}, 0, 0
        for record in self.journal.replay():
            if record.kind is not Kind.ADD:
                self.rules.replay(record)
            elif self.rules.needs_entry(record.ledger_id, record.value):
                self._store(add_of(record))

    def _fence(self, ledger_id: int, master_key: bytes) -> Outcome:
        outcome = self._step(Fence(ledger_id, master_key))
        if self.journal is not None:  # answered once the (first) FENCE record is durable
            self.wait_for = (self.journal.append(outcome.records, fence_of=ledger_id)
                             or self.journal.pending_fence(ledger_id))
        return outcome

    def read(self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes) -> bytes:
        self.wait_for = 0
        if fence:
            self._fence(ledger_id, master_key)  # persisted before the answer (recovery reads fence too, #2614)
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
        self.wait_for = 0
        return self._fence(ledger_id, master_key).lac

    def read_lac(self, ledger_id: int) -> int:
        self.wait_for = 0
        self._unknown(ledger_id)
        return self._step(ReadLac(ledger_id)).lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        self.wait_for = 0
        outcome = self._step(WriteLac(ledger_id, lac, master_key))
        if self.journal is not None:  # no answer: nobody waits, but it is durable only once synced
            self.journal.append(outcome.records)

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
        if self.journal is not None:
            self.journal.wipe()


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
