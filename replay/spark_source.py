"""Spark DataFrames over Zab data directories: one row per log record, per segment, per snapshot.

    records    node, file, offset, zxid, epoch, counter, prev_zxid, session, txn_type, path,
               checksum, order, hash_hi, hash_lo, data_len, raw, detail
    segments   node, file, first_zxid, prev_zxid, header_ok, records, size, stop_offset,
               stop_reason, newest
    snapshots  node, file, name_zxid, zxid, status, digest, error

Work is split by file, and big segments by chunks of records, so it spreads over
every core (or executor): a first Spark stage walks each segment's record lengths
and cuts it into chunks; a second decodes each chunk (CRC, order, metastore
transaction type and path, a 128-bit BLAKE2b digest of the record body, as the
signed halves `hash_hi`, `hash_lo`); a third checks and restores each snapshot, reading
it in 1 MiB pieces (zab.storage.snapshot.read_body) and rebuilding the tree as they come,
never the file whole. Tasks read files with plain Python I/O, so every path must be
readable where the tasks run (local disks in local mode, a shared filesystem with a cluster
master).

Column meanings: `checksum` is "ok", "corrupt" (CRC mismatch: zxid and the
columns after it are null) or "torn" (the walk stopped: the bytes end mid-record
or hold an impossible length); `order` compares the record with the one before
it in the same log (replay.verify_decode.classify_order); `prev_zxid` is that
record's zxid (for a segment's first record, the header's prev_zxid; null when
unknown); `session` is the record's session id field (the Zab record's);
`txn_type`/`path` are null unless the data decodes as a
metastore transaction; `raw` (the record body) is null unless asked for.
"""

from __future__ import annotations

import array
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replay.verify_decode import (CHECKSUM_CORRUPT, CHECKSUM_OK, CHECKSUM_TORN, DEFAULT_CHUNK_RECORDS, ORDER_NAMES,
                                  Chunk, SegmentLayout, VerifyInputError, decode_chunk, walk_segment, zxid_before)
from replay.verify_replay import check_snapshot
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR
from zab.storage.snapshot import read_body

_SEGMENT = re.compile(r"log\.([0-9a-f]{16})")
_SNAPSHOT = re.compile(r"snapshot\.([0-9a-f]{16})")
_NODE_NAME = re.compile(r"(?:node|n|zk|server)?[-_]?(\d+)")

# One row per decoded chunk: a column per record field, valid and damaged records alike
# (`statuses` codes CHECKSUM_NAMES; a damaged record's zxid .. hash fields are 0 and
# its message is in `details`, keyed by offset). Arrays pickle and convert far cheaper
# than a row per record; the records are exploded once, into the cached `flat` frame.
_CHUNK_SCHEMA = ("node int, file string, offsets array<bigint>, statuses array<int>, zxids array<bigint>, "
                 "prevs array<bigint>, sessions array<bigint>, data_lens array<bigint>, orders array<int>, "
                 "types array<string>, paths array<string>, hash_his array<bigint>, hash_los array<bigint>, "
                 "raws array<binary>, details map<bigint,string>")
_SEGMENT_SCHEMA = ("node int, file string, first_zxid bigint, prev_zxid bigint, header_ok boolean, records bigint, "
                   "size bigint, stop_offset bigint, stop_reason string, stop_detail string, newest boolean")
_SNAPSHOT_SCHEMA = "node int, file string, name_zxid bigint, zxid bigint, status string, digest string, error string"


@dataclass(frozen=True, slots=True)
class NodeDir:
    """A node's data directory and its id."""

    node: int
    path: str


def parse_dirs(specs: list[str]) -> list[NodeDir]:
    """`DIR` (its name says the id: node1, n1, zk1, 1) or `DIR=ID`, one per node.

    Raises VerifyInputError for a path that is not a data directory, an id that
    cannot be told, or an id given twice.
    """
    nodes: list[NodeDir] = []
    for spec in specs:
        path, sep, ident = spec.rpartition("=") if "=" in spec else (spec, "", "")
        if sep and not ident.isdigit():
            raise VerifyInputError(f"{spec!r}: the node id after '=' must be a number (DIR=ID)")
        if not sep:
            match = _NODE_NAME.fullmatch(Path(path).name)
            if match is None:
                raise VerifyInputError(f"cannot tell the node id of {path!r} from its name: pass it as {path}=ID")
            ident = match.group(1)
        if not (Path(path) / TXNLOG_DIR).is_dir() and not (Path(path) / SNAPSHOT_DIR).is_dir():
            raise VerifyInputError(f"{path!r} is not a node data directory: it has neither {TXNLOG_DIR}/ "
                                   f"nor {SNAPSHOT_DIR}/ (docs/operations.md, 'Data directory')")
        nodes.append(NodeDir(int(ident), str(Path(path).resolve())))
    ids = [n.node for n in nodes]
    if len(set(ids)) != len(ids):
        raise VerifyInputError(f"node ids given twice: {sorted(i for i in set(ids) if ids.count(i) > 1)}; "
                               "name them explicitly with DIR=ID")
    if not nodes:
        raise VerifyInputError("no data directory given")
    return nodes


