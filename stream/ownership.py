"""The protocol of a log's single writer (seed 004), sans I/O: taking ownership, rolling and
completing segments.

Each step is a generator that yields actions and is sent their results; it returns what the
writer holds afterwards. The edge (stream/writer.py) executes the actions on the metastore and
the ledger client; the simulator (sim/stream_world.py) on simulated bookies and a versioned
register, under schedules of crashes, pauses and competing owners. The same code decides in
both, so what the simulation checks is what a real writer does.

What makes a single writer safe is the fence, not the lock that queues owners:
- a new owner recovers the in-progress segment (RecoverSegment: ledger recovery fences its
  bookies, so the last owner can append to it no more, and closes it at its true last entry);
- it then sets the segment list at the version it read, in one change that bumps the log's
  epoch, completes that segment and starts its own (ApplyChange). Any change by the last owner
  in between (a roll) makes this one fail, and the takeover starts over from a fresh read;
- a deposed owner's next append fails at the fenced bookies, and its next change to the list
  fails its version check: it can make nothing visible after its successor's recovery.

A truncation changes the list too (by the same CAS) but not the log's epoch: an owner whose CAS
was lost to it reads the list again and makes its change on that; one lost to a new epoch is
fenced (`_change`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from stream.errors import LogFenced, StreamError
from stream.record_set import RecordSet
from stream.segment import Segment
from stream.segment_list import SegmentList

TAKEOVER_ATTEMPTS = 20


# -- actions (what the edge executes) and their results ---------------------------------------

@dataclass(frozen=True, slots=True)
class ReadList:
    """Read the log's segment list, consistently (Namespace.read). Result: SegmentList."""


@dataclass(frozen=True, slots=True)
class RecoverSegment:
    """Recover the segment's ledger (fence, then close at its last entry) and read its first and
    last entries. Result: RecoveredTail."""
    segment: Segment


@dataclass(frozen=True, slots=True)
class CreateLedger:
    """Create the ledger of segment `seq`. Result: its ledger id (int)."""
    seq: int


@dataclass(frozen=True, slots=True)
class CloseLedger:
    """Close this writer's own ledger, every append acknowledged. Result: its last entry (int, -1 if none)."""
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ApplyChange:
    """Change the list read as `before` into `after` in one CAS. Result: the list as it now is
    (SegmentList), or None if it changed meanwhile (nothing applied)."""
    before: SegmentList
    after: SegmentList


@dataclass(frozen=True, slots=True)
class DeleteLedger:
    """Delete a ledger that no segment refers to (one created for a change that failed). Result: None."""
    ledger_id: int


@dataclass(frozen=True, slots=True)
class Now:
    """The clock, in ms since the epoch (segments record when they started and completed). Result: int."""


@dataclass(frozen=True, slots=True)
class RecoveredTail:
    """A recovered ledger's last entry (-1: none) and its first and last record sets (None if empty)."""
    last_entry: int
    head: RecordSet | None
    tail: RecordSet | None


@dataclass(frozen=True, slots=True)
class Owned:
    """The list as this owner left it, and its own in-progress segment."""
    listing: SegmentList
    segment: Segment


Action = ReadList | RecoverSegment | CreateLedger | CloseLedger | ApplyChange | DeleteLedger | Now
Protocol = Generator[Action, Any, Any]


# -- what a segment holds ------------------------------------------------------------------------

class SegmentTally:
    """The totals of the records sealed into the owner's current segment, as it seals them: what
    completing the segment records (a record set also carries the count and bytes before it, so a
    successor recovers the same totals from the segment's first and last entries)."""

    __slots__ = ("records", "bytes", "first_txid", "last_txid", "last_slot")

    def __init__(self) -> None:
        self.records = self.bytes = 0
        self.first_txid = self.last_txid = self.last_slot = -1

    def sealed(self, first_txid: int, last_txid: int, count: int, payload_bytes: int) -> None:
        if not self.records:
            self.first_txid = first_txid
        self.records += count
        self.bytes += payload_bytes
        self.last_txid = last_txid
        self.last_slot = count - 1

    def totals(self, last_entry: int) -> dict[str, int]:
        if not self.records:
            return _EMPTY
        return dict(first_txid=self.first_txid, last_txid=self.last_txid, last_entry=last_entry,
                    last_slot=self.last_slot, records=self.records, size=self.bytes)


