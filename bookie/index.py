"""The bookie's in-memory index and per-ledger state (pure: no I/O).

Maps (ledger, entry) to where the entry's record sits in the entry logs, and
keeps what a bookie knows of each ledger: the master key it is bound to, the
fence flag, the explicit LAC, the highest LAC field of a stored entry and the
highest stored entry id.

Memory: a bookie may hold ~10 million entries, so an entry is not a Python
object. Each ledger keeps two arrays indexed by `entry_id - base`: a u64
position (`log_id << 40 | offset`, 0 = not stored here) and a u32 length: 12
bytes per slot. Striping (seed 001: an entry goes to the write quorum starting
at `entry_id % E`) leaves holes in a bookie's run of ids, which cost one empty
slot each. Ids far outside the dense run (more than DENSE_GAP past its end, or
below its base) go to a small per-ledger dict instead, so a hostile id cannot
make us allocate a huge array.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from bookie.entry import NO_ENTRY
from bookie.storage_codec import ENTRY_RECORD_HEADER_BYTES

# What the index costs in memory, measured with tracemalloc on CPython 3.11 (docs/operations.md,
# "Memory bounds"): a dense slot, an outlier in the sparse dict, a ledger's state with its key, and
# a deleted ledger's id (kept for good: a zombie writer's add must still find the ledger deleted).
DENSE_SLOT_BYTES = 12
SPARSE_ENTRY_BYTES = 180
LEDGER_BYTES = 520
DELETED_LEDGER_BYTES = 150

OFFSET_BITS = 40
MAX_OFFSET = (1 << OFFSET_BITS) - 1
MAX_LOG_ID = (1 << (64 - OFFSET_BITS)) - 1
DENSE_GAP = 4096


def pack_position(log_id: int, offset: int) -> int:
    """One u64 for (entry log id, byte offset of the record); never 0 (offset 0 is a file header)."""
    assert 0 <= log_id <= MAX_LOG_ID and 0 < offset <= MAX_OFFSET, (log_id, offset)
    return log_id << OFFSET_BITS | offset


def unpack_position(position: int) -> tuple[int, int]:
    return position >> OFFSET_BITS, position & MAX_OFFSET


@dataclass(frozen=True, slots=True)
class Location:
    """Where one entry's record is: entry log id, record offset, length of the stored data."""

    log_id: int
    offset: int
    length: int


@dataclass(slots=True)
class LedgerEntries:
    """The stored entries of one ledger: a dense run of slots plus sparse outliers."""

    base: int = 0
    positions: array = field(default_factory=lambda: array("Q"))
    lengths: array = field(default_factory=lambda: array("I"))
    sparse: dict[int, tuple[int, int]] = field(default_factory=dict)

    def get(self, entry_id: int) -> tuple[int, int] | None:
        """(position, length) of the entry, or None."""
        slot = entry_id - self.base
        if 0 <= slot < len(self.positions):
            position = self.positions[slot]
            return (position, self.lengths[slot]) if position else None
        return self.sparse.get(entry_id)

    def put(self, entry_id: int, position: int, length: int) -> tuple[int, int] | None:
        """Store the entry's place; return the (position, length) it replaces, if any."""
        previous = self.get(entry_id)
        if not self.positions and not self.sparse:
            self.base = entry_id
        slot = entry_id - self.base
        if 0 <= slot < len(self.positions):
            self.positions[slot] = position
            self.lengths[slot] = length
        elif 0 <= slot - len(self.positions) <= DENSE_GAP:
            gap = slot - len(self.positions)
            self.positions.extend([0] * gap)
            self.lengths.extend([0] * gap)
            self.positions.append(position)
            self.lengths.append(length)
            self._absorb_sparse()
        else:
            self.sparse[entry_id] = (position, length)
        return previous

    def put_new(self, entry_id: int, position: int, length: int) -> tuple[int, int] | None:
        """put(), cheaper when the entry extends the dense run (the common case of a stream of adds)."""
        gap = entry_id - self.base - len(self.positions)
        if self.sparse or not self.positions or not 0 <= gap <= DENSE_GAP:
            return self.put(entry_id, position, length)
        if gap:
            self.positions.extend([0] * gap)
            self.lengths.extend([0] * gap)
        self.positions.append(position)
        self.lengths.append(length)
        return None

    def _absorb_sparse(self) -> None:
        # Outliers the dense run has now reached move into it, keeping get() one lookup.
        end = self.base + len(self.positions)
        for entry_id in [e for e in self.sparse if self.base <= e < end]:
            position, length = self.sparse.pop(entry_id)
            self.positions[entry_id - self.base] = position
            self.lengths[entry_id - self.base] = length

    def items(self) -> Iterator[tuple[int, int, int]]:
        """(entry_id, position, length) of every stored entry (dense run first, then outliers)."""
        for slot, position in enumerate(self.positions):
            if position:
                yield self.base + slot, position, self.lengths[slot]
        for entry_id, (position, length) in self.sparse.items():
            yield entry_id, position, length

    def count(self) -> int:
        return len(self.positions) - self.positions.count(0) + len(self.sparse)

    def copy(self) -> LedgerEntries:
        return LedgerEntries(self.base, array("Q", self.positions), array("I", self.lengths), dict(self.sparse))


