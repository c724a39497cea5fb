"""Quire's files as Spark data sources (Spark 4's Python Data Source API), for SQL and any job:

    from replay.spark_datasources import register
    register(spark)
    spark.read.format("quire-zab").load("data/node1,data/node2=2")       # one row per txn-log record
    spark.read.format("quire-snapshot").load("data/node1")               # one row per snapshot file
    spark.read.format("quire-journal").load("data/node1")                # one row per bookie journal entry
    spark.read.format("quire-entrylog").load("data/node1")               # one row per bookie entry-log entry
    spark.sql("SELECT epoch, count(*) FROM quire_zab GROUP BY epoch")    # after df.createOrReplaceTempView

The path is a comma-separated list of node data directories, each `DIR` (its name says the node
id: node1, n1, zk1, 1) or `DIR=ID`, as the verifiers take them (replay/spark_source.py
parse_dirs). Each file is one partition, read where the task runs with plain Python I/O (local
disks in local mode, a shared filesystem with a cluster master). The columns are the verifiers'
own (replay/spark_source.py for the Zab ones, replay/spark_ledger.py for the bookies'), decoded
by the same functions; `verify zab` and `verify ledgers` use the faster columnar reads of those
modules, these sources give the same rows to other jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from replay.spark_ledger import _ENTRY_SCHEMA, _bookie_task, bookie_files
from replay.spark_source import (_SEGMENT, _SNAPSHOT, _SNAPSHOT_SCHEMA, CHECKSUM_NAMES, _decode_task, _listed,
                                 _snapshot_task, parse_dirs)
from replay.verify_decode import DEFAULT_CHUNK_RECORDS, ORDER_NAMES, walk_segment
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR

ZAB_SCHEMA = ("node int, file string, offset bigint, zxid bigint, epoch bigint, counter bigint, prev_zxid bigint, "
              "session bigint, txn_type string, path string, checksum string, order string, hash_hi bigint, "
              "hash_lo bigint, data_len bigint, detail string")


class FilePartition(InputPartition):
    """One file of one node (the unit of work)."""

    def __init__(self, node: int, path: str, kind: str = "") -> None:
        super().__init__(path)
        self.node, self.path, self.kind = node, path, kind


def _nodes(options: dict[str, str]):  # noqa: ANN202 - list[NodeDir]
    spec = options.get("path") or options.get("dirs") or ""
    return parse_dirs([s.strip() for s in spec.split(",") if s.strip()])


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str], files: list[FilePartition], rows) -> None:  # noqa: ANN001
        self.options, self._files, self._rows = options, files, rows

    def partitions(self) -> list[InputPartition]:
        return list(self._files) or [FilePartition(0, "", "none")]

    def read(self, partition: FilePartition) -> Iterator[tuple]:
        if partition.kind == "none":
            return iter(())
        return self._rows(partition)


# -- quire-zab --------------------------------------------------------------------------------------

def _zab_rows(part: FilePartition) -> Iterator[tuple]:
    layout = walk_segment(Path(part.path).read_bytes(), DEFAULT_CHUNK_RECORDS)
    name = Path(part.path).name
    prev = layout.prev_zxid if layout.first_zxid is not None else None
    items = [(part.node, part.path, chunk, prev) for chunk in layout.chunks]
    for (_, _, offsets, statuses, zxids, prevs, sessions, data_lens, orders, types, paths, his, los, _,
         details) in _decode_task(items, False, True):
        for i, offset in enumerate(offsets):
            ok = statuses[i] == 0
            z = zxids[i] if ok else None
            yield (part.node, name, offset, z, None if z is None else z >> 32, None if z is None else z & 0xFFFFFFFF,
                   prevs[i] if ok and prevs[i] >= 0 else None, sessions[i] if ok else None,
                   types[i] if types is not None else None, paths[i] if paths is not None else None,
                   CHECKSUM_NAMES[statuses[i]], ORDER_NAMES[orders[i]] if ok else None,
                   his[i] if ok else None, los[i] if ok else None, data_lens[i] if ok else None, details.get(offset))
    if layout.stop_offset is not None:  # where the walk stopped (torn, or an impossible length)
        yield (part.node, name, layout.stop_offset, None, None, None, None, None, None, None, layout.stop_reason,
               None, None, None, None, layout.stop_detail)


class QuireZab(DataSource):
    """`quire-zab`: every record of every node's txn-log segments (replay/spark_source.py's
    `records` columns, without `raw`)."""

    @classmethod
    def name(cls) -> str:
        return "quire-zab"

    def schema(self) -> str:
        return ZAB_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        files = [FilePartition(n.node, p) for n in _nodes(self.options)
                 for _, p in _listed(Path(n.path) / TXNLOG_DIR, _SEGMENT)]
        return _Reader(self.options, files, _zab_rows)


# -- quire-snapshot -----------------------------------------------------------------------------------

def _snapshot_rows(part: FilePartition) -> Iterator[tuple]:
    yield _snapshot_task((part.node, part.path, int(part.kind, 16)))


class QuireSnapshot(DataSource):
    """`quire-snapshot`: each snapshot file checked and restored (status, zxid, digest, error)."""

    @classmethod
    def name(cls) -> str:
        return "quire-snapshot"

    def schema(self) -> str:
        return _SNAPSHOT_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        files = [FilePartition(n.node, p, f"{z:x}") for n in _nodes(self.options)
                 for z, p in _listed(Path(n.path) / SNAPSHOT_DIR, _SNAPSHOT)]
        return _Reader(self.options, files, _snapshot_rows)


# -- quire-journal, quire-entrylog ---------------------------------------------------------------------

def _entry_rows(part: FilePartition) -> Iterator[tuple]:
    rows, _, _ = _bookie_task((part.node, part.kind, part.path))
    yield from rows


class _BookieFiles(DataSource):
    KIND = ""

    def schema(self) -> str:
        return _ENTRY_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        files = [FilePartition(b, p, kind) for b, kind, p in bookie_files(_nodes(self.options)) if kind == self.KIND]
        return _Reader(self.options, files, _entry_rows)


class QuireJournal(_BookieFiles):
    """`quire-journal`: every entry in the bookies' journals."""

    KIND = "journal"

    @classmethod
    def name(cls) -> str:
        return "quire-journal"


class QuireEntryLog(_BookieFiles):
    """`quire-entrylog`: every entry in the bookies' entry logs."""

    KIND = "entrylogs"

    @classmethod
    def name(cls) -> str:
        return "quire-entrylog"


SOURCES = (QuireZab, QuireSnapshot, QuireJournal, QuireEntryLog)


def register(spark: SparkSession) -> None:
    """Make the four formats known to `spark` (build_session does it for the verifiers)."""
    for source in SOURCES:
        spark.dataSource.register(source)
