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
from zab import zxid as Z

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
    protocol: str
    progress: Progress
    valid: DataFrame = None  # type: ignore[assignment]
    per_zxid: DataFrame = None  # type: ignore[assignment]
    history: CommittedHistory | None = None
    horizons: dict[int, int] = field(default_factory=dict)
    bases: dict[int, int | None] = field(default_factory=dict)
    tops: dict[int, int] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)

    @property
    def majority(self) -> int:
        return self.voters // 2 + 1


def run_checks(ctx: Context) -> list[CheckResult]:
    """Every Zab check, in the order of CHECK_NAMES."""
    ctx.valid = ctx.frames.records.where("checksum = 'ok'")
    ctx.per_zxid = ctx.valid.groupBy("zxid").agg(
        F.first("epoch").alias("epoch"), F.first("counter").alias("counter"),
        F.countDistinct("node").alias("n_nodes"), F.collect_set("node").alias("nodes"),
        F.collect_set("body_hash").alias("hashes"), F.collect_set("prev_zxid").alias("preds")).persist()
    results = {CHECKSUMS: check_checksums(ctx), AGREEMENT: check_agreement(ctx)}
    results[EPOCH_ORDER] = check_epoch_order(ctx)
    ctx.progress("finding the committed history")
    _commit(ctx)
    per_record = _with_history(ctx)
    results[PREFIX] = check_prefix(ctx, per_record)
    results[SKIPPED] = check_skipped(ctx, per_record)
    results[QUORUM] = check_quorum(ctx)
    results[REPLAY] = check_replay(ctx)
    ctx.per_zxid.unpersist()
    return [results[name] for name in CHECK_NAMES]


# -- Checksums ---------------------------------------------------------------------------------

def check_checksums(ctx: Context) -> CheckResult:
    """Every record's CRC, every segment header, every snapshot file."""
    ctx.progress("Checksums: records, segment headers, snapshots")
    result = CheckResult(CHECKSUMS)
    records = ctx.frames.records
    last_ok = ctx.valid.groupBy("node", "file").agg(F.max("offset").alias("last_ok"))
    bad = records.where("checksum != 'ok'").join(ctx.frames.segments_df.select("node", "file", "newest"),
                                                 ["node", "file"]).join(last_ok, ["node", "file"], "left")
    # A damaged record after the newest segment's last valid one is a torn tail: a crash
    # left it, nothing in it was acknowledged, and the node truncates it when it opens the log.
    tail = F.col("newest") & (F.col("last_ok").isNull() | (F.col("offset") > F.col("last_ok")))
    bad = bad.withColumn("tail", tail).persist()
    harmful = bad.where("not tail").orderBy("node", "file", "offset")
    result.add(harmful.count(), [f"node {r.node} {r.file} offset {r.offset}: {r.checksum}: {r.detail}"
                                 for r in harmful.limit(MAX_EXAMPLES).collect()])
    for r in bad.where("tail").collect()[:MAX_EXAMPLES]:
        result.notes.append(f"node {r.node} {r.file}: {r.checksum} tail at offset {r.offset} (a crash's unsynced "
                            "write; the node truncates it on restart)")
    bad.unpersist()
    segments = ctx.frames.segments_df
    headers = segments.where("not header_ok and not (newest and records = 0)").collect()
    result.add(len(headers), [f"node {r.node} {r.file}: invalid segment header" for r in headers])
    snaps = ctx.frames.snapshots
    broken = snaps.where("status != 'ok'").collect()
    result.add(len(broken), [f"node {r.node} {r.file}: {r.error}" for r in broken])
    result.checked = records.count() + segments.count() + snaps.count()
    return result


# -- Agreement ---------------------------------------------------------------------------------

def check_agreement(ctx: Context) -> CheckResult:
    """Every zxid names the same record body on every node whose log holds it."""
    ctx.progress("Agreement: one body per zxid")
    result = CheckResult(AGREEMENT, checked=ctx.per_zxid.count())
    differing = ctx.per_zxid.where(F.size("hashes") > 1).select("zxid").persist()
    count = differing.count()
    examples = []
    if count:
        first = [r.zxid for r in differing.orderBy("zxid").limit(MAX_EXAMPLES).collect()]
        rows = ctx.valid.where(F.col("zxid").isin(first)).select("zxid", "node", "body_hash", "txn_type", "path")
        by_zxid: dict[int, list[str]] = {}
        for r in rows.orderBy("zxid", "node").collect():
            by_zxid.setdefault(r.zxid, []).append(f"node {r.node}: {bytes(r.body_hash).hex()[:12]} "
                                                  f"{r.txn_type or ''} {r.path or ''}".rstrip())
        examples = [f"zxid {fmt(z)} differs: " + "; ".join(by_zxid[z]) for z in first]
    differing.unpersist()
    result.add(count, examples)
    return result


