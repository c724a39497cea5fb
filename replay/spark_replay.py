"""The Replay check's Spark job: one task per (node, valid snapshot) replays that node's log
from the snapshot to its next one (or to the end of its committed history) through the
state machine, and reports the tree digest at every checkpoint zxid it passes.

Tasks run in parallel (nodes x snapshots); each reads its node's segments again with
the same decoder as the records reader (replay.verify_decode), since the records
DataFrame keeps a digest of each body, not the body. A task does not decode its
segments from their beginning: it starts at the chunk (replay.verify_decode.Chunk,
known from the records reader's walk) that holds its first zxid, found by reading
one record at each chunk start, so that a log with frequent snapshots is decoded
about once in all, not once per snapshot.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pyspark.sql import SparkSession

from replay.verify_decode import iter_chunk, zxid_before
from replay.verify_replay import SnapshotDoesNotRestore, replay, restore
from zab.storage.record import MAX_RECORD_BYTES, RECORD_HEADER_BYTES, checked_length
from zab.storage.snapshot import read_body
from zab.storage.storage_errors import RecordError, SnapshotCorruptError
from zab.storage.txnlog import SEGMENT_HEADER_BYTES


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """Replay `node`'s log over (start, end] from `snapshot` (None: the empty state at zxid 0)."""

    node: int
    start: int
    snapshot: str | None
    end: int
    segments: tuple[str, ...]
    checkpoints: tuple[int, ...]
    # Per segment (same order), the file offsets where its chunks start; empty: decode from the header.
    chunk_starts: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """A digest at `zxid` (source "replay from <start>"), or the error that stopped a task."""

    node: int
    source: str
    zxid: int
    digest: str | None
    error: str


def plan_replays(segments: dict[int, list[tuple[int, str]]], snapshots: dict[int, list[int]],
                 snapshot_paths: dict[tuple[int, int], str], bases: dict[int, int | None], tops: dict[int, int],
                 checkpoints: set[int],
                 chunk_starts: dict[str, tuple[int, ...]] | None = None) -> list[ReplayTask]:
    """One task per start of each node: every valid snapshot its log continues, and the
    empty state when its log reaches back to zxid 0; each ends at the node's next start
    or at its highest committed zxid (`tops`). `chunk_starts` (segment path -> its
    chunks' start offsets) lets each task skip the chunks before its first zxid."""
    starts_of = chunk_starts or {}
    tasks = []
    for node, top in tops.items():
        base = bases.get(node)
        starts = [z for z in snapshots.get(node, []) if base is None or base <= z]
        if base == 0 and 0 not in starts:
            starts.insert(0, 0)
        starts = sorted(s for s in starts if s < top)
        for i, start in enumerate(starts):
            end = min(starts[i + 1], top) if i + 1 < len(starts) else top
            files = _segments_for(segments.get(node, []), start, end)
            tasks.append(ReplayTask(node, start, snapshot_paths.get((node, start)), end, files,
                                    tuple(sorted(k for k in checkpoints if start < k <= end)),
                                    tuple(starts_of.get(f, ()) for f in files) if starts_of else ()))
    return tasks


def _segments_for(files: list[tuple[int, str]], start: int, end: int) -> tuple[str, ...]:
    """Segments (first zxid, path; in order) that may hold zxids in (start, end]."""
    chosen = []
    for i, (first, path) in enumerate(files):
        following = files[i + 1][0] if i + 1 < len(files) else None
        if first <= end and (following is None or following > start + 1):
            chosen.append(path)
    return tuple(chosen)


