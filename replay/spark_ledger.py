"""The ledger verifier on Spark: stored entries of every bookie against the ledger metadata.

The metadata is what the metastore holds at the end of its committed history: one Spark
task replays the most advanced node's log (from its newest valid snapshot) through
MetastoreStateMachine and returns the ledger znodes (ledger/metadata.py). Bookie files
(`<data_dir>/bookie/journal/journal.*`, `<data_dir>/bookie/entrylogs/entrylog.*`; the
bookie id is the node id) are decoded one file per task into `entries`:

    bookie, source, file, ledger, entry, lac, length, digest ("ok", "bad", "unchecked"), offset

The expected placements (ledger, entry, bookie: the write set of each entry in its
fragment's ensemble, ledger/quorum.py's rule) are generated in Spark and joined with the
entries that carry a valid (or uncheckable) digest. Definitions: docs/verify.md.
"""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ledger.manager import DEFAULT_ROOT
from ledger.metadata import LedgerMetadata
from ledger.quorum import write_quorum
from replay.spark_replay import log_txns
from replay.spark_source import NodeDir, SegmentFile
from replay.verify_ledger_decode import DIGEST_BAD, entry_log_file, journal_file, ledgers_in
from replay.verify_replay import replay, restore
from replay.verify_report import MAX_EXAMPLES, CheckResult
from metastore.core.tree import DataTree
from zab.core import zxid as Z
from zab.storage.snapshot import read_body

ENTRY_DIGESTS, REPLICAS, CLOSED = "EntryDigests", "AckQuorumReplicas", "ClosedLedgers"
_ENTRY_SCHEMA = ("bookie int, source string, file string, ledger bigint, entry bigint, lac bigint, length bigint, "
                 "digest string, offset bigint")
_FILES = {"journal": re.compile(r"journal\.[0-9a-f]{16}"), "entrylogs": re.compile(r"entrylog\.[0-9a-f]{16}")}


def replayed_tree(task: tuple) -> tuple[DataTree, str]:
    """Replay one node to `end`: the metastore tree there, and the replay's error ("" if none).

    `task` is (snapshot path or None, its zxid, end, segment paths, their chunk starts):
    the segments are read from the chunk holding the first zxid after the snapshot.
    """
    snapshot, start, end, segments, chunk_starts = task
    sm = restore(start, read_body(Path(snapshot)) if snapshot else None, str(snapshot))  # in pieces
    outcome = replay(sm, start, end, log_txns(segments, start, chunk_starts), ())
    return sm.tree, outcome.error


def _final_tree_task(task: tuple) -> tuple[list, list[str], str]:
    """The ledgers under DEFAULT_ROOT (as metadata) in the replayed tree, broken znodes, error."""
    tree, error = replayed_tree(task)
    found, broken = ledgers_in(tree, DEFAULT_ROOT)
    return found, broken, error


def replay_task(segments: list[SegmentFile], snapshots: list, tops: dict[int, int],
                bases: dict[int, int | None]) -> tuple[int, int, tuple]:
    """The most advanced node, its end, and the replayed_tree task that reaches it."""
    node = max(tops, key=lambda n: tops[n])
    end = tops[node]
    usable = [r for r in snapshots if r.node == node and r.status == "ok" and r.zxid <= end
              and (bases.get(node) is None or bases[node] <= r.zxid)]
    newest = max(usable, key=lambda r: r.zxid, default=None)
    files = tuple(s.path for s in segments if s.node == node)
    chunk_starts = tuple(tuple(c.start for c in s.layout.chunks) if s.layout else ()
                         for s in segments if s.node == node)
    snapshot_path = str(Path(files[0]).parent.parent / "snapshots" / newest.file) if newest and files else None
    return node, end, (snapshot_path, newest.zxid if newest else 0, end, files, chunk_starts)


def final_metadata(spark: SparkSession, segments: list[SegmentFile], snapshots: list, tops: dict[int, int],
                   bases: dict[int, int | None]) -> tuple[list[LedgerMetadata], list[str], str]:
    """Ledger metadata at the end of the committed history (see the module doc)."""
    node, end, task = replay_task(segments, snapshots, tops, bases)
    found, broken, error = spark.sparkContext.parallelize([task], 1).map(_final_tree_task).first()
    return found, broken, error and f"node {node}: replay to {Z.fmt(end)} failed: {error}"