# -- EpochOrder --------------------------------------------------------------------------------

def check_epoch_order(ctx: Context) -> CheckResult:
    """Within each log: zxids increase, epochs never go backwards, counters are contiguous
    within an epoch and a new epoch starts at 1; segments chain (docs/formats.md)."""
    ctx.progress("EpochOrder: each log in order")
    result = CheckResult(EPOCH_ORDER, checked=ctx.valid.count())
    flagged = ctx.valid.where(~F.col("order").isin(ORDER_OK, ORDER_UNKNOWN))
    rows = flagged.orderBy("node", "zxid").limit(MAX_EXAMPLES).collect()
    result.add(flagged.count(), [f"node {r.node} {r.file} offset {r.offset}: {fmt(r.zxid)} after "
                                 f"{fmt(r.prev_zxid)}: {r.order}" for r in rows])
    files = ctx.valid.groupBy("node", "file").agg(F.min("zxid").alias("low"), F.max("zxid").alias("high"))
    segs = ctx.frames.segments_df.join(files, ["node", "file"], "left").orderBy("node", "file").collect()
    for prev, seg in zip([None, *segs], segs):
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

def _commit(ctx: Context) -> None:
    """C, the horizons, the commit point and H (replay.verify_history)."""
    c = ctx.per_zxid.where(F.col("n_nodes") >= ctx.majority).agg(F.max("zxid")).first()[0]
    oldest = ctx.frames.segments_df.where("header_ok").groupBy("node").agg(F.min("file").alias("file"))
    base_rows = ctx.frames.segments_df.join(oldest, ["node", "file"]).collect()
    ctx.bases = {r.node: (None if r.prev_zxid is None or r.prev_zxid < 0 else r.prev_zxid) for r in base_rows}
    snaps = ctx.frames.snapshots.where("status = 'ok'").groupBy("node").agg(F.max("zxid").alias("z")).collect()
    ctx.horizons = {n.node: 0 for n in ctx.frames.nodes}
    for node, base in ctx.bases.items():
        ctx.horizons[node] = max(ctx.horizons[node], base or 0)
    for r in snaps:
        ctx.horizons[r.node] = max(ctx.horizons[r.node], r.z)
    commit_point = max([c or 0, *ctx.horizons.values()])
    top = ctx.per_zxid.where(F.col("zxid") <= commit_point).agg(F.max("zxid")).first()[0]
    counters = {r.epoch: (r.lo, r.hi) for r in ctx.per_zxid.groupBy("epoch").agg(
        F.min("counter").alias("lo"), F.max("counter").alias("hi")).collect()}
    starts: dict[int, dict[int, int]] = {}
    for r in ctx.valid.where("counter = 1").groupBy("zxid", "prev_zxid").agg(F.countDistinct("node").alias("n")).collect():
        votes = starts.setdefault(r.zxid, {})
        if r.prev_zxid is not None:
            votes[r.prev_zxid] = r.n
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
    """Valid records with `in_h` (the record's zxid is in H) and per-node facts collected."""
    joined = ctx.valid.join(F.broadcast(_history_frame(ctx)), "epoch", "left")
    joined = joined.withColumn("in_h", F.coalesce(F.col("counter").between(F.col("lo"), F.col("hi")), F.lit(False)))
    joined = joined.persist()
    stats = joined.groupBy("node").agg(
        F.count("*").alias("records"), F.sum(F.col("in_h").cast("long")).alias("in_h"),
        F.min(F.when(F.col("in_h"), F.col("zxid"))).alias("low_h"),
        F.max(F.when(F.col("in_h"), F.col("zxid"))).alias("top_h"),
        F.min("zxid").alias("first"), F.max("zxid").alias("last")).collect()
    ctx.tops = {r.node: r.top_h for r in stats if r.top_h is not None}
    ctx.facts["nodes"] = ", ".join(
        f"{r.node}: {r.records} records {fmt(r.first)}..{fmt(r.last)}, committed up to {fmt(r.top_h)}"
        for r in sorted(stats, key=lambda r: r.node))
    ctx.facts["node stats"] = {r.node: (r.in_h, r.low_h, r.top_h) for r in stats}
    return joined


