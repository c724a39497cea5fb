"""The named-log and table verifiers on Spark: logs and tablespaces against their ledgers' entries.

One task replays the most advanced node's metastore log to the end of the committed history
(replay/spark_ledger.py's `replayed_tree`) and returns the logs under /streams, the tablespaces
and the ledger metadata. For the log verifier, one task per bookie file then decodes the record
sets of the segment ledgers' entries into a few numbers each (replay/verify_stream_decode.py's
EntrySummary), collected to the driver, where each log is checked; for the table verifier, the
payloads of the tablespaces' ledgers (checkpoints and segments) are collected whole and replayed
(replay/verify_table_decode.py). Definitions: docs/verify.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bookie.entry import HEADER_BYTES, EntryFormatError, crc32c_digest_ok, parse_header
from ledger.manager import DEFAULT_ROOT as LEDGERS_ROOT
from ledger.metadata import LedgerMetadata
from pyspark.sql import SparkSession
from replay.spark_ledger import bookie_files, replay_task, replayed_tree
from replay.spark_source import NodeDir, SegmentFile
from replay.verify_ledger_decode import ledgers_in, stored_entries
from replay.verify_stream_decode import EntrySummary, LogView, logs_in, summarize
from replay.verify_table_decode import TablespaceView, tablespaces_in
from stream.log_metadata import DEFAULT_ROOT as LOGS_ROOT
from zab.core import zxid as Z


@dataclass
class FinalState:
    """What the metastore holds at the end of the committed history, for these verifiers."""
    logs: list[LogView]
    tablespaces: list[TablespaceView]
    ledgers: list[LedgerMetadata]
    broken: list[str]
    error: str


def _final_task(task: tuple) -> FinalState:
    tree, error = replayed_tree(task)
    logs, broken = logs_in(tree, LOGS_ROOT)
    tablespaces, broken_tables = tablespaces_in(tree, logs)
    ledgers, broken_ledgers = ledgers_in(tree, LEDGERS_ROOT)
    return FinalState(logs, tablespaces, ledgers, broken + broken_tables + broken_ledgers, error)


def final_state(spark: SparkSession, segments: list[SegmentFile], snapshots: list, tops: dict[int, int],
                bases: dict[int, int | None]) -> FinalState:
    """The logs, tablespaces and ledger metadata at the end of the committed history."""
    node, end, task = replay_task(segments, snapshots, tops, bases)
    final = spark.sparkContext.parallelize([task], 1).map(_final_task).first()
    if final.error:
        final.error = f"node {node}: replay to {Z.fmt(end)} failed: {final.error}"
    return final


def _summaries_task(item: tuple[int, str, str, frozenset[int]]) -> list[tuple[int, int, int, EntrySummary | None]]:
    return [(ledger, entry, lac, None if payload is None else summarize(payload))
            for ledger, entry, lac, payload in _payloads_task(item)]


def read_summaries(spark: SparkSession, nodes: list[NodeDir], ledgers: set[int]
                   ) -> tuple[dict[tuple[int, int], EntrySummary], dict[int, int]]:
    """Per (ledger, entry) of the given ledgers, the summary of a valid stored copy; per ledger,
    the highest LAC its stored entries carry (how far an in-progress segment was acknowledged)."""
    wanted = frozenset(ledgers)
    items = [(*f, wanted) for f in bookie_files(nodes)]
    if not items or not wanted:
        return {}, {}
    rows = spark.sparkContext.parallelize(items, len(items)).flatMap(_summaries_task).collect()
    summaries: dict[tuple[int, int], EntrySummary] = {}
    lacs: dict[int, int] = {}
    for ledger, entry, lac, summary in rows:
        lacs[ledger] = max(lacs.get(ledger, -1), lac)
        if summary is not None:
            summaries.setdefault((ledger, entry), summary)
    return summaries, lacs


def _payloads_task(item: tuple[int, str, str, frozenset[int]]) -> list[tuple[int, int, int, bytes | None]]:
    """(ledger, entry, LAC, payload) of the wanted ledgers' entries in one bookie file; the payload
    None where the entry's digest is bad (the LAC -1 where even its header is)."""
    bookie, kind, path, wanted = item
    out = []
    for ledger, entry, data in stored_entries(Path(path).read_bytes(), kind):
        if ledger in wanted:
            try:
                header = parse_header(data)
                ok = crc32c_digest_ok(bytes(data)) is not False
            except EntryFormatError:
                out.append((ledger, entry, -1, None))
                continue
            payload = bytes(data[HEADER_BYTES + header.digest_type.size:]) if ok else None
            out.append((ledger, entry, header.lac, payload))
    return out


def read_payloads(spark: SparkSession, nodes: list[NodeDir], ledgers: set[int]
                  ) -> tuple[dict[tuple[int, int], bytes], dict[int, int]]:
    """Per (ledger, entry) of the given ledgers, the payload of a stored copy with a valid digest;
    per ledger, the highest LAC its stored entries carry."""
    wanted = frozenset(ledgers)
    items = [(*f, wanted) for f in bookie_files(nodes)]
    if not items or not wanted:
        return {}, {}
    payloads: dict[tuple[int, int], bytes] = {}
    lacs: dict[int, int] = {}
    for ledger, entry, lac, payload in spark.sparkContext.parallelize(items, len(items)).flatMap(
            _payloads_task).collect():
        lacs[ledger] = max(lacs.get(ledger, -1), lac)
        if payload is not None:
            payloads.setdefault((ledger, entry), payload)
    return payloads, lacs