def _bookie_task(item: tuple[int, str, str]) -> tuple[list[tuple], list[int], str]:
    bookie, kind, path = item
    buf = Path(path).read_bytes()
    got = journal_file(buf) if kind == "journal" else entry_log_file(buf)
    rows = [(bookie, kind, Path(path).name, *e) for e in got.entries]
    problem = "" if got.header_ok else f"bookie {bookie} {Path(path).name}: invalid file header"
    if got.stop and kind == "entrylogs":
        problem = f"bookie {bookie} {Path(path).name}: scan stopped: {got.stop}"
    return rows, got.deleted, problem


def bookie_files(nodes: list[NodeDir]) -> list[tuple[int, str, str]]:
    """(bookie, "journal" or "entrylogs", path) of every bookie file under the nodes' data dirs."""
    items = []
    for n in nodes:
        for kind, pattern in _FILES.items():
            folder = Path(n.path) / "bookie" / kind
            if folder.is_dir():
                items += [(n.node, kind, str(p)) for p in sorted(folder.iterdir()) if pattern.fullmatch(p.name)]
    return items


def read_entries(spark: SparkSession, nodes: list[NodeDir]) -> tuple[DataFrame, set[int], list[str]]:
    """Every stored entry of every bookie (the `entries` DataFrame, cached), deleted ledger ids, file problems."""
    items = bookie_files(nodes)
    results = spark.sparkContext.parallelize(items, max(1, len(items))).map(_bookie_task).cache() if items else None
    rows = results.flatMap(lambda r: r[0]) if results else spark.sparkContext.emptyRDD()
    entries = spark.createDataFrame(rows, _ENTRY_SCHEMA, verifySchema=False).persist()
    small = results.map(lambda r: (r[1], r[2])).collect() if results else []
    deleted = {d for ds, _ in small for d in ds}
    return entries, deleted, [p for _, p in small if p]


def _metadata_frame(spark: SparkSession, ledgers: list[LedgerMetadata], lasts: dict[int, int]) -> DataFrame:
    """One row per fragment with its entry range: closed ledgers to last_entry, open ones to the
    highest LAC any stored entry carries (what the writer had acknowledged)."""
    rows = []
    for m in ledgers:
        last = m.last_entry if m.is_closed else lasts.get(m.ledger_id, -1)
        for i, f in enumerate(m.fragments):
            end = min(m.fragment_end(i) if m.fragment_end(i) is not None else last, last)
            if end >= f.first_entry:
                rows.append((m.ledger_id, f.first_entry, end, list(f.ensemble), m.ensemble_size, m.write_quorum,
                             m.ack_quorum))
    return spark.createDataFrame(rows, "ledger bigint, first bigint, last bigint, ensemble array<int>, e int, "
                                       "qw int, qa int")


def check_ledgers(spark: SparkSession, entries: DataFrame, ledgers: list[LedgerMetadata],
                  deleted: set[int]) -> list[CheckResult]:
    """EntryDigests, AckQuorumReplicas and ClosedLedgers."""
    digests = CheckResult(ENTRY_DIGESTS, checked=entries.count())
    bad = entries.where(F.col("digest") == DIGEST_BAD)
    n_bad = bad.count()
    if n_bad:
        digests.add(n_bad, [f"bookie {r.bookie} {r.file}: ledger {r.ledger} entry {r.entry}: digest mismatch"
                            for r in bad.limit(MAX_EXAMPLES).collect()])
    good = entries.where(F.col("digest") != DIGEST_BAD).select("ledger", "entry", "bookie").distinct()
    lasts = {r.ledger: r.lac for r in entries.groupBy("ledger").agg(F.max("lac").alias("lac")).collect()}
    return [digests, _replicas(spark, good, ledgers, lasts), _closed(spark, entries, ledgers, deleted)]