def _listed(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1), 16), e.path) for e in os.scandir(directory) if (m := pattern.fullmatch(e.name))]
    return sorted(found)


@dataclass(frozen=True, slots=True)
class SegmentFile:
    node: int
    path: str
    newest: bool
    layout: SegmentLayout | None = None


@dataclass
class ZabFrames:
    """What read_zab returns: the three DataFrames and the segments' layouts (small, on the driver)."""

    nodes: list[NodeDir]
    segments: list[SegmentFile]
    records: DataFrame
    segments_df: DataFrame
    snapshots: DataFrame
    valid: DataFrame  # the records whose checksum is "ok" (records' columns)
    flat: DataFrame  # cached: one compact row per record, under `records` and `valid`; unpersist when done

    def unpersist(self) -> None:
        self.flat.unpersist()
        self.snapshots.unpersist()


# -- Spark tasks (module-level so that workers import them by name) ------------------------

def _walk_task(item: SegmentFile, chunk_records: int) -> SegmentFile:
    return replace(item, layout=walk_segment(Path(item.path).read_bytes(), chunk_records))


CHECKSUM_NAMES = (CHECKSUM_OK, CHECKSUM_CORRUPT, CHECKSUM_TORN)  # the `statuses` codes


def _decode_task(items, with_raw: bool, with_txn: bool):  # noqa: ANN001, ANN202 - a Spark partition iterator
    for node, path, chunk, prev_zxid in items:
        with open(path, "rb") as file:
            if chunk.prev_offset >= 0:
                file.seek(chunk.prev_offset)
                prev_zxid = zxid_before(memoryview(file.read(chunk.start - chunk.prev_offset)), 0)
            file.seek(chunk.start)
            view = memoryview(file.read(chunk.end - chunk.start))
        c = decode_chunk(view, chunk.start, chunk.end, prev_zxid, with_raw=with_raw, with_txn=with_txn)
        bad = len(c.bad_offsets)
        zeros = array.array("l", bytes(8 * bad))  # a damaged record's fields: null in the views (_records_view)
        statuses = array.array("l", [0] * len(c.zxids) + [CHECKSUM_NAMES.index(r) for r in c.bad_reasons])
        nones = [None] * bad
        yield (node, Path(path).name, c.offsets + c.bad_offsets, statuses, c.zxids + zeros, c.prevs + zeros,
               c.sessions + zeros, c.data_lens + zeros, c.orders + zeros,
               c.types + nones if c.types is not None else None, c.paths + nones if c.paths is not None else None,
               c.hash_hi + zeros, c.hash_lo + zeros, c.raws + nones if c.raws is not None else None,
               dict(zip(c.bad_offsets, c.bad_details)))


def _snapshot_task(item: tuple[int, str, int]) -> tuple:
    node, path, name_zxid = item
    info = check_snapshot(read_body(Path(path)), name_zxid, path)  # in 1 MiB pieces, never whole
    return (node, Path(path).name, name_zxid, info.zxid, info.status, info.digest, info.error)


# -- the reader ------------------------------------------------------------------------------

def read_zab(spark: SparkSession, nodes: list[NodeDir], *,
             chunk_records: int = DEFAULT_CHUNK_RECORDS, with_raw: bool = False, with_txn: bool = True) -> ZabFrames:
    """Read every segment and snapshot of `nodes` into DataFrames (decoded chunks are cached).

    Without `with_txn` the txn_type and path columns stay null (the verifier's checks do not
    use them, and decoding them is most of the per-record cost).
    """
    sc = spark.sparkContext
    files = []
    for n in nodes:
        paths = [p for _, p in _listed(Path(n.path) / TXNLOG_DIR, _SEGMENT)]
        files += [SegmentFile(n.node, p, i == len(paths) - 1) for i, p in enumerate(paths)]
    segments = sc.parallelize(files, max(1, len(files))).map(
        lambda f, k=chunk_records: _walk_task(f, k)).collect() if files else []
    tasks = [(s.node, s.path, chunk, s.layout.prev_zxid if s.layout.first_zxid is not None else None)
             for s in segments for chunk in s.layout.chunks]
    chunks = spark.createDataFrame(
        sc.parallelize(tasks, max(1, len(tasks))).mapPartitions(
            lambda it, r=with_raw, t=with_txn: _decode_task(it, r, t)),
        _CHUNK_SCHEMA, verifySchema=False)
    # Exploded once and cached in Spark's compressed columnar form: every check's pass is
    # then a scan of compact columns (codes and numbers; the strings are made per pass).
    flat = _flat(chunks, with_raw, with_txn).persist()
    valid = _records_view(flat.where(F.col("status") == 0))
    records = _records_view(flat).unionByName(_walk_stops(spark, segments))
    snaps = [(n.node, p, z) for n in nodes for z, p in _listed(Path(n.path) / SNAPSHOT_DIR, _SNAPSHOT)]
    snapshots = spark.createDataFrame(
        sc.parallelize(snaps, max(1, len(snaps))).map(_snapshot_task),
        _SNAPSHOT_SCHEMA, verifySchema=False).persist()
    return ZabFrames(nodes, segments, records, _segments_frame(spark, segments), snapshots, valid, flat)


