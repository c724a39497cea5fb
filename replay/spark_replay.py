"""The Replay check's Spark job: one task per (node, valid snapshot) replays that node's log
from the snapshot to its next one (or to the end of its committed history) through the
state machine, and reports the tree digest at every checkpoint zxid it passes.

Tasks run in parallel (nodes x snapshots); each reads its node's segments again with
the same decoder as the records reader (replay.verify_decode), since the records
DataFrame keeps a digest of each body, not the body.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from replay.verify_decode import iter_chunk
from replay.verify_replay import replay, restore
from zab.snapshot import read_snapshot
from zab.storage_errors import RecordError, SnapshotCorruptError
from zab.txnlog import SEGMENT_HEADER_BYTES


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """Replay `node`'s log over (start, end] from `snapshot` (None: the empty state at zxid 0)."""

    node: int
    start: int
    snapshot: str | None
    end: int
    segments: tuple[str, ...]
    checkpoints: tuple[int, ...]
    protocol: str


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
                 checkpoints: set[int], protocol: str) -> list[ReplayTask]:
    """One task per start of each node: every valid snapshot its log continues, and the
    empty state when its log reaches back to zxid 0; each ends at the node's next start
    or at its highest committed zxid (`tops`)."""
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
                                    tuple(sorted(k for k in checkpoints if start < k <= end)), protocol))
    return tasks


def _segments_for(files: list[tuple[int, str]], start: int, end: int) -> tuple[str, ...]:
    """Segments (first zxid, path; in order) that may hold zxids in (start, end]."""
    chosen = []
    for i, (first, path) in enumerate(files):
        following = files[i + 1][0] if i + 1 < len(files) else None
        if first <= end and (following is None or following > start + 1):
            chosen.append(path)
    return tuple(chosen)


def log_txns(paths: tuple[str, ...]):  # noqa: ANN202 - a generator of Txn
    """Every valid record of these segments, in order, as Txns (damaged ones are the Checksums check's)."""
    for path in paths:
        buf = Path(path).read_bytes()
        view = memoryview(buf)[SEGMENT_HEADER_BYTES:]
        for _, _, item in iter_chunk(view, SEGMENT_HEADER_BYTES, len(buf)):
            if not isinstance(item, RecordError):  # damaged records are the Checksums check's
                yield item


def run_task(task: ReplayTask) -> list[ReplayRow]:
    """Run one replay (in a Spark task, or directly)."""
    source = f"replay from {'snapshot ' + hex(task.start) if task.snapshot else 'zxid 0'}"
    state = None
    if task.snapshot is not None:
        try:
            _, state = read_snapshot(Path(task.snapshot))
        except SnapshotCorruptError as err:
            return [ReplayRow(task.node, source, task.start, None, str(err))]
    sm = restore(task.protocol, task.start, state)
    outcome = replay(sm, task.start, task.end, log_txns(task.segments), task.checkpoints)
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
