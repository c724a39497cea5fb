"""The Zab checks, as Spark queries over the DataFrames of replay.spark_source.

Heavy work (per-record flags, grouping by zxid, joining with the committed history)
runs in Spark; the driver gets small aggregates (per node, per epoch, per epoch
start) and decides with the pure replay.verify_history. Definitions: docs/verify.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replay.spark_replay import plan_replays, run_replays
from replay.spark_source import ZabFrames
from replay.verify_decode import ORDER_OK, ORDER_UNKNOWN
from replay.verify_history import CommittedHistory, build_history
from replay.verify_report import MAX_EXAMPLES, CheckResult
from zab.core import zxid as Z
from zab.storage.txnlog import UNKNOWN_PREV_ZXID

CHECKSUMS, AGREEMENT, PREFIX, EPOCH_ORDER = "Checksums", "Agreement", "PrefixConsistency/TotalOrder", "EpochOrder"
QUORUM, SKIPPED, REPLAY = "QuorumPresence", "NoSkippedProposal", "Replay"
CHECK_NAMES = (CHECKSUMS, AGREEMENT, PREFIX, EPOCH_ORDER, QUORUM, SKIPPED, REPLAY)

Progress = Callable[[str], None]


def fmt(zxid: int | None) -> str:
    return "none" if zxid is None else Z.fmt(zxid)


@dataclass
class Context:
    """What the checks share: the frames, the per-zxid aggregate, the committed history."""

    spark: SparkSession
    frames: ZabFrames
    voters: int
    progress: Progress
    valid: DataFrame = None  # type: ignore[assignment]
    per_zxid: DataFrame = None  # type: ignore[assignment]
    history: CommittedHistory | None = None
    horizons: dict[int, int] = field(default_factory=dict)
    bases: dict[int, int | None] = field(default_factory=dict)
    tops: dict[int, int] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)
    node_stats: dict = field(default_factory=dict)
    snapshot_rows: list = field(default_factory=list)
    records: int = 0  # rows of `records` (valid, damaged, walk stops), counted by the per-file job

    @property
    def majority(self) -> int:
        return self.voters // 2 + 1


def run_checks(ctx: Context) -> list[CheckResult]:
    """Every Zab check, in the order of CHECK_NAMES.

    Spark jobs are few on purpose: each check first gets its counts from one
    aggregate, and only asks for examples when there is something to show.
    """
    ctx.valid = ctx.frames.valid
    # Plain aggregates of longs only (min/max, a bit per node): Spark's hash aggregation, no
    # sets, no sort. A body differs somewhere iff a half of its digest has min != max.
    ctx.per_zxid = ctx.valid.groupBy("zxid").agg(
        F.count("*").alias("n_nodes"),
        F.bit_or(F.pow(F.lit(2), _node_index(ctx)).cast("long")).alias("mask"),  # exact up to 52 nodes
        F.min("hash_hi").alias("hi_min"), F.max("hash_hi").alias("hi_max"),
        F.min("hash_lo").alias("lo_min"), F.max("hash_lo").alias("lo_max"),
        F.min("prev_zxid").alias("p_min"), F.max("prev_zxid").alias("p_max")).select(
        "*", F.shiftright("zxid", 32).alias("epoch"), F.col("zxid").bitwiseAND(F.lit(0xFFFFFFFF)).alias("counter"),
        ((F.col("hi_min") != F.col("hi_max")) | (F.col("lo_min") != F.col("lo_max"))).alias("differs")).persist()
    ctx.progress("aggregating per file and per zxid")
    files = _per_file(ctx)
    ctx.records = sum(f.rows or 0 for f in files)
    zsum = ctx.per_zxid.agg(
        F.count("*").alias("zxids"), F.sum(F.col("differs").cast("long")).alias("differing"),
        F.sum((F.col("p_min") != F.col("p_max")).cast("long")).alias("forks"),
        F.max(F.when(F.col("n_nodes") >= ctx.majority, F.col("zxid"))).alias("c")).first()
    results = {CHECKSUMS: check_checksums(ctx, files), AGREEMENT: check_agreement(ctx, zsum)}
    results[EPOCH_ORDER] = check_epoch_order(ctx, files)
    ctx.progress("finding the committed history")
    _commit(ctx, zsum.c)
    per_record = _with_history(ctx)
    results[PREFIX] = check_prefix(ctx, per_record, zsum.forks or 0)
    results[SKIPPED] = check_skipped(ctx, per_record)
    results[QUORUM] = check_quorum(ctx)
    results[REPLAY] = check_replay(ctx)
    ctx.per_zxid.unpersist()
    return [results[name] for name in CHECK_NAMES]


def _node_index(ctx: Context):  # noqa: ANN202 - a Column
    """The node's position among the directories given (its bit in `mask`)."""
    pairs = [F.lit(x) for i, n in enumerate(ctx.frames.nodes) for x in (n.node, i)]
    return F.element_at(F.create_map(*pairs), F.col("node")).cast("int")


