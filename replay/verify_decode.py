"""Per-file decoding for the verifiers: pure functions from a file's bytes to columns.

The Spark verifiers (replay/spark_source.py) read files and hand their bytes to
these functions inside Spark tasks; the plain scan of bench/verify_scan.py calls
the same ones. Every byte is parsed by the project's own decoders: record
framing and CRC by zab.storage.record, segment headers by zab.storage.txnlog, snapshot files by
zab.storage.snapshot, metastore transactions by metastore.wire.txn_codec, snapshot states by the
state machines' own restore. Nothing here reads a file.

A segment is decoded in two steps so that one big file can feed several Spark
tasks: `walk_segment` follows the record lengths (no CRC) and cuts the file into
chunks of at most `chunk_records` records; `decode_chunk` then decodes one
chunk's records fully (CRC, zxid order, transaction type and path, a digest of
the body).
"""

from __future__ import annotations

import array
import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from metastore.errors import DecodeError
from metastore.core.txn import CloseSession, Create, CreateSession, Delete, Error, Multi, SetACL, SetData
from metastore.wire.txn_codec import decode_txn
from zab.core import zxid as Z
from edge.zero_fill import is_zero_fill
from zab.storage.record import RECORD_HEADER_BYTES, checked_length, decode_record
from zab.storage.storage_errors import CorruptRecordError, RecordError, TornRecordError
from zab.storage.txnlog import SEGMENT_HEADER_BYTES, UNKNOWN_PREV_ZXID, decode_segment_header

# Checksum status of a record (the `checksum` column).
CHECKSUM_OK, CHECKSUM_CORRUPT, CHECKSUM_TORN = "ok", "corrupt", "torn"
# Order status of a record against its predecessor in the same log (the `order` column).
ORDER_OK = "ok"
ORDER_BACKWARDS = "epoch_backwards"        # a lower epoch than the record before it
ORDER_NOT_INCREASING = "not_increasing"    # same epoch, counter not above the one before
ORDER_GAP = "gap"                          # same epoch, counter skips values
ORDER_BAD_EPOCH_START = "bad_epoch_start"  # a new epoch whose first counter is not 1
ORDER_UNKNOWN = "unknown"                  # predecessor unknown (log base unknown, or after a corrupt record)
# The order column travels to Spark as an index into this tuple (a number pickles cheaper than a string).
ORDER_NAMES = (ORDER_OK, ORDER_BACKWARDS, ORDER_NOT_INCREASING, ORDER_GAP, ORDER_BAD_EPOCH_START, ORDER_UNKNOWN)
_ORDER_CODE = {name: code for code, name in enumerate(ORDER_NAMES)}
HASH_BYTES = 16
# The body digest travels as its two big-endian signed 64-bit halves: Spark aggregates
# longs in its hash aggregation, while binary min/max would force a sort.
_HALVES = struct.Struct(">qq")  # into array("l") columns: 64-bit on the platforms Spark runs on
DEFAULT_CHUNK_RECORDS = 65536

_TYPE_NAMES = {Create: "create", Delete: "delete", SetData: "setData", SetACL: "setACL",
               CreateSession: "createSession", CloseSession: "closeSession", Multi: "multi", Error: "error"}


class VerifyInputError(ValueError):
    """A path given to a verifier cannot be used (not a data directory, ambiguous node id)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Records [start, end) of a segment; `prev_offset` is the record just before (-1: none)."""

    start: int
    end: int
    count: int
    prev_offset: int


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """What walking a segment's lengths found.

    `first_zxid`/`prev_zxid` are None when the header is invalid. `stop_offset`
    is where the walk could not go on (a torn or impossible length), with
    `stop_reason` "torn" or "corrupt"; None when the file ended at a record boundary.
    """

    size: int
    first_zxid: int | None
    prev_zxid: int | None
    chunks: tuple[Chunk, ...]
    records: int
    stop_offset: int | None
    stop_reason: str | None
    stop_detail: str


def walk_segment(buf: bytes | memoryview, chunk_records: int = DEFAULT_CHUNK_RECORDS) -> SegmentLayout:
    """Cut a segment file's bytes into chunks by following record lengths (no CRC yet)."""
    view = memoryview(buf)
    header = decode_segment_header(view)
    first, prev = header if header is not None else (None, None)
    chunks: list[Chunk] = []
    pos = min(SEGMENT_HEADER_BYTES, len(view))
    start, count, before, last = pos, 0, -1, -1
    stop = (None, None, "")
    while pos < len(view):
        try:
            # The framing rule of zab.storage.record.decode_record itself (lengths only): one parser.
            length = checked_length(view, pos)
        except RecordError as err:
            if not is_zero_fill(view[pos:]):  # zero fill: the newest segment's preallocated clean end
                stop = (pos, str(err.reason), str(err))
            break
        if count == chunk_records:
            chunks.append(Chunk(start, pos, count, before))
            start, count, before = pos, 0, last
        last = pos
        count += 1
        pos += RECORD_HEADER_BYTES + length
    if count:
        chunks.append(Chunk(start, pos, count, before))
    total = sum(c.count for c in chunks)
    return SegmentLayout(len(view), first, prev, tuple(chunks), total, *stop)