def _flat(chunks: DataFrame, with_raw: bool, with_txn: bool) -> DataFrame:
    """One compact row per record: posexplode one array and index the others by position
    (no struct per record: arrays_zip would copy every array into structs first)."""
    exploded = chunks.select("*", F.posexplode("offsets").alias("i", "offset"))

    def at(column: str):  # noqa: ANN202 - a Column
        return F.col(column)[F.col("i")]
    return exploded.select(
        "node", "file", "offset", at("statuses").alias("status"), at("zxids").alias("zxid"), at("prevs").alias("prev"),
        at("sessions").alias("session"), at("data_lens").alias("data_len"), at("orders").alias("order_code"),
        (at("types") if with_txn else F.lit(None).cast("string")).alias("txn_type"),
        (at("paths") if with_txn else F.lit(None).cast("string")).alias("path"),
        at("hash_his").alias("hash_hi"), at("hash_los").alias("hash_lo"),
        (at("raws") if with_raw else F.lit(None).cast("binary")).alias("raw"),
        F.element_at("details", F.col("offset")).alias("detail"))


def _records_view(flat: DataFrame) -> DataFrame:
    """The `records` columns over `flat`: a damaged record's zxid and later fields are null."""
    ok = F.col("status") == 0

    def valid(column: str):  # noqa: ANN202 - a Column
        return F.when(ok, F.col(column))
    zxid = valid("zxid")
    orders = F.array(*[F.lit(name) for name in ORDER_NAMES])
    statuses = F.array(*[F.lit(name) for name in CHECKSUM_NAMES])
    return flat.select(
        "node", "file", "offset", zxid.alias("zxid"), F.shiftright(zxid, 32).alias("epoch"),
        zxid.bitwiseAND(F.lit(0xFFFFFFFF)).alias("counter"),
        F.when(ok & (F.col("prev") >= 0), F.col("prev")).alias("prev_zxid"), valid("session").alias("session"),
        "txn_type", "path", F.element_at(statuses, F.col("status") + 1).alias("checksum"),
        F.when(ok, F.element_at(orders, F.col("order_code") + 1)).alias("order"),
        valid("hash_hi").alias("hash_hi"), valid("hash_lo").alias("hash_lo"), valid("data_len").alias("data_len"),
        "raw", "detail")


def _walk_stops(spark: SparkSession, segments: list[SegmentFile]) -> DataFrame:
    """Rows for the places where a walk stopped (torn or impossible length): zxid unknown."""
    rows = [(s.node, Path(s.path).name, s.layout.stop_offset, s.layout.stop_reason, s.layout.stop_detail)
            for s in segments if s.layout.stop_offset is not None]
    frame = spark.createDataFrame(rows, "node int, file string, offset bigint, checksum string, detail string")
    return frame.unionByName(_records_placeholder(spark), allowMissingColumns=True).where("offset is not null")


def _records_placeholder(spark: SparkSession) -> DataFrame:
    # An empty frame with every records column, so the union has all of them typed.
    return spark.createDataFrame([], "node int, file string, offset bigint, zxid bigint, epoch bigint, counter bigint, "
                                     "prev_zxid bigint, session bigint, txn_type string, path string, checksum string, "
                                     "order string, hash_hi bigint, hash_lo bigint, data_len bigint, raw binary, "
                                     "detail string")


def _segments_frame(spark: SparkSession, segments: list[SegmentFile]) -> DataFrame:
    rows = []
    for s in segments:
        lay = s.layout
        rows.append((s.node, Path(s.path).name, lay.first_zxid, lay.prev_zxid if lay.prev_zxid is None or
                     lay.prev_zxid < 1 << 63 else -1, lay.first_zxid is not None, lay.records, lay.size,
                     lay.stop_offset, lay.stop_reason, lay.stop_detail or None, s.newest))
    return spark.createDataFrame(rows, _SEGMENT_SCHEMA)


__all__ = ["NodeDir", "SegmentFile", "ZabFrames", "parse_dirs", "read_zab", "Chunk"]