def nodes_of(ctx: Context, mask: int) -> list[int]:
    return sorted(n.node for i, n in enumerate(ctx.frames.nodes) if mask >> i & 1)


def _per_file(ctx: Context) -> list:
    """One row per segment: its records' counts, damage, order flags, zxid range (one job)."""
    ok = F.col("checksum") == "ok"
    flagged = ok & ~F.col("order").isin(ORDER_OK, ORDER_UNKNOWN)
    agg = ctx.frames.records.groupBy("node", "file").agg(
        F.count("*").alias("rows"), F.sum((~ok).cast("long")).alias("bad"),
        F.max(F.when(ok, F.col("offset"))).alias("last_ok"), F.min(F.when(~ok, F.col("offset"))).alias("first_bad"),
        F.max(F.when(~ok, F.col("offset"))).alias("last_bad"), F.sum(flagged.cast("long")).alias("misordered"),
        F.min("zxid").alias("low"), F.max("zxid").alias("high"))
    rows = ctx.frames.segments_df.join(agg, ["node", "file"], "left").collect()
    return sorted(rows, key=lambda r: (r.node, r.file))  # few rows: sorted here, not by a Spark job


# -- Checksums ---------------------------------------------------------------------------------

def check_checksums(ctx: Context, files: list) -> CheckResult:
    """Every record's CRC, every segment header, every snapshot file."""
    ctx.progress("Checksums: records, segment headers, snapshots")
    result = CheckResult(CHECKSUMS, checked=sum(f.rows or 0 for f in files) + len(files))
    # A damaged record after the newest segment's last valid one is a torn tail: a crash
    # left it, nothing in it was acknowledged, and the node truncates it when it opens the log.
    harmful = [f for f in files if f.bad and not (f.newest and (f.last_ok is None or f.first_bad > f.last_ok))]
    for f in files:
        if f.bad and f not in harmful:
            result.notes.append(f"node {f.node} {f.file}: damaged tail from offset {f.first_bad} (a crash's "
                                "unsynced write; the node truncates it on restart)")
    if harmful:
        bad = ctx.frames.records.where("checksum != 'ok'").orderBy("node", "file", "offset")
        rows = [r for r in bad.limit(200).collect() if any(r.node == f.node and r.file == f.file for f in harmful)]
        result.add(sum(f.bad for f in harmful), [f"node {r.node} {r.file} offset {r.offset}: {r.checksum}: "
                                                 f"{r.detail}" for r in rows])
    headers = [f for f in files if not f.header_ok and not (f.newest and f.records == 0)]
    result.add(len(headers), [f"node {f.node} {f.file}: invalid segment header" for f in headers])
    snaps = ctx.snapshot_rows = ctx.frames.snapshots.collect()
    result.checked += len(snaps)
    broken = [r for r in snaps if r.status != "ok"]
    result.add(len(broken), [f"node {r.node} {r.file}: {r.error}" for r in broken])
    return result


# -- Agreement ---------------------------------------------------------------------------------

def check_agreement(ctx: Context, zsum) -> CheckResult:  # noqa: ANN001 - a Row
    """Every zxid names the same record body on every node whose log holds it."""
    ctx.progress("Agreement: one body per zxid")
    result = CheckResult(AGREEMENT, checked=zsum.zxids)
    if not zsum.differing:
        return result
    first = [r.zxid for r in ctx.per_zxid.where("differs").orderBy("zxid").limit(MAX_EXAMPLES).collect()]
    rows = ctx.valid.where(F.col("zxid").isin(first)).select("zxid", "node", "hash_hi", "txn_type", "path")
    by_zxid: dict[int, list[str]] = {}
    for r in sorted(rows.collect(), key=lambda r: (r.zxid, r.node)):
        by_zxid.setdefault(r.zxid, []).append(f"node {r.node}: {r.hash_hi & (1 << 64) - 1:016x} "
                                              f"{r.txn_type or ''} {r.path or ''}".rstrip())
    result.add(zsum.differing, [f"zxid {fmt(z)} differs: " + "; ".join(by_zxid[z]) for z in first])
    return result