@dataclass(slots=True)
class LedgerState:
    """What this bookie knows of one ledger."""

    master_key: bytes | None = None
    fenced: bool = False
    explicit_lac: int = NO_ENTRY
    max_lac: int = NO_ENTRY  # highest LAC field among stored entries
    last_entry: int = NO_ENTRY
    entries: LedgerEntries = field(default_factory=LedgerEntries)
    # The Index generation this state belongs to: older ones may be shared with a snapshot and are
    # copied before any change (Index.snapshot).
    generation: int = 0

    @property
    def lac(self) -> int:
        return max(self.max_lac, self.explicit_lac)

    def copy(self) -> LedgerState:
        return LedgerState(self.master_key, self.fenced, self.explicit_lac, self.max_lac, self.last_entry,
                           self.entries.copy())


class Index:
    """Every ledger this bookie holds, deleted ledgers' ids, and live bytes per entry log.

    Mutated only by the storage engine, and only through state_for_write(), writable_state() and
    the methods below; readers call get()/state() and never change what those return (it may be
    shared with a snapshot).
    """

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerState] = {}
        self.deleted: set[int] = set()
        self.live_bytes: dict[int, int] = {}  # entry log id -> bytes of its records still indexed
        self._generation = 0

    def state(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, to read only."""
        return self.ledgers.get(ledger_id)

    def state_for_write(self, ledger_id: int) -> LedgerState:
        """The ledger's state, to change, created empty if this bookie has not seen it (not for deleted ones)."""
        assert ledger_id not in self.deleted, ledger_id
        state = self.ledgers.get(ledger_id)
        if state is None:
            state = self.ledgers[ledger_id] = LedgerState(generation=self._generation)
        elif state.generation != self._generation:
            state = self._own(ledger_id, state)
        return state

    def writable_state(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, to change, or None if this bookie holds none."""
        state = self.ledgers.get(ledger_id)
        if state is not None and state.generation != self._generation:
            state = self._own(ledger_id, state)
        return state

    def _own(self, ledger_id: int, shared: LedgerState) -> LedgerState:
        # Copy-on-write: the snapshot keeps the old object as it was; the index goes on with a copy.
        state = self.ledgers[ledger_id] = shared.copy()
        state.generation = self._generation
        return state

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        state = self.ledgers.get(ledger_id)
        found = state.entries.get(entry_id) if state is not None else None
        if found is None:
            return None
        log_id, offset = unpack_position(found[0])
        return Location(log_id, offset, found[1])

    def put(self, ledger_id: int, entry_id: int, lac: int, where: Location, record_bytes: int) -> None:
        """Index a stored entry (its record takes `record_bytes` in log `where.log_id`)."""
        if ledger_id in self.deleted:
            return  # deleted while its add was in flight: the bytes are garbage for compaction
        state = self.state_for_write(ledger_id)
        replaced = state.entries.put(entry_id, pack_position(where.log_id, where.offset), where.length)
        if replaced is not None:
            self._release(replaced)
        self.live_bytes[where.log_id] = self.live_bytes.get(where.log_id, 0) + record_bytes
        state.max_lac = max(state.max_lac, lac)
        state.last_entry = max(state.last_entry, entry_id)

    def put_many(self, entries: list[tuple[int, int, bytes, int]], positions: list[int]) -> set[int]:
        """put() of each (ledger, entry, packaged entry, LAC field) at its packed position (one entry
        log record each); returns the ledgers touched."""
        touched: set[int] = set()
        live = self.live_bytes
        last_ledger = state = None
        for (ledger_id, entry_id, data, lac), position in zip(entries, positions, strict=True):
            if ledger_id != last_ledger:
                if ledger_id in self.deleted:
                    continue  # deleted while its add was in flight: the bytes are garbage for compaction
                state, last_ledger = self.state_for_write(ledger_id), ledger_id
                touched.add(ledger_id)
            length = len(data)
            replaced = state.entries.put_new(entry_id, position, length)
            if replaced is not None:
                self._release(replaced)
            log_id = position >> OFFSET_BITS
            live[log_id] = live.get(log_id, 0) + ENTRY_RECORD_HEADER_BYTES + length
            if lac > state.max_lac:
                state.max_lac = lac
            if entry_id > state.last_entry:
                state.last_entry = entry_id
        return touched

    def move(self, ledger_id: int, entry_id: int, old: Location, new: Location, record_bytes: int) -> bool:
        """Point the entry at its compacted copy if it still lives at `old`; return whether it moved."""
        state = self.ledgers.get(ledger_id)
        current = state.entries.get(entry_id) if state is not None else None
        if current is None or current[0] != pack_position(old.log_id, old.offset):
            return False
        state = self.writable_state(ledger_id)
        assert state is not None
        state.entries.put(entry_id, pack_position(new.log_id, new.offset), new.length)
        self._release(current)
        self.live_bytes[new.log_id] = self.live_bytes.get(new.log_id, 0) + record_bytes
        return True

    def delete(self, ledger_id: int) -> None:
        """Forget the ledger for good; its records become garbage for compaction."""
        state = self.ledgers.pop(ledger_id, None)
        self.deleted.add(ledger_id)
        if state is not None:
            for _, position, length in state.entries.items():
                self._release((position, length))

    def _release(self, found: tuple[int, int]) -> None:
        log_id = found[0] >> OFFSET_BITS
        self.live_bytes[log_id] = self.live_bytes.get(log_id, 0) - record_size(found[1])

    def entry_count(self) -> int:
        return sum(state.entries.count() for state in self.ledgers.values())

    def memory_bytes(self) -> int:
        """The index's memory by the measured costs above; O(ledgers), so callers sample it (the
        bookie's disk check) rather than compute it per add. A checkpoint's copy-on-write snapshot may
        hold a second copy of the ledgers that change while it is written (Index.snapshot)."""
        slots = sparse = 0
        for state in self.ledgers.values():
            slots += len(state.entries.positions)
            sparse += len(state.entries.sparse)
        return (slots * DENSE_SLOT_BYTES + sparse * SPARSE_ENTRY_BYTES + len(self.ledgers) * LEDGER_BYTES
                + len(self.deleted) * DELETED_LEDGER_BYTES)

    def snapshot(self) -> Index:
        """The index as it is now, for a worker thread to encode while this one goes on changing.

        Copy-on-write: the snapshot shares every ledger's state, and this index copies a state
        the first time it changes it afterwards (state_for_write, writable_state). So a checkpoint
        no longer copies every ledger on the event loop at its cut, which stalled a bookie holding
        20,000 ledgers for up to 135 ms; only ledgers that change copy, one at a time. The snapshot
        must not be changed (it is read only), and nobody may keep a state across a snapshot to
        change it later: fetch it again."""
        other = Index()
        other.ledgers = dict(self.ledgers)
        other.deleted = set(self.deleted)
        other.live_bytes = dict(self.live_bytes)
        other._generation = -1  # read only: any state_for_write on it would copy, never change a shared state
        self._generation += 1
        return other


def record_size(data_length: int) -> int:
    """Bytes an entry of `data_length` takes in an entry log, header included."""
    return ENTRY_RECORD_HEADER_BYTES + data_length
