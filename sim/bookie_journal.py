"""A simulated bookie journal: records are durable only after an fsync, and a crash loses the rest.

A SimBookie with a journal (sim/bookies.py) writes what bookie/ledger_rules.py's rules hand
back (KEY, ADD, FENCE, LAC records, the real bytes of bookie/storage_codec.py) here instead of
applying it at once, as BookieStorage hands them to its journal (bookie/storage.py):

- `append` queues a request's records and returns the sequence number of its last one; the
  bookie answers that request only once `durable_seq` reaches it (sim/ledger_world.py waits);
- `begin_sync` takes every queued record as one group commit, `end_sync` (a random small
  latency later, on the scheduler) makes them durable and hands back the accepted adds among
  them, which only then become readable (`LedgerRules.stored`), as in the real bookie;
- a fence of a ledger fenced already writes nothing, but its answer still waits for the first
  fence's record (`fence_seq`), as BookieStorage.fence waits for the batch carrying it;
- `crash` keeps the durable records and, when `keep_unsynced`, a random prefix of the unsynced
  ones (bytes written but not fsynced may or may not have reached the platter, as sim/disk.py
  models for Zab's log); the bookie then rebuilds its state by `replay`ing what survived
  through the same rules (`LedgerRules.replay`, `needs_entry`), as storage_recovery.replay does.

Nothing acknowledged is ever lost: every answer waits for its records' fsync.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from bookie.entry import parse_header
from bookie.ledger_rules import Admitted
from bookie.storage_codec import JournalRecord, Kind, decode_journal_record


@dataclass
class SimJournal:
    """One bookie's journal. Sequence numbers start at 1; 0 means "nothing to wait for"."""

    keep_unsynced: bool = True
    durable: list[bytes] = field(default_factory=list)
    unsynced: list[tuple[int, bytes, Admitted | None]] = field(default_factory=list)  # (seq, record, add)
    next_seq: int = 1
    durable_seq: int = 0
    syncing_to: int | None = None      # the last seq of the group commit in flight
    fence_seq: dict[int, int] = field(default_factory=dict)  # ledger -> seq of its FENCE record
    generation: int = 0                # bumped by a crash: a sync in flight then finishes nothing
    fsyncs: int = 0
    lost_records: int = 0              # unsynced records lost in crashes (kept ones not counted)

    def append(self, records: list[bytes], stored: Admitted | None = None, *, fence_of: int | None = None) -> int:
        """Queue one request's records (the accepted add's entry rides on its last, the ADD record);
        the seq its answer must wait for (0 when it wrote nothing)."""
        if not records:
            return 0
        for i, record in enumerate(records):
            self.unsynced.append((self.next_seq, record, stored if i == len(records) - 1 else None))
            self.next_seq += 1
        last = self.next_seq - 1
        if fence_of is not None:
            self.fence_seq[fence_of] = last
        return last

    def pending_fence(self, ledger_id: int) -> int:
        """The seq a repeated fence of `ledger_id` must wait for (0: its FENCE record is durable)."""
        seq = self.fence_seq.get(ledger_id, 0)
        return seq if seq > self.durable_seq else 0

    def needs_sync(self) -> bool:
        return self.syncing_to is None and bool(self.unsynced)

    def begin_sync(self) -> int:
        """Start a group commit of everything queued; returns the generation to hand to end_sync."""
        assert self.needs_sync()
        self.syncing_to = self.unsynced[-1][0]
        return self.generation

    def end_sync(self, generation: int) -> list[Admitted] | None:
        """The group commit begun in `generation` is on disk: its adds to store now (None: a crash
        came first and it never completed)."""
        if generation != self.generation or self.syncing_to is None:
            return None
        upto, self.syncing_to = self.syncing_to, None
        done = [r for r in self.unsynced if r[0] <= upto]
        self.unsynced = self.unsynced[len(done):]
        self.durable += [record for _, record, _ in done]
        self.durable_seq = upto
        self.fsyncs += 1
        return [add for _, _, add in done if add is not None]

    def crash(self, rng: random.Random) -> None:
        """The process dies: a sync in flight never completes; unsynced records are lost, except a
        random prefix of them when `keep_unsynced` (written, never fsynced, yet on the platter)."""
        kept = rng.randint(0, len(self.unsynced)) if self.keep_unsynced and self.unsynced else 0
        self.durable += [record for _, record, _ in self.unsynced[:kept]]
        self.lost_records += len(self.unsynced) - kept
        self.unsynced.clear()
        self.syncing_to = None
        self.fence_seq.clear()
        self.durable_seq = self.next_seq - 1  # nothing queued is waiting any more
        self.generation += 1

    def wipe(self) -> None:
        """The disk is gone."""
        self.crash(random.Random(0))
        self.durable.clear()

    def replay(self) -> Iterator[JournalRecord]:
        """What survived, read back in order."""
        for record in self.durable:
            decoded, end = decode_journal_record(record)
            assert end == len(record)
            yield decoded


def add_of(record: JournalRecord) -> Admitted:
    """An ADD record read back as the entry to store again (storage_recovery._replay_adds)."""
    assert record.kind is Kind.ADD
    return record.ledger_id, record.value, record.data, parse_header(record.data).lac