# -- EpochOrder --------------------------------------------------------------------------------

def check_epoch_order(ctx: Context, files: list) -> CheckResult:
    """Within each log: zxids increase, epochs never go backwards, counters are contiguous
    within an epoch and a new epoch starts at 1; segments chain (docs/formats.md)."""
    ctx.progress("EpochOrder: each log in order")
    result = CheckResult(EPOCH_ORDER, checked=sum((f.rows or 0) - (f.bad or 0) for f in files))
    misordered = sum(f.misordered or 0 for f in files)
    if misordered:
        flagged = ctx.valid.where(~F.col("order").isin(ORDER_OK, ORDER_UNKNOWN))
        rows = flagged.orderBy("node", "zxid").limit(MAX_EXAMPLES).collect()
        result.add(misordered, [f"node {r.node} {r.file} offset {r.offset}: {fmt(r.zxid)} after "
                                f"{fmt(r.prev_zxid)}: {r.order}" for r in rows])
    for prev, seg in zip([None, *files], files):
        if seg.header_ok and seg.low is not None and seg.low != seg.first_zxid:
            result.add(1, [f"node {seg.node} {seg.file}: header says first zxid {fmt(seg.first_zxid)}, "
                           f"first record is {fmt(seg.low)}"])
        if prev is None or prev.node != seg.node or not seg.header_ok or prev.high is None:
            continue
        if seg.prev_zxid != prev.high:
            result.add(1, [f"node {seg.node} {seg.file}: does not continue {prev.file} (it ends at "
                           f"{fmt(prev.high)}, the header says {fmt(seg.prev_zxid)}): a segment is missing"])
    return result


# -- the committed history ------------------------------------------------------------------------

def _commit(ctx: Context, c: int | None) -> None:
    """The horizons, the commit point and H (replay.verify_history); `c` is C."""
    for s in reversed(ctx.frames.segments):  # name order: the oldest valid header comes last
        if s.layout.prev_zxid is not None:
            ctx.bases[s.node] = None if s.layout.prev_zxid == UNKNOWN_PREV_ZXID else s.layout.prev_zxid
    ctx.horizons = {n.node: 0 for n in ctx.frames.nodes}
    for node, base in ctx.bases.items():
        ctx.horizons[node] = max(ctx.horizons[node], base or 0)
    for r in [r for r in ctx.snapshot_rows if r.status == "ok"]:
        ctx.horizons[r.node] = max(ctx.horizons[r.node], r.zxid)
    commit_point = max([c or 0, *ctx.horizons.values()])
    counters: dict[int, tuple[int, int]] = {}
    starts: dict[int, dict[int, int]] = {}
    top = None
    # One job: per epoch the counter range and the highest zxid <= commit point; the
    # predecessors of every counter-1 zxid ride along (few: one per epoch and node).
    for r in ctx.per_zxid.groupBy("epoch").agg(
            F.min("counter").alias("lo"), F.max("counter").alias("hi"),
            F.max(F.when(F.col("zxid") <= commit_point, F.col("zxid"))).alias("top"),
            F.collect_list(F.when(F.col("counter") == 1, F.col("zxid"))).alias("firsts")).collect():
        counters[r.epoch] = (r.lo, r.hi)
        top = max(top or 0, r.top or 0) or None
        for z in r.firsts:
            starts[z] = {}
    if starts:
        for r in ctx.valid.where(F.col("zxid").isin(list(starts))).groupBy("zxid", "prev_zxid").agg(
                F.countDistinct("node").alias("n")).collect():
            if r.prev_zxid is not None:
                starts[r.zxid][r.prev_zxid] = r.n
    ctx.history = build_history(top, commit_point, counters, starts)
    ctx.facts.update({"majority": f"{ctx.majority} of {ctx.voters} voters",
                      "C (highest zxid on a majority)": fmt(c), "commit point": fmt(commit_point),
                      "committed history": _describe(ctx.history)})


def _describe(h: CommittedHistory) -> str:
    if not h.spans:
        return "empty"
    return f"{fmt(h.first)} .. {fmt(h.last)}, {h.count_between(h.first, h.last)} txns in {len(h.spans)} epoch(s)"


def _history_frame(ctx: Context) -> DataFrame:
    rows = [(s.epoch, s.lo, s.hi, s.pred) for s in ctx.history.spans]
    return ctx.spark.createDataFrame(rows, "epoch bigint, lo bigint, hi bigint, h_pred bigint")


