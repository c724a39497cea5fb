"""Readers of a named log (edge): catch-up reads, then tailing across segment rolls.

A reader starts at a position (records at or after it), at the head (the truncation point), at
the tail (only records written from now on), after a subscription's committed position, or at
the first record whose transaction id is at least a given one (found by the segments' txid
ranges, then by reading forward in that segment). It reads completed segments in windows of
entries, and the in-progress one by long polls on its ledger (ledger/handles.py `tail`), which
end once the ledger is closed: by its writer at a roll or a clean close, or by a new owner's
recovery, so a recovered segment's last records are read too. Then it re-reads the segment list,
waiting on a watch of the log's znode while the next segment is not there yet.

Readers see exactly the acknowledged records, in order, each once: a segment's entries are
confirmed ones only (up to the LAC, or the recovered end), and positions only grow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from ledger.errors import NoSuchLedger
from metastore.client import Watch
from metastore.errors import NoNode
from stream.errors import PositionTruncated
from stream.namespace import Namespace, ledger_password
from stream.position import Position
from stream.record_set import decode
from stream.segment import Segment
from stream.segment_list import SegmentList

READ_AHEAD_ENTRIES = 64
LIST_POLL_S = 1.0  # a watch may be lost with a connection: read the list at least this often while waiting


@dataclass(frozen=True, slots=True)
class LogRecord:
    position: Position
    txid: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """The records of one entry from slot `first_slot` on: record i is at (segment, entry,
    first_slot + i). What `LogReader.batches()` yields: no object per record."""
    segment: int
    entry: int
    first_slot: int
    txids: list[int]
    payloads: list[bytes]

    @property
    def last(self) -> Position:
        return Position(self.segment, self.entry, self.first_slot + len(self.txids) - 1)

    def records(self) -> list[LogRecord]:
        return [LogRecord(Position(self.segment, self.entry, self.first_slot + i), txid, payload)
                for i, (txid, payload) in enumerate(zip(self.txids, self.payloads))]


class LogReader:
    """`async for record in namespace.reader(name, start):` every acknowledged record from `start`
    on, in order; with `follow=False` it ends at the last record acknowledged when it gets there."""

    def __init__(self, namespace: Namespace, name: str, start: Position | None = None, *, txid: int | None = None,
                 subscription: str | None = None, tail: bool = False, follow: bool = True) -> None:
        self.ns, self.name = namespace, name
        self.paths = namespace.paths(name)
        self._start, self._txid, self._subscription, self._tail = start, txid, subscription, tail
        self.follow = follow
        self.position: Position | None = None  # the last record handed out

    def __aiter__(self) -> AsyncIterator[LogRecord]:
        return self._records()

    async def batches(self) -> AsyncIterator[RecordBatch]:
        """The same records, an entry's worth at a time (a catch-up read of small records then
        costs a decode per entry, not an object per record)."""
        async for batch in self._batches():
            self.position = batch.last
            yield batch

    async def _records(self) -> AsyncIterator[LogRecord]:
        async for batch in self._batches():
            for record in batch.records():
                self.position = record.position
                yield record

    async def _first(self, listing: SegmentList) -> Position:
        if self._subscription is not None:
            committed = await self.ns.subscription(self.name, self._subscription)
            if committed is not None:
                return listing.first_readable(Position(committed.segment, committed.entry, committed.slot + 1))
        if self._start is not None:
            return listing.first_readable(self._start)
        if self._tail:
            current = listing.in_progress
            if current is None:
                return Position(listing.log.next_segment, 0, 0)
            handle = await self.ns.ledgers.open(current.ledger_id, ledger_password(self.name))
            return Position(current.seq, handle.lac + 1, 0)
        head = listing.log.truncated_before
        if self._txid is not None:
            found = listing.segment_for_txid(self._txid)
            return max(head, Position(found.seq if found else listing.log.next_segment, 0, 0))
        return head

    async def _batches(self) -> AsyncIterator[RecordBatch]:
        listing = await self.ns.read(self.name)
        at = await self._first(listing)
        while True:
            segment = next((s for s in listing.segments if s.seq >= at.segment), None)
            if segment is None or (segment.seq == at.segment and segment.completed and at > self._end(segment)):
                if segment is not None:
                    at = Position(segment.seq + 1, 0, 0)
                    continue
                if not self.follow:
                    return
                listing = await self._wait_for_change(listing)
                continue
            if segment.seq > at.segment:
                at = Position(segment.seq, 0, 0)
            async for batch in self._segment(segment, at, listing.log.truncated_before):
                last = batch.last
                at = Position(last.segment, last.entry, last.slot + 1)
                yield batch
            # The segment's ledger is closed: it was completed, or is about to be (a roll, a recovery).
            # Gone from the list: truncated after it was read to its end (a segment is deleted only
            # once completed, and a read that found its ledger gone raised PositionTruncated).
            listing = await self.ns.read(self.name)
            now = listing.segment(segment.seq)
            if now is None or now.completed:
                at = Position(segment.seq + 1, 0, 0)
            elif not self.follow:
                return
            else:
                listing = await self._wait_for_change(listing)

    @staticmethod
    def _end(segment: Segment) -> Position:
        return Position(segment.seq, segment.last_entry, segment.last_slot) if segment.records else \
            Position(segment.seq, 0, 0)

    async def _segment(self, segment: Segment, at: Position, truncated: Position) -> AsyncIterator[RecordBatch]:
        """The records of one segment at or after `at` (and not truncated), until its ledger ends."""
        try:
            handle = await self.ns.ledgers.open(segment.ledger_id, ledger_password(self.name))
        except (NoSuchLedger, NoNode):
            raise PositionTruncated(f"log {self.name!r}: segment {segment.seq}'s ledger is gone (truncated); "
                                    "open the reader at the head") from None
        first = max(at, truncated)
        entry = first.entry if first.segment == segment.seq else 0
        if segment.completed or not self.follow:
            # Up to its end, or to the LAC read when opened (-1 for a ledger no entry reached yet:
            # its bookies do not know it).
            last = segment.last_entry if segment.completed else handle.lac
            while entry <= last:
                window = await handle.read(entry, min(last, entry + READ_AHEAD_ENTRIES - 1))
                for e in window:
                    batch = self._unpack(segment.seq, e.entry_id, e.payload, first)
                    if batch is not None:
                        yield batch
                entry += len(window)
            return
        async for e in handle.tail(entry):
            batch = self._unpack(segment.seq, e.entry_id, e.payload, first)
            if batch is not None:
                yield batch

    def _unpack(self, seq: int, entry_id: int, payload: bytes, first: Position) -> RecordBatch | None:
        """The entry's records from `first` on and from the txid asked for, if any."""
        records = decode(payload)
        slot0 = first.slot if (seq, entry_id) == (first.segment, first.entry) else 0
        if self._txid is not None:  # records' txids increase: skip those below it
            while slot0 < records.count and records.txids[slot0] < self._txid:
                slot0 += 1
        if slot0 >= records.count:
            return None
        if slot0 == 0:
            return RecordBatch(seq, entry_id, 0, records.txids, records.payloads)
        return RecordBatch(seq, entry_id, slot0, records.txids[slot0:], records.payloads[slot0:])

    async def _wait_for_change(self, listing: SegmentList) -> SegmentList:
        """The segment list once it changed from `listing` (watched, and read at least every LIST_POLL_S)."""
        while True:
            watch = Watch()
            try:
                _, stat = await self.ns.meta.get(self.paths.log, watch=watch)
            except NoNode:
                return await self.ns.read(self.name)  # LogNotFound
            if stat.version != listing.log_version:
                return await self.ns.read(self.name)
            with trio.move_on_after(LIST_POLL_S):
                await watch.wait()
