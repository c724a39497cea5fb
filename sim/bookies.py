"""Simulated bookies and a versioned metadata register, for driving the pure ledger operations.

A SimBookie keeps what a real bookie's storage promises (bookie/storage.py):
entries by (ledger, entry) as the packaged bytes that came, a ledger bound to
the first master key that wrote or fenced it, a persisted fence flag (adds
refused afterwards unless they are recovery adds; reads may fence), a LAC per
ledger (the highest piggybacked LAC of its entries, or a higher explicit one).
Everything a bookie acknowledged survives its crash (it acks after fsync). A
bookie can also lose its data ("wipe"): with `limbo=True` it then answers
every read of a ledger it held with BookieUnavailable, an unknown (what
BookKeeper's limbo state does, BP-46); with `limbo=False` it answers
NoSuchLedger, the dangerous "nothing here" that cookies exist to prevent.

MetaRegister is the metadata store as the ledger needs it: one versioned CAS
register per ledger.

sim/ledger_world.py drives clients (Writer, RecoveryOp, ...) against these over
a seeded lossy network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie import errors as B
from bookie.entry import NO_ENTRY, parse_header
from ledger.metadata import LedgerMetadata


@dataclass
class SimLedger:
    master_key: bytes
    entries: dict[int, bytes] = field(default_factory=dict)
    fenced: bool = False
    explicit_lac: int = NO_ENTRY
    piggybacked_lac: int = NO_ENTRY

    @property
    def lac(self) -> int:
        return max(self.explicit_lac, self.piggybacked_lac)


@dataclass
class SimBookie:
    id: int
    alive: bool = True
    ledgers: dict[int, SimLedger] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)   # ledgers it held before losing its data
    limbo: bool = True
    adds: int = 0

    # -- requests ---------------------------------------------------------------------------
    def _ledger(self, ledger_id: int, master_key: bytes | None, create: bool) -> SimLedger:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None or (ledger_id in self.lost and self.limbo and not create):
            if ledger_id in self.lost and self.limbo and not create:
                # Limbo (BP-46): what it held is unknown, never "not here". Adds and fences still land.
                raise B.BookieUnavailable(f"bookie {self.id} lost its data and is in limbo for ledger {ledger_id}")
            if not create:
                raise B.NoSuchLedger(f"bookie {self.id} has no ledger {ledger_id}")
            ledger = self.ledgers[ledger_id] = SimLedger(master_key)
        if master_key is not None and ledger.master_key != master_key:
            raise B.Unauthorized(f"bookie {self.id}: wrong master key for ledger {ledger_id}")
        return ledger

    def add(self, ledger_id: int, entry_id: int, data: bytes, master_key: bytes, recovery: bool) -> None:
        ledger = self._ledger(ledger_id, master_key, create=True)
        if ledger.fenced and not recovery:
            raise B.LedgerFenced(f"bookie {self.id}: ledger {ledger_id} is fenced")
        header = parse_header(data)
        assert header.ledger_id == ledger_id and header.entry_id == entry_id
        ledger.entries.setdefault(entry_id, data)  # idempotent: a recovery add of a stored entry is a no-op
        ledger.piggybacked_lac = max(ledger.piggybacked_lac, header.lac)
        self.adds += 1

    def read(self, ledger_id: int, entry_id: int, fence: bool, master_key: bytes) -> bytes:
        ledger = self._ledger(ledger_id, master_key if fence else None, create=fence)
        if fence:
            ledger.fenced = True  # persisted before the answer (recovery reads fence too, #2614)
        data = ledger.entries.get(entry_id)
        if data is None and ledger_id in self.lost and self.limbo:
            raise B.BookieUnavailable(f"bookie {self.id} lost its data: entry {entry_id} of ledger {ledger_id} "
                                      "is unknown (limbo)")
        if data is None:
            raise B.NoSuchEntry(f"bookie {self.id}: ledger {ledger_id} has no entry {entry_id}")
        return data

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence (creating the ledger fenced if unknown, as BookKeeper does) and return the LAC."""
        ledger = self._ledger(ledger_id, master_key, create=True)
        ledger.fenced = True
        return ledger.lac

    def read_lac(self, ledger_id: int) -> int:
        return self._ledger(ledger_id, None, create=False).lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        ledger = self._ledger(ledger_id, master_key, create=True)
        ledger.explicit_lac = max(ledger.explicit_lac, lac)

    def long_poll(self, ledger_id: int, entry_id: int) -> tuple[int, bytes | None]:
        """Answers at once (the simulated long-poll timeout is zero): the LAC and the entry if held."""
        ledger = self._ledger(ledger_id, None, create=False)
        return ledger.lac, ledger.entries.get(entry_id)

    def has(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self.ledgers.get(ledger_id)
        return None if ledger is None else ledger.entries.get(entry_id)

    def wipe(self, *, limbo: bool = True) -> None:
        """The disk is lost. limbo=True: answers 'unknown' for what it held (what cookies + limbo give)."""
        self.lost |= set(self.ledgers)
        self.ledgers.clear()
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