def _with_history(ctx: Context) -> DataFrame:
    """Valid records with `in_h` (the zxid is in H) and `divergent` (an epoch start in H
    whose predecessor in this log is not H's); per-node counts collected in one job."""
    slim = ctx.valid.select("node", "file", "offset", "zxid", "epoch", "counter", "prev_zxid")
    joined = slim.join(F.broadcast(_history_frame(ctx)), "epoch", "left")
    joined = joined.withColumn("in_h", F.coalesce(F.col("counter").between(F.col("lo"), F.col("hi")), F.lit(False)))
    joined = joined.withColumn("divergent", F.col("in_h") & (F.col("lo") == 1) & (F.col("counter") == 1)
                               & F.col("prev_zxid").isNotNull() & (F.col("prev_zxid") != F.col("h_pred")))
    zxid, in_h = F.col("zxid"), F.col("in_h")
    stats = joined.groupBy("node").agg(
        F.count("*").alias("records"), F.sum(in_h.cast("long")).alias("in_h"),
        F.min(F.when(in_h, zxid)).alias("low_h"), F.max(F.when(in_h, zxid)).alias("top_h"),
        F.min("zxid").alias("first"), F.max("zxid").alias("last"),
        F.sum(F.col("divergent").cast("long")).alias("divergent"),
        F.min(F.when(~in_h, zxid)).alias("low_out"), F.sum((~in_h).cast("long")).alias("out")).collect()
    ctx.tops = {r.node: r.top_h for r in stats if r.top_h is not None}
    ctx.facts["nodes"] = "; ".join(
        f"{r.node}: {r.records} records {fmt(r.first)}..{fmt(r.last)}, committed up to {fmt(r.top_h)}"
        for r in sorted(stats, key=lambda r: r.node))
    ctx.node_stats = {r.node: r for r in stats}
    return joined


# -- PrefixConsistency / TotalOrder ------------------------------------------------------------

def check_prefix(ctx: Context, joined: DataFrame, forks: int) -> CheckResult:
    """Each log's committed part is H between its first and last committed zxid, with
    nothing missing; every zxid has one predecessor on every node that holds it."""
    ctx.progress("PrefixConsistency/TotalOrder: each log against the committed history")
    h = ctx.history
    result = CheckResult(PREFIX, checked=sum(r.in_h or 0 for r in ctx.node_stats.values()))
    for node, r in sorted(ctx.node_stats.items()):
        missing = h.count_between(r.low_h, r.top_h) - r.in_h if r.top_h is not None else 0
        if missing:
            result.add(missing, [f"node {node}: {missing} committed txn(s) between {fmt(r.low_h)} and "
                                 f"{fmt(r.top_h)} missing from its log"])
    divergent = sum(r.divergent or 0 for r in ctx.node_stats.values())
    if divergent:
        rows = joined.where("divergent").orderBy("zxid", "node").limit(MAX_EXAMPLES).collect()
        result.add(divergent, [f"node {r.node}: {fmt(r.zxid)} follows {fmt(r.prev_zxid)}, the committed "
                               f"history has {fmt(r.h_pred)} before it" for r in rows])
    if forks:
        rows = ctx.per_zxid.where(F.col("p_min") != F.col("p_max")).orderBy("zxid").limit(MAX_EXAMPLES).collect()
        result.add(forks, [f"TotalOrder: {fmt(r.zxid)} has different predecessors on different nodes: "
                           f"{fmt(r.p_min)} and {fmt(r.p_max)}" for r in rows])
    for zxid, votes in h.contested[:MAX_EXAMPLES]:
        result.notes.append(f"predecessor of {fmt(zxid)} contested: "
                            + ", ".join(f"{fmt(p)} on {n} node(s)" for p, n in sorted(votes.items())))
    return result


# -- NoSkippedProposal ------------------------------------------------------------------------

def check_skipped(ctx: Context, joined: DataFrame) -> CheckResult:
    """No log holds, inside its committed part, a zxid that is not in H: a proposal that a
    later epoch truncated (or never committed) must not sit among committed txns."""
    ctx.progress("NoSkippedProposal: uncommitted proposals inside committed history")
    result = CheckResult(SKIPPED, checked=sum(r.records for r in ctx.node_stats.values()))
    for node, r in sorted(ctx.node_stats.items()):
        if not r.out:
            continue
        inside = joined.where((F.col("node") == node) & ~F.col("in_h") & (F.col("zxid") < (r.top_h or 0)))
        count = inside.count() if r.top_h is not None and r.low_out < r.top_h else 0
        if count:
            rows = inside.orderBy("zxid").limit(MAX_EXAMPLES).collect()
            result.add(count, [f"node {node} {x.file} offset {x.offset}: {fmt(x.zxid)} (epoch {x.epoch}) is not in "
                               f"the committed history but precedes {fmt(r.top_h)} in this log" for x in rows])
        if r.out > count:
            result.notes.append(f"node {node}: {r.out - count} record(s) past its committed history at the end of "
                                "its log (proposals not committed yet, or that no quorum took: a leader TRUNCs them)")
    return result


