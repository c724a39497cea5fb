"""The on-disk txn log record codec (pure: no I/O).

Layout of one record, all integers big-endian (network order, as ZooKeeper's
jute and Java's DataOutput, so JVM readers such as the Spark verifier need no
byte swapping):

    offset  size  field
    0       4     body_length   u32, length of the body in bytes (24 .. MAX_RECORD_BYTES)
    4       4     body_crc      u32, CRC-32C (Castagnoli) of the body bytes
    8       8     zxid          u64  \
    16      8     session_id    u64   | the body: body_length bytes
    24      8     cxid          u64   |
    32      n     data          n = body_length - 24 bytes, opaque
                                     /

A record whose header is all zero bytes is never a record: it is what
preallocation or a write that never reached the disk leaves behind, and it is
reported as TORN like a record cut short; a scan that finds nothing but zero
bytes from a record boundary to the end reports a clean end (`zero_fill`), the
end of the newest, preallocated segment. See docs/formats.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c

from zab.storage.storage_errors import (
    CorruptRecordError,
    RecordError,
    RecordReason,
    TornRecordError,
)
from edge.zero_fill import is_zero_fill
from zab.core.txn import Txn

_HEADER = struct.Struct(">II")
_BODY_FIXED = struct.Struct(">QQQ")
_ZXID = struct.Struct(">Q")    # the body's first field
_LENGTH = struct.Struct(">I")  # the header's first field

RECORD_HEADER_BYTES = _HEADER.size  # 8
BODY_FIXED_BYTES = _BODY_FIXED.size  # 24
MAX_DATA_BYTES = 16 * 1024 * 1024
# The largest body_length we write or accept. A bigger length on disk can only
# be damage, and bounding it keeps a damaged length from making us allocate or
# wait for gigabytes.
MAX_RECORD_BYTES = BODY_FIXED_BYTES + MAX_DATA_BYTES
_U64_MAX = (1 << 64) - 1

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What scan_records found.

    `txns[i]` (its zxid, from scan_zxids) starts at byte `offsets[i]`; `valid_end` is
    the offset just past the last whole valid record (where a damaged tail is cut).
    `stop` is None when the buffer ended exactly at a record boundary or only zero
    bytes follow it (`zero_fill`: the clean end of a preallocated segment), else the
    reason the scan stopped at `valid_end`; `detail` describes it for logs.
    """

    txns: list[Txn]  # or list[int]: scan_zxids
    offsets: list[int]
    valid_end: int
    stop: RecordReason | None
    detail: str = field(default="")
    zero_fill: bool = False


def encoded_size(data_len: int) -> int:
    """Bytes one record takes on disk for a txn carrying `data_len` data bytes."""
    return RECORD_HEADER_BYTES + BODY_FIXED_BYTES + data_len


def encode_record(txn: Txn) -> bytes:
    """Encode one txn as a record.

    Raises ValueError when a field does not fit a u64 or the data exceeds
    MAX_DATA_BYTES: the leader must reject such a request before it becomes a txn.
    """
    for name in ("zxid", "session_id", "cxid"):
        value = getattr(txn, name)
        if not 0 <= value <= _U64_MAX:
            raise ValueError(f"txn {name}={value} does not fit an unsigned 64-bit field")
    if len(txn.data) > MAX_DATA_BYTES:
        raise ValueError(f"txn data of {len(txn.data)} bytes exceeds MAX_DATA_BYTES={MAX_DATA_BYTES}")
    body = _BODY_FIXED.pack(txn.zxid, txn.session_id, txn.cxid) + bytes(txn.data)
    return _HEADER.pack(len(body), crc32c(body)) + body


def decode_record(buf: Buffer, offset: int = 0) -> tuple[Txn, int]:
    """Decode the record starting at `offset`; return it and the offset just past it.

    Raises TornRecordError when `buf` ends before the record does (or the header
    is zero-filled) and CorruptRecordError on an impossible length or a checksum
    mismatch; both are RecordError with `.reason` and `.offset`.
    """
    body, end = _checked_body(buf, offset)
    zxid, session_id, cxid = _BODY_FIXED.unpack_from(body)
    txn = Txn(zxid=zxid, session_id=session_id, cxid=cxid, data=bytes(body[BODY_FIXED_BYTES:]))
    return txn, end


def record_zxid(buf: Buffer, offset: int = 0) -> tuple[int, int]:
    """decode_record's checks (framing and checksum) and the record's zxid, without a Txn or a
    copy of its data: what opening a log needs of the records it will not replay."""
    body, end = _checked_body(buf, offset)
    return _ZXID.unpack_from(body)[0], end