def log_txns(paths: tuple[str, ...], after: int | None = None,
             chunk_starts: tuple[tuple[int, ...], ...] = (), until: int | None = None):  # noqa: ANN202 - Txns
    """Every valid record of these segments, in order, as Txns (damaged ones are the Checksums check's).

    With `after` and each segment's `chunk_starts`, a segment is read from the last
    chunk whose first record's zxid is at most after + 1 (the records before it,
    in a log whose zxids increase, are all at or below `after`; a log where they
    do not is the EpochOrder check's). With `after`, the records up to the first
    whose zxid field is above it are then passed by their lengths alone, undecoded:
    a replay from `after` ignores them (valid ones are at or below it, damaged ones
    are never applied). With `until` too, a segment is read only up to the first
    chunk whose first zxid is above it: a replay to `until` stops at the first txn
    above it anyway, and a task that read every segment to its end would copy tens
    of megabytes it never decodes.
    """
    for i, path in enumerate(paths):
        with open(path, "rb") as file:
            offset, stop = SEGMENT_HEADER_BYTES, None
            if after is not None and i < len(chunk_starts):
                offset, stop = _chunk_bounds(file, chunk_starts[i], after, until, offset)
            file.seek(offset)
            buf = file.read() if stop is None else file.read(stop - offset)
        view = memoryview(buf)
        skip = _past(view, after) if after is not None else 0
        for _, _, item in iter_chunk(view[skip:], offset + skip, offset + len(buf)):
            if not isinstance(item, RecordError):  # damaged records are the Checksums check's
                yield item


_ZXID = struct.Struct(">Q")  # a record body's first field


def _past(view: memoryview, after: int) -> int:
    """The position in `view` (at a record boundary) of the first record whose zxid field is above `after`."""
    pos = 0
    while pos < len(view):
        try:
            length = checked_length(view, pos)
        except RecordError:  # iter_chunk reports it (and stops) from here
            break
        if _ZXID.unpack_from(view, pos + RECORD_HEADER_BYTES)[0] > after:
            break
        pos += RECORD_HEADER_BYTES + length
    return pos


def _chunk_bounds(file: BinaryIO, starts: tuple[int, ...], after: int, until: int | None,
                  offset: int) -> tuple[int, int | None]:
    """The start of the last chunk (of `starts`, in file order) whose first zxid is <= after + 1,
    and the start of the first later chunk whose first zxid is above `until` (None: the file's end)."""
    passed = False  # a chunk starting above after + 1 was seen: later ones are never the first
    for start in starts:
        zxid = _first_zxid(file, start)
        if zxid is None:  # damaged: its place in the order is unknown, so go no further
            break
        if zxid <= after + 1 and not passed:
            offset = start
            continue
        passed = True
        if until is None:
            break
        if zxid > until and start > offset:
            return offset, start
    return offset, None


def _first_zxid(file: BinaryIO, start: int) -> int | None:
    """The zxid of the record at `start` (None: it is damaged or cut short)."""
    file.seek(start)
    head = file.read(RECORD_HEADER_BYTES)
    if len(head) < RECORD_HEADER_BYTES:
        return None
    length = int.from_bytes(head[:4], "big")
    if length > MAX_RECORD_BYTES:
        return None
    return zxid_before(memoryview(head + file.read(length)), 0)


def run_task(task: ReplayTask) -> list[ReplayRow]:
    """Run one replay (in a Spark task, or directly)."""
    source = f"replay from {'snapshot ' + hex(task.start) if task.snapshot else 'zxid 0'}"
    body = None if task.snapshot is None else read_body(Path(task.snapshot))  # in pieces, never whole
    try:
        sm = restore(task.start, body, str(task.snapshot))
    except (SnapshotCorruptError, SnapshotDoesNotRestore) as err:
        return [ReplayRow(task.node, source, task.start, None, str(err))]
    txns = log_txns(task.segments, task.start, task.chunk_starts, task.end)
    outcome = replay(sm, task.start, task.end, txns, task.checkpoints)
    rows = [ReplayRow(task.node, source, zxid, digest, "") for zxid, digest in outcome.digests]
    if outcome.error:
        rows.append(ReplayRow(task.node, source, outcome.last_zxid, None, outcome.error))
    elif outcome.last_zxid < task.end:
        rows.append(ReplayRow(task.node, source, outcome.last_zxid, None,
                              f"the log ends at {outcome.last_zxid:#x}, before {task.end:#x}"))
    return rows


def run_replays(spark: SparkSession, tasks: list[ReplayTask]) -> list[ReplayRow]:
    """Every task in parallel, one Spark partition each; the rows come back to the driver (small)."""
    if not tasks:
        return []
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))
    return rdd.flatMap(run_task).collect()