# -- QuorumPresence ----------------------------------------------------------------------------

def check_quorum(ctx: Context) -> CheckResult:
    """Every committed zxid (in H, at or below the commit point) is held by a majority of
    voters: in its log, or covered by its horizon (a snapshot or log base at or above it)."""
    ctx.progress("QuorumPresence: committed txns on a majority")
    h = ctx.history
    result = CheckResult(QUORUM)
    if not h.spans:
        return result
    committed = ctx.per_zxid.join(F.broadcast(_history_frame(ctx)), "epoch").where(
        F.col("counter").between(F.col("lo"), F.col("hi")) & (F.col("zxid") <= h.commit_point))
    coverage = F.col("n_nodes")
    for i, n in enumerate(ctx.frames.nodes):
        held = F.col("mask").bitwiseAND(F.lit(1 << i)) != 0
        covered = (F.lit(ctx.horizons.get(n.node, 0)) >= F.col("zxid")) & ~held
        coverage = coverage + covered.cast("int")
    committed = committed.withColumn("coverage", coverage)
    totals = committed.agg(F.count("*").alias("n"),
                           F.sum((F.col("coverage") < ctx.majority).cast("long")).alias("short")).first()
    result.checked = totals.n
    if totals.short:
        rows = committed.where(F.col("coverage") < ctx.majority).orderBy("zxid").limit(MAX_EXAMPLES).collect()
        result.add(totals.short, [f"{fmt(r.zxid)} is committed but only nodes {nodes_of(ctx, r.mask)} hold it "
                                  f"({r.coverage} of the {ctx.majority} needed)" for r in rows])
    missing = h.count_between(h.first, h.last) - result.checked
    if missing > 0:
        result.add(missing, [f"{missing} committed zxid(s) of {_describe(h)} are in no log at all"])
    return result


# -- Replay ------------------------------------------------------------------------------------

def check_replay(ctx: Context) -> CheckResult:
    """From every valid snapshot (and zxid 0 where a log reaches back to it), replay each
    node's log through the state machine; equal digests at every zxid two sources reach."""
    ctx.progress("Replay: applying every log through the state machine")
    snaps = [r for r in ctx.snapshot_rows if r.status == "ok"]
    checkpoints = {r.zxid for r in snaps} | set(ctx.tops.values()) | {ctx.history.commit_point}
    segments: dict[int, list[tuple[int, str]]] = {}
    for s in ctx.frames.segments:
        if s.layout.first_zxid is not None:
            segments.setdefault(s.node, []).append((s.layout.first_zxid, s.path))
    snapshot_dirs = {n.node: n.path for n in ctx.frames.nodes}
    paths = {(r.node, r.zxid): f"{snapshot_dirs[r.node]}/snapshots/{r.file}" for r in snaps}
    by_node: dict[int, list[int]] = {}
    for r in snaps:
        by_node.setdefault(r.node, []).append(r.zxid)
    chunk_starts = {s.path: tuple(c.start for c in s.layout.chunks) for s in ctx.frames.segments}
    tasks = plan_replays(segments, by_node, paths, ctx.bases, ctx.tops, checkpoints, chunk_starts)
    rows = run_replays(ctx.spark, tasks)
    digests: dict[int, list[tuple[str, str]]] = {}
    for r in snaps:
        digests.setdefault(r.zxid, []).append((f"node {r.node} snapshot", r.digest))
    result = CheckResult(REPLAY)
    for r in rows:
        if r.error:
            result.add(1, [f"node {r.node} {r.source}: {r.error}"])
        else:
            digests.setdefault(r.zxid, []).append((f"node {r.node} {r.source}", r.digest))
    for zxid in sorted(digests):
        if len({d for _, d in digests[zxid]}) > 1:
            result.add(1, [f"digests differ at {fmt(zxid)}: " + "; ".join(f"{s}: {d}" for s, d in digests[zxid])])
    result.checked = sum(len(v) for v in digests.values())
    result.notes.append(f"{len(tasks)} replay task(s), digests compared at {len(digests)} zxid(s)")
    return result