def _checked_body(buf: Buffer, offset: int) -> tuple[memoryview, int]:
    if not 0 <= offset <= len(buf):
        raise ValueError(f"offset {offset} outside buffer of {len(buf)} bytes")
    view = memoryview(buf)
    length = checked_length(view, offset)
    body_start = offset + RECORD_HEADER_BYTES
    body = view[body_start : body_start + length]
    (expected_crc,) = struct.unpack_from(">I", view, offset + 4)
    if crc32c(body) != expected_crc:
        raise CorruptRecordError(f"record at offset {offset}: body checksum mismatch", offset=offset)
    return body, body_start + length


def offset_after(buf: Buffer, offset: int, zxid: int) -> int:
    """The offset of the first record after `offset` whose zxid is above `zxid` (or the end of
    the last whole record), walking records by their lengths alone: for records checked already
    (TxnLog.open did), so that reading a log's tail does not decode its head again."""
    view = memoryview(buf)
    while len(view) - offset >= RECORD_HEADER_BYTES + BODY_FIXED_BYTES:
        (length,) = _LENGTH.unpack_from(view, offset)
        if not BODY_FIXED_BYTES <= length <= len(view) - offset - RECORD_HEADER_BYTES:
            break  # not a whole record: the caller's own scan reports it
        if _ZXID.unpack_from(view, offset + RECORD_HEADER_BYTES)[0] > zxid:
            break
        offset += RECORD_HEADER_BYTES + length
    return offset


def checked_length(view: memoryview, offset: int) -> int:
    """The body length of the record at `offset`, once it is known to be plausible and present.

    The framing rule of decode_record without the checksum (the verifiers walk record
    lengths with it); raises TornRecordError or CorruptRecordError as decode_record does.
    """
    available = len(view) - offset
    if available < RECORD_HEADER_BYTES:
        raise TornRecordError(f"record at offset {offset}: only {available} of 8 header bytes", offset=offset)
    length, crc = _HEADER.unpack_from(view, offset)
    if length == 0 and crc == 0:
        # Zero fill: space the filesystem allocated but our write never filled.
        raise TornRecordError(f"record at offset {offset}: zero-filled header", offset=offset)
    if not BODY_FIXED_BYTES <= length <= MAX_RECORD_BYTES:
        raise CorruptRecordError(
            f"record at offset {offset}: impossible body length {length}", offset=offset
        )
    if available - RECORD_HEADER_BYTES < length:
        raise TornRecordError(
            f"record at offset {offset}: body of {length} bytes but only "
            f"{available - RECORD_HEADER_BYTES} present",
            offset=offset,
        )
    return length


def scan_records(buf: Buffer, offset: int = 0) -> ScanResult:
    """Decode whole valid records from `offset` on, stopping at the first bad one.

    Never raises for any content of `buf` (ValueError only for an offset outside
    it); each step consumes at least one whole header, so it always terminates.
    """
    return ScanResult(*_scan(buf, offset, decode_record))


def scan_zxids(buf: Buffer, offset: int = 0) -> ScanResult:
    """scan_records' checks, with each record's zxid in `txns`' place (record_zxid): no Txn and
    no copy of any record's data."""
    return ScanResult(*_scan(buf, offset, record_zxid))


def _scan(buf: Buffer, offset: int, step: Callable[[Buffer, int], tuple[Any, int]]) -> tuple:
    view = memoryview(buf)
    if not 0 <= offset <= len(view):
        raise ValueError(f"offset {offset} outside buffer of {len(view)} bytes")
    found: list = []
    offsets: list[int] = []
    pos = offset
    while pos < len(view):
        try:
            item, nxt = step(view, pos)
        except RecordError as err:
            if is_zero_fill(view[pos:]):
                return found, offsets, pos, None, "", True
            return found, offsets, pos, err.reason, str(err), False
        found.append(item)
        offsets.append(pos)
        pos = nxt
    return found, offsets, pos, None, "", False


def valid_record_follows(buf: Buffer, offset: int) -> bool:
    """Whether the record after a corrupt one at `offset` (skipped by its length) decodes.

    A torn write damages the end of a log; a checksum failure with an intact record
    behind it is damage inside history that truncation would destroy. The txn log's
    open() and the simulator's disk decide by this one rule.
    """
    if len(buf) - offset < RECORD_HEADER_BYTES:
        return False
    (length,) = struct.unpack_from(">I", buf, offset)
    try:
        decode_record(buf, offset + RECORD_HEADER_BYTES + length)
    except (RecordError, ValueError):
        return False
    return True