_EMPTY = dict(first_txid=-1, last_txid=-1, last_entry=-1, last_slot=-1, records=0, size=0)


def recovered_totals(tail: RecoveredTail) -> dict[str, int]:
    """A recovered segment's totals, from its first and last record sets."""
    if tail.last_entry < 0 or tail.head is None or tail.tail is None:
        return _EMPTY
    last = tail.tail
    return dict(first_txid=tail.head.txids[0], last_txid=last.txids[-1], last_entry=tail.last_entry,
                last_slot=last.count - 1, records=last.records_before + last.count,
                size=last.bytes_before + last.payload_bytes)


# -- the protocol ----------------------------------------------------------------------------------

def take_over(log_name: str) -> Protocol:
    """Become the log's writer: recover the last owner's segment, start our own. Returns Owned.
    StreamError if the list kept changing under TAKEOVER_ATTEMPTS attempts."""
    for _ in range(TAKEOVER_ATTEMPTS):
        listing: SegmentList = yield ReadList()
        after = listing.take_over()
        current = listing.in_progress
        if current is not None:
            tail: RecoveredTail = yield RecoverSegment(current)
            after = after.completed(current.seq, **recovered_totals(tail), now_ms=(yield Now()))
        ledger_id: int = yield CreateLedger(after.log.next_segment)
        after, segment = after.started(ledger_id, (yield Now()))
        applied: SegmentList | None = yield ApplyChange(listing, after)
        if applied is None:  # the last owner rolled, or another contender won: read again
            yield DeleteLedger(ledger_id)
            continue
        return Owned(applied, segment)
    raise StreamError(f"log {log_name!r} kept changing while this writer took it over; try again")


def _change(log_name: str, owned: Owned, change: Callable[[SegmentList], SegmentList]) -> Protocol:
    """Apply `change` to the list as this owner left it. A lost CAS is a takeover only if the
    log's epoch moved: a truncation (or retention) changes the list too but keeps the epoch, and
    the change is then made again on the list as it now is. Returns the list; LogFenced if
    another owner took over."""
    listing = owned.listing
    for _ in range(TAKEOVER_ATTEMPTS):
        applied: SegmentList | None = yield ApplyChange(listing, change(listing))
        if applied is not None:
            return applied
        listing = yield ReadList()
        if listing.log.epoch != owned.listing.log.epoch:
            break
    raise LogFenced(f"log {log_name!r} changed under its writer: another writer took it over")


def complete(log_name: str, owned: Owned, tally: SegmentTally) -> Protocol:
    """Close our segment's ledger and complete the segment with its totals. Returns the list.
    LogFenced if another owner took over."""
    last_entry: int = yield CloseLedger(owned.segment.ledger_id)
    now = yield Now()
    return (yield from _change(log_name, owned, lambda listing: listing.completed(
        owned.segment.seq, **tally.totals(last_entry), now_ms=now)))


def roll(log_name: str, owned: Owned, tally: SegmentTally) -> Protocol:
    """Complete our segment and start the next one (between two entries, nothing in flight).
    Returns Owned; LogFenced if another owner took over."""
    listing: SegmentList = yield from complete(log_name, owned, tally)
    ledger_id: int = yield CreateLedger(listing.log.next_segment)
    now = yield Now()
    try:
        applied: SegmentList = yield from _change(log_name, Owned(listing, owned.segment),
                                                  lambda current: current.started(ledger_id, now)[0])
    except LogFenced:
        yield DeleteLedger(ledger_id)
        raise
    return Owned(applied, applied.segments[-1])