@dataclass
class ChunkColumns:
    """Decoded records of one chunk, column by column (what one Spark row carries).

    Valid records fill the `offsets` .. `data_lens` columns; records whose CRC fails
    go to `bad_offsets` / `bad_reasons` (their zxid cannot be trusted). Numeric
    columns are signed 64-bit arrays: Spark's bigint (zxids and session ids of 2**63
    and above wrap; epochs that large do not occur).
    """

    offsets: array.array
    zxids: array.array
    prevs: array.array
    sessions: array.array
    data_lens: array.array
    orders: array.array  # codes: ORDER_NAMES[code]
    types: list[str | None] | None  # None when decoded without with_txn
    paths: list[str | None] | None
    hash_hi: array.array  # the body's 128-bit BLAKE2b digest, high and low signed halves
    hash_lo: array.array
    raws: list[bytes] | None
    bad_offsets: array.array
    bad_reasons: list[str]
    bad_details: list[str]


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def classify_order(prev: int | None, zxid: int) -> str:
    """The `order` column: may `zxid` directly follow `prev` in one log (zab.core.zxid.follows)?"""
    if prev is None or prev == UNKNOWN_PREV_ZXID:
        return ORDER_UNKNOWN
    if Z.follows(prev, zxid):
        return ORDER_OK
    if Z.epoch_of(zxid) < Z.epoch_of(prev):
        return ORDER_BACKWARDS
    if Z.epoch_of(zxid) == Z.epoch_of(prev):
        return ORDER_NOT_INCREASING if zxid <= prev else ORDER_GAP
    return ORDER_BAD_EPOCH_START


def txn_type_and_path(data: bytes) -> tuple[str | None, str | None]:
    """A metastore transaction's type and path; (None, None) if `data` is not one (KV, damage)."""
    try:
        body = decode_txn(data).body
    except DecodeError:
        return None, None
    path = getattr(body, "path", None)
    if isinstance(body, Multi):
        path = next((op.path for op in body.ops if hasattr(op, "path")), None)
    return _TYPE_NAMES[type(body)], path


def _empty_columns(with_raw: bool, with_txn: bool) -> ChunkColumns:
    return ChunkColumns(array.array("l"), array.array("l"), array.array("l"), array.array("l"),
                        array.array("l"), array.array("l"), [] if with_txn else None, [] if with_txn else None,
                        array.array("l"), array.array("l"), [] if with_raw else None, array.array("l"), [], [])


def iter_chunk(view: memoryview, base: int, end: int) -> Iterator[tuple[int, int, object]]:
    """(file offset, body length, Txn or RecordError) for each record of [base, end) of the file.

    `view` holds the file's bytes from offset `base`. A corrupt record (CRC) is
    yielded as its error and skipped by its length, as txnlog's tail rule does.
    """
    pos, limit = 0, end - base
    while pos < limit:
        try:
            txn, nxt = decode_record(view, pos)
        except CorruptRecordError as err:
            try:
                length = checked_length(view, pos)
            except RecordError:  # an impossible length: nothing after it can be found
                yield base + pos, 0, err
                return
            yield base + pos, length, err
            pos += RECORD_HEADER_BYTES + length
            continue
        except TornRecordError as err:
            yield base + pos, 0, err
            return
        yield base + pos, nxt - pos - RECORD_HEADER_BYTES, txn
        pos = nxt


def decode_chunk(view: memoryview, base: int, end: int, prev_zxid: int | None, *,
                 with_raw: bool = False, with_txn: bool = True) -> ChunkColumns:
    """Decode the records of one chunk; `prev_zxid` is the zxid of the record before it.

    `with_txn` decodes each record's data as a metastore transaction (type, path);
    the verifier's checks do not need them (Replay decodes every txn anyway), so it
    leaves them out; `with_raw` keeps each record's body bytes.
    """
    cols = _empty_columns(with_raw, with_txn)
    prev = prev_zxid
    after_bad = False
    for offset, length, item in iter_chunk(view, base, end):
        if isinstance(item, RecordError):
            cols.bad_offsets.append(offset)
            cols.bad_reasons.append(str(item.reason))
            cols.bad_details.append(str(item))
            after_bad = True
            continue
        body = view[offset - base + RECORD_HEADER_BYTES: offset - base + RECORD_HEADER_BYTES + length]
        cols.offsets.append(offset)
        cols.zxids.append(_signed(item.zxid))
        cols.prevs.append(-1 if prev is None or prev == UNKNOWN_PREV_ZXID else _signed(prev))
        cols.sessions.append(_signed(item.session_id))
        cols.data_lens.append(len(item.data))
        cols.orders.append(_ORDER_CODE[ORDER_UNKNOWN if after_bad else classify_order(prev, item.zxid)])
        if cols.types is not None:
            kind, path = txn_type_and_path(item.data)
            cols.types.append(kind)
            cols.paths.append(path)
        hi, lo = _HALVES.unpack(hashlib.blake2b(body, digest_size=HASH_BYTES).digest())
        cols.hash_hi.append(hi)
        cols.hash_lo.append(lo)
        if cols.raws is not None:
            cols.raws.append(bytes(body))
        prev, after_bad = item.zxid, False
    return cols


def zxid_before(view: memoryview, offset: int) -> int | None:
    """The zxid of the record at `offset` of `view` (a chunk's predecessor); None if it is damaged."""
    try:
        txn, _ = decode_record(view, offset)
    except RecordError:
        return None
    return txn.zxid
