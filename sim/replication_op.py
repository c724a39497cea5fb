"""The replication worker's repair of one ledger as a pure operation (start()/step(event) -> actions),
for the simulator to drive like the ledger operations (sim/ledger_world.py, sim/autorecovery.py).

It does what ledger/autorecovery/worker.py `repair` does, in the same order, with the real pure
planning (ledger/autorecovery/planning.py):

1. read the metadata; the first fragment of `damaged_fragments(metadata, lost)` is planned
   (`plan_fragment`: a writable replacement outside the ensemble, not lost) over the bookies
   the world lists as registered and writable (`ListBookies`, the worker's list_bookies);
2. every entry the lost bookie held (`entries_on`) is read from a surviving replica of its write
   quorum (`sources`, in write-set order; "no such entry" tries the next, as does a copy whose
   CRC32C digest or ids do not check) and written to the replacement as a recovery add,
   `copy_window` entries in flight;
3. only when every copy is acknowledged (durable: a bookie answers after its fsync) the metadata
   is re-read and `apply_repair` CASed in; a conflict (MetadataBadVersion: another writer, or an
   unknown outcome) re-reads and judges again; a changed fragment (FragmentChanged) is planned
   and copied again from the re-read metadata; then back to 1 for the next damaged fragment;
4. with no damaged fragment left: an OPEN ledger whose last fragment has a lost bookie is its
   writer's: Completed(WAITING) (the auditor tries again later; the real worker fences and closes
   it after a grace period, not modelled); otherwise the `refill` bookies (the task's `damaged`)
   of a CLOSED ledger get back the entries they should hold but miss or hold bad (the worker's
   `_refill`: each read from the bookie itself first), then Completed(metadata).
`lost` is the task's, judged again as the worker took it (sim/autorecovery.py `_take`, the
worker's ReplicationTask.rejudged): a bookie back after the grace period is a source, not lost.
Unrepairable (no eligible bookie, every replica of an entry absent or unreadable) and a failed
recovery add end it with Failed: the task is retried after a backoff (ReplicationTask.failed).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from bookie.entry import DigestType, EntryFormatError, crc32c_digest_ok, parse_header
from bookie.errors import NoSuchEntry, NoSuchLedger
from ledger import actions as A
from ledger.autorecovery.planning import (FragmentChanged, FragmentRepair, Unrepairable, apply_repair,
                                          damaged_fragments, entries_on, fragment_last_entry, open_tail_damaged,
                                          plan_fragment, sources)
from ledger.metadata import LedgerMetadata

WAITING = "waiting for the writer"  # Completed(WAITING): the open tail is its writer's for now


@dataclass(frozen=True, slots=True)
class ListBookies:
    """Action: which bookies are registered and writable now (the worker's list_bookies)."""


@dataclass(frozen=True, slots=True)
class BookiesListed:
    """Event: the answer to ListBookies."""
    writable: tuple[int, ...]


@dataclass
class _Copy:
    """One entry copy (or, `probe`, first a check that `target` misses it): candidates left to read."""
    entry_id: int
    target: int
    candidates: list[int]
    probe: bool = False
    absent: int = 0   # sources that said "no such entry"
    tried: int = 0    # sources read


class ReplicationOp:
    """Repair ledger `ledger_id` for the `lost` bookies (module docstring)."""

    def __init__(self, ledger_id: int, lost: frozenset[int], digest_type: DigestType, rng: random.Random, *,
                 refill: frozenset[int] = frozenset(), copy_window: int = 4, prefer: int | None = None) -> None:
        self.ledger_id, self.lost, self.digest_type, self.rng = ledger_id, frozenset(lost), digest_type, rng
        self.refill, self.copy_window, self.prefer = refill, copy_window, prefer
        self.metadata: LedgerMetadata | None = None
        self.index = -1
        self.repair: FragmentRepair | None = None
        self.version = -1
        self.committed: list[tuple[LedgerMetadata, FragmentRepair]] = []  # repairs whose CAS we saw succeed
        self.phase = "read"           # read | list | copy | commit | refill | done
        self.todo: deque[_Copy] = deque()
        self.reading: dict[tuple[int, int], list[_Copy]] = {}
        self.adding: dict[tuple[int, int], _Copy] = {}
        self.stats = {"entries_copied": 0, "fragments_repaired": 0, "fragments_recopied": 0, "replicas_refilled": 0,
                      "cas_conflicts": 0}

    def start(self) -> list:
        return [A.ReadMetadata()]

    def step(self, event: A.Event) -> list:
        if self.phase == "done" or isinstance(event, A.Tick):
            return []
        try:
            if isinstance(event, A.MetadataRead):
                self.version = event.version
                return self._metadata_read(event.metadata)
            if isinstance(event, A.MetadataWritten):
                assert self.metadata is not None and self.repair is not None
                self.committed.append((self.metadata, self.repair))
                self.stats["fragments_repaired"] += 1
                return self._read_again("read")
            if isinstance(event, A.MetadataBadVersion):
                self.stats["cas_conflicts"] += 1
                return self._read_again("commit")  # the worker's _commit: re-read, judge again
            if isinstance(event, BookiesListed):
                return self._plan(event.writable)
            if isinstance(event, (A.ReadAnswered, A.ReadFailed)):
                return self._read_done(event)
            if isinstance(event, (A.AddAcked, A.AddFailed)):
                return self._add_done(event)
        except Unrepairable as e:
            return self._end(A.Failed(e))
        raise TypeError(f"unexpected event {event!r}")

    # -- metadata -------------------------------------------------------------------------------
    def _read_again(self, phase: str) -> list:
        self.phase = phase
        return [A.ReadMetadata()]

    def _metadata_read(self, metadata: LedgerMetadata) -> list:
        if self.phase == "commit":
            assert self.repair is not None
            try:
                return [A.WriteMetadata(apply_repair(metadata, self.repair), self.version)]
            except FragmentChanged:
                self.stats["fragments_recopied"] += 1  # a writer or recoverer moved it: plan again
        self.metadata = metadata
        damaged = damaged_fragments(metadata, self.lost)
        if damaged:
            self.index, self.phase = damaged[0], "list"
            return [ListBookies()]
        if open_tail_damaged(metadata, self.lost):
            return self._end(A.Completed(WAITING))
        if self.refill - self.lost and metadata.is_closed:
            self.phase = "refill"
            self._queue_refill(metadata)
            return self._pump()
        return self._end(A.Completed(metadata))

    def _plan(self, writable: tuple[int, ...]) -> list:
        metadata = self.metadata
        assert metadata is not None
        self.repair = plan_fragment(metadata, self.index, self.lost, writable, self.lost, self.rng, self.prefer)
        for old, new in self.repair.replacements:
            for entry_id in entries_on(metadata, self.index, old):
                candidates = list(sources(metadata, entry_id, self.lost | {new}))
                self.todo.append(_Copy(entry_id, new, candidates))
        self.phase = "copy"
        return self._pump()

    # -- copying ---------------------------------------------------------------------------------
    def _queue_refill(self, metadata: LedgerMetadata) -> None:
        for index, fragment in enumerate(metadata.fragments):
            if fragment_last_entry(metadata, index) < fragment.first_entry:
                continue
            for bookie in sorted(set(fragment.ensemble) & (self.refill - self.lost)):
                for entry_id in entries_on(metadata, index, bookie):
                    others = [b for b in sources(metadata, entry_id, self.lost) if b != bookie]
                    self.todo.append(_Copy(entry_id, bookie, [bookie, *others], probe=True))

    def _in_flight(self) -> int:
        return sum(len(v) for v in self.reading.values()) + len(self.adding)

    def _pump(self) -> list:
        actions: list = []
        while self.todo and self._in_flight() < self.copy_window:
            actions += self._next_read(self.todo.popleft())
        if not self.todo and not self._in_flight():
            if self.phase == "refill":
                return actions + self._end(A.Completed(self.metadata))
            self.phase = "commit"  # every copy durable: now, and only now, the metadata
            return actions + [A.ReadMetadata()]
        return actions

    def _next_read(self, copy: _Copy) -> list:
        if not copy.candidates:
            if copy.tried and copy.absent == copy.tried:
                raise Unrepairable(f"ledger {self.ledger_id} entry {copy.entry_id}: every surviving replica says "
                                   "it has no copy: the entry is lost")
            raise Unrepairable(f"ledger {self.ledger_id} entry {copy.entry_id}: no readable replica now; will retry")
        bookie = copy.candidates[0]
        self.reading.setdefault((bookie, copy.entry_id), []).append(copy)
        return [A.SendRead(bookie, copy.entry_id)]

    def _read_done(self, event: A.ReadAnswered | A.ReadFailed) -> list:
        copy = self.reading[(event.bookie, event.entry_id)].pop(0)
        if not self.reading[(event.bookie, event.entry_id)]:
            del self.reading[(event.bookie, event.entry_id)]
        source = copy.candidates.pop(0)
        good = isinstance(event, A.ReadAnswered) and self._verified(event.data, event.entry_id)
        if copy.probe:  # the target itself: holds a good copy, or must get one
            copy.probe = False
            if good:
                return self._pump()
            if isinstance(event, A.ReadFailed) and not isinstance(event.error, (NoSuchEntry, NoSuchLedger)):
                raise Unrepairable(f"bookie {source} unreachable for its replica check: will retry")
            self.stats["replicas_refilled"] += 1
            return self._next_read(copy) + self._pump()
        copy.tried += 1
        if not good:
            if isinstance(event, A.ReadFailed) and isinstance(event.error, (NoSuchEntry, NoSuchLedger)):
                copy.absent += 1
            return self._next_read(copy) + self._pump()
        self.adding[(copy.target, copy.entry_id)] = copy
        assert source != copy.target
        return [A.SendAdd(copy.target, copy.entry_id, event.data, recovery=True)]

    def _add_done(self, event: A.AddAcked | A.AddFailed) -> list:
        del self.adding[(event.bookie, event.entry_id)]
        if isinstance(event, A.AddFailed):
            return self._end(A.Failed(event.error))  # the worker's task fails; retried after a backoff
        self.stats["entries_copied"] += 1
        return self._pump()

    def _verified(self, data: bytes, entry_id: int) -> bool:
        """worker.py `_verified`: CRC32C entries end to end; HMAC ones only for their ids."""
        try:
            header = parse_header(data)
        except EntryFormatError:
            return False
        if (header.ledger_id, header.entry_id) != (self.ledger_id, entry_id):
            return False
        if header.digest_type is not self.digest_type:
            return False
        return crc32c_digest_ok(data) is not False

    def _end(self, outcome: A.Completed | A.Failed) -> list:
        self.phase = "done"
        return [outcome]
