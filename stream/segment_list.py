"""The pure operations on a log's segment list (seed 004): what a writer that takes ownership,
rolls, completes or truncates changes, as a new list and the metastore changes that make it so.

Every change sets the log's own znode at the version it was read at (the CAS that guards the
list as a whole: two writers, or a writer and a truncation, cannot both change the same list),
and creates, sets or deletes segment znodes at their versions, all in one multi. The edge
(stream/namespace.py) turns a `Change` into that multi and reads the list back after a lost one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from stream.errors import CorruptMetadata, PositionTruncated
from stream.log_metadata import LogMetadata
from stream.position import Position
from stream.segment import Segment, SegmentState


@dataclass(frozen=True, slots=True)
class Change:
    """The log znode's new metadata (set at `log_version`), segments to create (version None) or to
    set (at their version), and segments to delete (at their version), with their ledgers."""

    log: LogMetadata
    log_version: int
    put: tuple[tuple[Segment, int | None], ...]
    delete: tuple[tuple[Segment, int], ...]


@dataclass(frozen=True, slots=True)
class SegmentList:
    """A log's metadata and its segments, as read at `log_version` (the segments by sequence number,
    with their znode versions)."""

    log: LogMetadata
    log_version: int
    segments: tuple[Segment, ...] = ()
    versions: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seqs = [s.seq for s in self.segments]
        if seqs != sorted(set(seqs)):
            raise CorruptMetadata("a log's segments must have distinct sequence numbers, in order")
        if seqs and seqs[-1] >= self.log.next_segment:
            raise CorruptMetadata(f"segment {seqs[-1]} is not below the log's next segment {self.log.next_segment}")
        if any(not s.completed for s in self.segments[:-1]):
            raise CorruptMetadata("only a log's last segment may be in progress")

    @property
    def in_progress(self) -> Segment | None:
        last = self.segments[-1] if self.segments else None
        return last if last is not None and not last.completed else None

    @property
    def last_txid(self) -> int:
        """The largest transaction id of a completed segment (-1 if none)."""
        return max((s.last_txid for s in self.segments if s.completed), default=-1)

    def segment(self, seq: int) -> Segment | None:
        return next((s for s in self.segments if s.seq == seq), None)

    # -- changes a writer makes ------------------------------------------------------------
    def take_over(self) -> SegmentList:
        """A new owner's epoch: the list changes under any earlier owner's next CAS."""
        return replace(self, log=self.log.with_(epoch=self.log.epoch + 1))

    def completed(self, seq: int, *, first_txid: int, last_txid: int, last_entry: int, last_slot: int, records: int,
                  size: int, now_ms: int) -> SegmentList:
        """The in-progress segment `seq` completed with its totals (recovered or closed)."""
        current = self.in_progress
        if current is None or current.seq != seq:
            raise ValueError(f"segment {seq} is not the log's in-progress segment")
        done = current.complete(first_txid=first_txid, last_txid=last_txid, last_entry=last_entry,
                                last_slot=last_slot, records=records, size=size, now_ms=now_ms)
        done.check(f"segment {seq}")
        return replace(self, segments=self.segments[:-1] + (done,))

    def started(self, ledger_id: int, now_ms: int) -> tuple[SegmentList, Segment]:
        """A new in-progress segment on `ledger_id`, after every existing one (none in progress)."""
        if self.in_progress is not None:
            raise ValueError(f"segment {self.in_progress.seq} is still in progress: complete it first")
        segment = Segment(self.log.next_segment, ledger_id, SegmentState.IN_PROGRESS, now_ms)
        log = self.log.with_(next_segment=self.log.next_segment + 1)
        return replace(self, log=log, segments=self.segments + (segment,)), segment

    def truncated(self, before: Position) -> SegmentList:
        """Records before `before` hidden from readers; completed segments wholly before it deleted.
        Never moves the point back, never past the last completed record (+1, or the start of a
        segment that only completed ones precede: the same records)."""
        point = max(before, self.log.truncated_before)
        done = [s for s in self.segments if s.completed and s.records]
        current = self.in_progress
        at_a_start = point.entry == point.slot == 0 and point.segment <= (
            current.seq if current is not None else self.log.next_segment)  # only completed ones before it
        if done and point > Position(done[-1].seq, done[-1].last_entry, done[-1].last_slot + 1) and not at_a_start:
            raise ValueError(f"cannot truncate past the last completed record ({done[-1].last_position})")
        keep = tuple(s for s in self.segments if not (s.completed and s.seq < point.segment))
        return replace(self, log=self.log.with_(truncated_before=point), segments=keep)

    def retention_point(self, now_ms: int) -> Position | None:
        """Where the log's retention settings would truncate it: after the completed segments older
        than retention_ms, or as many of the oldest as keep the rest within retention_bytes."""
        settings = self.log.settings
        done = [s for s in self.segments if s.completed]
        drop = 0
        if settings.retention_ms:
            while drop < len(done) and done[drop].completed_ms <= now_ms - settings.retention_ms:
                drop += 1
        if settings.retention_bytes:
            total = sum(s.bytes for s in self.segments)
            for i, s in enumerate(done):
                if total - sum(d.bytes for d in done[:i]) <= settings.retention_bytes:
                    break
                drop = max(drop, i + 1)
        if not drop:
            return None
        return Position(done[drop - 1].seq + 1, 0, 0)

    # -- what a reader asks ----------------------------------------------------------------
    def first_readable(self, at: Position) -> Position:
        """`at`, or the truncation point if `at` is before it... PositionTruncated if `at` was truncated away."""
        if at < self.log.truncated_before:
            raise PositionTruncated(f"position {at} was truncated (the log starts at {self.log.truncated_before}); "
                                    "open the reader at the head")
        return at

    def segment_for_txid(self, txid: int) -> Segment | None:
        """The first segment that may hold a record with a transaction id >= `txid`: the first
        completed one whose last txid reaches it, else the in-progress one (None: past the end)."""
        for s in self.segments:
            if not s.completed or (s.records and s.last_txid >= txid):
                return s
        return None

    # -- the metastore change --------------------------------------------------------------
    def change_to(self, after: SegmentList) -> Change:
        """The multi that turns this list (as read) into `after`."""
        before = {s.seq: s for s in self.segments}
        now = {s.seq: s for s in after.segments}
        put = tuple((s, self.versions.get(s.seq)) for s in after.segments if before.get(s.seq) != s)
        delete = tuple((s, self.versions[seq]) for seq, s in before.items() if seq not in now)
        return Change(after.log, self.log_version, put, delete)

    def applied(self, change: Change) -> SegmentList:
        """This list after `change` committed (each set znode's version one more, created ones 0)."""
        versions = dict(self.versions)
        for segment, version in change.put:
            versions[segment.seq] = 0 if version is None else version + 1
        for segment, _ in change.delete:
            versions.pop(segment.seq, None)
        segments = {s.seq: s for s in self.segments}
        segments.update((s.seq, s) for s, _ in change.put)
        for segment, _ in change.delete:
            segments.pop(segment.seq, None)
        return SegmentList(change.log, change.log_version + 1, tuple(segments[k] for k in sorted(segments)), versions)