# -- PrefixConsistency / TotalOrder ------------------------------------------------------------

def check_prefix(ctx: Context, joined: DataFrame) -> CheckResult:
    """Each log's committed part is H between its first and last committed zxid, with
    nothing missing; every zxid has one predecessor on every node that holds it."""
    ctx.progress("PrefixConsistency/TotalOrder: each log against the committed history")
    h = ctx.history
    stats = ctx.facts.pop("node stats")
    result = CheckResult(PREFIX, checked=sum(s[0] or 0 for s in stats.values()))
    for node, (in_h, low, top) in sorted(stats.items()):
        missing = h.count_between(low, top) - in_h if top is not None else 0
        if missing:
            result.add(missing, [f"node {node}: {missing} committed txn(s) between {fmt(low)} and {fmt(top)} "
                                 "missing from its log"])
    divergent = joined.where("in_h and lo = 1 and counter = 1 and prev_zxid is not null and prev_zxid != h_pred")
    rows = divergent.orderBy("zxid", "node").limit(MAX_EXAMPLES).collect()
    result.add(divergent.count(), [f"node {r.node}: {fmt(r.zxid)} follows {fmt(r.prev_zxid)}, the committed "
                                   f"history has {fmt(r.h_pred)} before it" for r in rows])
    forks = ctx.per_zxid.where(F.size("preds") > 1)
    rows = forks.orderBy("zxid").limit(MAX_EXAMPLES).collect()
    result.add(forks.count(), [f"TotalOrder: {fmt(r.zxid)} has different predecessors on different nodes: "
                               f"{', '.join(fmt(p) for p in sorted(r.preds))}" for r in rows])
    for zxid, votes in h.contested[:MAX_EXAMPLES]:
        result.notes.append(f"predecessor of {fmt(zxid)} contested: "
                            + ", ".join(f"{fmt(p)} on {n} node(s)" for p, n in sorted(votes.items())))
    return result


# -- NoSkippedProposal ------------------------------------------------------------------------

def check_skipped(ctx: Context, joined: DataFrame) -> CheckResult:
    """No log holds, inside its committed part, a zxid that is not in H: a proposal that a
    later epoch truncated (or never committed) must not sit among committed txns."""
    ctx.progress("NoSkippedProposal: uncommitted proposals inside committed history")
    tops = ctx.spark.createDataFrame(list(ctx.tops.items()) or [(0, 0)], "node int, top_h bigint")
    inside = joined.join(F.broadcast(tops), "node").where("not in_h and zxid < top_h")
    result = CheckResult(SKIPPED, checked=joined.count())
    rows = inside.orderBy("node", "zxid").limit(MAX_EXAMPLES).collect()
    result.add(inside.count(), [
        f"node {r.node} {r.file} offset {r.offset}: {fmt(r.zxid)} (epoch {r.epoch}) is not in the committed "
        f"history but precedes {fmt(r.top_h)} in this log" for r in rows])
    tails = joined.join(F.broadcast(tops), "node", "left").where(
        "not in_h and (top_h is null or zxid > top_h) and zxid <= " + str(ctx.history.commit_point))
    for r in tails.groupBy("node").agg(F.count("*").alias("n"), F.min("zxid").alias("z")).collect():
        result.notes.append(f"node {r.node}: {r.n} uncommitted record(s) from {fmt(r.z)} at the end of its log "
                            "(a proposal no quorum took; a leader would TRUNC them)")
    joined.unpersist()
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
    for node, horizon in ctx.horizons.items():
        covered = (F.lit(horizon) >= F.col("zxid")) & ~F.array_contains("nodes", node)
        coverage = coverage + covered.cast("int")
    short = committed.withColumn("coverage", coverage).where(F.col("coverage") < ctx.majority)
    result.checked = committed.count()
    rows = short.orderBy("zxid").limit(MAX_EXAMPLES).collect()
    result.add(short.count(), [f"{fmt(r.zxid)} is committed but only nodes {sorted(r.nodes)} hold it "
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
    snaps = ctx.frames.snapshots.where("status = 'ok'").collect()
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
    tasks = plan_replays(segments, by_node, paths, ctx.bases, ctx.tops, checkpoints, ctx.protocol)
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