def _replicas(spark: SparkSession, good: DataFrame, ledgers: list[LedgerMetadata], lasts: dict[int, int]) -> CheckResult:
    result = CheckResult(REPLICAS)
    frags = _metadata_frame(spark, ledgers, lasts)
    expected = frags.select("ledger", "e", "qw", "qa", "ensemble", F.explode(F.sequence("first", "last")).alias("entry"))
    expected = expected.select("ledger", "entry", "qw", "qa", F.explode(F.transform(
        F.sequence(F.lit(0), F.col("qw") - 1),
        lambda i: F.element_at("ensemble", F.pmod(F.col("entry") + i, F.col("e")).cast("int") + 1))).alias("bookie"))
    held = expected.join(good.withColumn("held", F.lit(1)), ["ledger", "entry", "bookie"], "left")
    per_entry = held.groupBy("ledger", "entry").agg(F.first("qw").alias("qw"), F.first("qa").alias("qa"),
                                                    F.count("held").alias("copies"),
                                                    F.collect_list(F.when(F.col("held").isNull(), F.col("bookie")))
                                                    .alias("missing"))
    totals = per_entry.agg(F.count("*").alias("n"), F.sum((F.col("copies") < F.col("qa")).cast("long")).alias("lost"),
                           F.sum((F.col("copies") < F.col("qw")).cast("long")).alias("under")).first()
    result.checked = totals.n or 0
    if totals.lost:
        rows = per_entry.where(F.col("copies") < F.col("qa")).orderBy("ledger", "entry").limit(MAX_EXAMPLES).collect()
        result.add(totals.lost, [f"ledger {r.ledger} entry {r.entry}: {r.copies} valid copies of the {r.qa} needed "
                                 f"(missing on bookies {sorted(r.missing)})" for r in rows])
    if totals.under:
        result.notes.append(f"{totals.under} entr(y/ies) under-replicated (fewer than Qw valid copies)")
    return result


def _closed(spark: SparkSession, entries: DataFrame, ledgers: list[LedgerMetadata], deleted: set[int]) -> CheckResult:
    """A closed ledger's last entry carries the metadata's length, and the entry after it was never
    acknowledged: fewer than Qa bookies of its write quorum hold it. Recovery closes before the first
    entry that Qw-Qa+1 bookies of its write quorum do not have; acknowledgements come in entry order,
    so what lies past that entry (a killed writer's sends that reached only some bookies) is never
    acknowledged either: noted, not a violation."""
    result = CheckResult(CLOSED)
    closed = {m.ledger_id: m for m in ledgers if m.is_closed}
    result.checked = len(closed)
    if not closed:
        return result
    ends = spark.createDataFrame([(i, m.last_entry) for i, m in closed.items()], "ledger bigint, last bigint")
    valid = entries.where(F.col("digest") != DIGEST_BAD).join(F.broadcast(ends), "ledger")
    rows = valid.groupBy("ledger").agg(
        F.max("entry").alias("high"),
        F.collect_set(F.when(F.col("entry") == F.col("last") + 1, F.col("bookie"))).alias("next_holders"),
        F.collect_set(F.when(F.col("entry") == F.col("last"), F.col("length"))).alias("lengths")).collect()
    orphans = []
    for r in sorted(rows, key=lambda r: r.ledger):
        m = closed[r.ledger]
        following = m.last_entry + 1
        quorum = write_quorum(m.ensemble_for(following), following, m.write_quorum)
        copies = sorted(set(r.next_holders) & set(quorum))
        if len(copies) >= m.ack_quorum:
            result.add(1, [f"ledger {r.ledger}: closed at entry {m.last_entry} but entry {following} is on "
                           f"{len(copies)} bookies of its write quorum ({copies}), enough for an acknowledgement "
                           f"(Qa={m.ack_quorum})"])
        elif r.high > m.last_entry:
            orphans.append(f"ledger {r.ledger}: entries {following}..{r.high} past the close, entry {following} "
                           f"on {len(copies)} of the Qa={m.ack_quorum} bookies an acknowledgement needs")
        if m.last_entry >= 0 and r.lengths and set(r.lengths) != {m.length}:
            result.add(1, [f"ledger {r.ledger}: last entry {m.last_entry} says length {sorted(r.lengths)}, "
                           f"the metadata {m.length}"])
    if orphans:
        result.notes.append(f"never acknowledged, left on bookies past a close: {'; '.join(orphans[:MAX_EXAMPLES])}")
    stale = sorted(deleted & set(closed))
    if stale:
        result.notes.append(f"ledgers deleted on some bookie but still in the metadata: {stale[:MAX_EXAMPLES]}")
    return result
