"""Byte layouts of the bookie's journal and entry log files (pure: no I/O).

All integers big-endian, CRC-32C as in docs/formats.md; the full description
with the recovery rules is docs/bookie_storage.md.

Journal segment `journal/journal.<seq as 16 hex>`: a 20-byte header
(magic b"QBJL", u32 version 1, u64 seq, u32 CRC-32C of the 16 bytes before),
then records:

    u32 body_length   9 .. MAX_JOURNAL_BODY
    u32 body_crc      CRC-32C of the body
    body: u8 kind, u64 ledger_id, then by kind:
        ADD    u64 entry_id, the packaged entry (rest of the body)
        KEY    32-byte master key the ledger is bound to
        FENCE  nothing
        LAC    i64 explicit LAC
        DELETE nothing

Entry log `entrylogs/entrylog.<log id as 16 hex>`: a 20-byte header (magic
b"QBEL", u32 version 1, u64 log id, u32 CRC-32C), then records:

    u32 data_length   1 .. MAX_ENTRY_BYTES_LIMIT
    u32 crc           CRC-32C of bytes 8 .. 24+data_length (ids and data)
    u64 ledger_id
    u64 entry_id
    data              the packaged entry

Decoders raise TornRecord (the bytes end first, or a zero-filled header:
what a crash leaves) or CorruptRecord (impossible length, checksum mismatch,
unknown kind); both are StorageError. They never allocate from a length
before checking it against the bytes present.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from crc32c import crc32c

from bookie.errors import StorageError
from bookie.storage_config import MASTER_KEY_BYTES, MAX_ENTRY_BYTES_LIMIT
from edge.zero_fill import is_zero_fill

Buffer = bytes | bytearray | memoryview

FILE_HEADER = struct.Struct(">4sIQI")
FILE_HEADER_BYTES = FILE_HEADER.size  # 20
JOURNAL_MAGIC = b"QBJL"
ENTRY_LOG_MAGIC = b"QBEL"
VERSION = 1

_FRAME = struct.Struct(">II")
FRAME_BYTES = _FRAME.size  # 8
_BODY_HEAD = struct.Struct(">BQ")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
MAX_JOURNAL_BODY = _BODY_HEAD.size + 8 + MAX_ENTRY_BYTES_LIMIT

_ENTRY_HEAD = struct.Struct(">IIQQ")
ENTRY_RECORD_HEADER_BYTES = _ENTRY_HEAD.size  # 24


class TornRecord(StorageError):
    """The bytes end before the record does (or its header is zero fill): a write that never completed."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class CorruptRecord(StorageError):
    """The record's bytes are present but wrong: impossible length, checksum mismatch, unknown kind."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class Kind(enum.IntEnum):
    ADD = 1
    KEY = 2
    FENCE = 3
    LAC = 4
    DELETE = 5


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One journal record. `value` is the entry id (ADD) or the explicit LAC (LAC); `data` the
    packaged entry (ADD) or the master key (KEY)."""

    kind: Kind
    ledger_id: int
    value: int = 0
    data: bytes = b""


# --- file headers -------------------------------------------------------------------


def encode_file_header(magic: bytes, number: int) -> bytes:
    head = FILE_HEADER.pack(magic, VERSION, number, 0)[:-4]
    return head + struct.pack(">I", crc32c(head))


def decode_file_header(buf: Buffer, magic: bytes) -> int | None:
    """The segment seq / log id in a file header, or None if it is torn or invalid."""
    if len(buf) < FILE_HEADER_BYTES:
        return None
    found, version, number, crc = FILE_HEADER.unpack_from(buf)
    if crc32c(memoryview(buf)[: FILE_HEADER_BYTES - 4]) != crc or found != magic or version != VERSION:
        return None
    return number


# --- journal records ----------------------------------------------------------------


def encode_journal_record(record: JournalRecord) -> bytes:
    """Frame one record. Raises ValueError for fields that do not fit (the caller's bug)."""
    head = _BODY_HEAD.pack(record.kind, record.ledger_id)
    if record.kind is Kind.ADD:
        body = head + _U64.pack(record.value) + record.data
    elif record.kind is Kind.KEY:
        if len(record.data) != MASTER_KEY_BYTES:
            raise ValueError(f"master key must be {MASTER_KEY_BYTES} bytes, got {len(record.data)}")
        body = head + record.data
    elif record.kind is Kind.LAC:
        body = head + _I64.pack(record.value)
    else:
        body = head
    if len(body) > MAX_JOURNAL_BODY:
        raise ValueError(f"journal record of {len(body)} bytes exceeds {MAX_JOURNAL_BODY}")
    return _FRAME.pack(len(body), crc32c(body)) + body


def decode_journal_record(buf: Buffer, offset: int = 0) -> tuple[JournalRecord, int]:
    """Decode the record at `offset`; return it and the offset just past it."""
    view = memoryview(buf)
    length = _checked_length(view, offset, FRAME_BYTES, _BODY_HEAD.size, MAX_JOURNAL_BODY, "journal")
    body = view[offset + FRAME_BYTES : offset + FRAME_BYTES + length]
    (crc,) = struct.unpack_from(">I", view, offset + 4)
    if crc32c(body) != crc:
        raise CorruptRecord(f"journal record at offset {offset}: checksum mismatch", offset=offset)
    return _decode_body(body, offset), offset + FRAME_BYTES + length


_BODY_SIZES = {Kind.KEY: MASTER_KEY_BYTES, Kind.FENCE: 0, Kind.LAC: 8, Kind.DELETE: 0}


def _decode_body(body: memoryview, offset: int) -> JournalRecord:
    kind_code, ledger_id = _BODY_HEAD.unpack_from(body)
    try:
        kind = Kind(kind_code)
    except ValueError:
        raise CorruptRecord(f"journal record at offset {offset}: unknown kind {kind_code}", offset=offset) from None
    rest = body[_BODY_HEAD.size :]
    if kind is Kind.ADD:
        if len(rest) < 8:
            raise CorruptRecord(f"journal ADD record at offset {offset} has no entry id", offset=offset)
        return JournalRecord(kind, ledger_id, _U64.unpack_from(rest)[0], bytes(rest[8:]))
    if len(rest) != _BODY_SIZES[kind]:
        raise CorruptRecord(f"journal {kind.name} record at offset {offset}: {len(rest)} bytes of fields",
                            offset=offset)
    if kind is Kind.KEY:
        return JournalRecord(kind, ledger_id, 0, bytes(rest))
    if kind is Kind.LAC:
        return JournalRecord(kind, ledger_id, _I64.unpack_from(rest)[0])
    return JournalRecord(kind, ledger_id)


def _checked_length(view: memoryview, offset: int, header: int, low: int, high: int, what: str) -> int:
    """The record's length field, once it is plausible and its bytes are present."""
    if not 0 <= offset <= len(view):
        raise ValueError(f"offset {offset} outside buffer of {len(view)} bytes")
    available = len(view) - offset
    if available < header:
        raise TornRecord(f"{what} record at offset {offset}: only {available} of {header} header bytes",
                         offset=offset)
    length, crc = _FRAME.unpack_from(view, offset)
    if length == 0 and crc == 0:
        raise TornRecord(f"{what} record at offset {offset}: zero-filled header", offset=offset)
    if not low <= length <= high:
        raise CorruptRecord(f"{what} record at offset {offset}: impossible length {length}", offset=offset)
    if available - header < length:
        raise TornRecord(f"{what} record at offset {offset}: {length} bytes announced, "
                         f"{available - header} present", offset=offset)
    return length


@dataclass(frozen=True, slots=True)
class JournalScan:
    """Whole valid records from a start offset; `end` is just past the last one; `stop` is None
    when the buffer ended on a record boundary or only zero fill follows it (`zero_fill`: a
    preallocated segment's clean end), else the error that stopped the scan at `end`."""

    records: list[JournalRecord]
    end: int
    stop: TornRecord | CorruptRecord | None
    zero_fill: bool = False


def scan_journal(buf: Buffer, offset: int = 0) -> JournalScan:
    """Decode records until the buffer ends, only zero bytes remain, or a record is bad. Never
    raises for any content."""
    records: list[JournalRecord] = []
    pos = offset
    while pos < len(buf):
        try:
            record, nxt = decode_journal_record(buf, pos)
        except (TornRecord, CorruptRecord) as err:
            if is_zero_fill(memoryview(buf)[pos:]):
                return JournalScan(records, pos, None, zero_fill=True)
            return JournalScan(records, pos, err)
        records.append(record)
        pos = nxt
    return JournalScan(records, pos, None)


# --- entry log records ----------------------------------------------------------------


def encode_entry_record(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    """One entry log record: 24-byte header and the packaged entry."""
    if not 0 < len(data) <= MAX_ENTRY_BYTES_LIMIT:
        raise ValueError(f"entry of {len(data)} bytes cannot be stored")
    ids = struct.pack(">QQ", ledger_id, entry_id)
    return struct.pack(">II", len(data), crc32c(data, crc32c(ids))) + ids + data


def decode_entry_record(buf: Buffer, offset: int = 0) -> tuple[int, int, bytes, int]:
    """(ledger_id, entry_id, data, next offset) of the entry log record at `offset`."""
    view = memoryview(buf)
    length = _checked_length(view, offset, ENTRY_RECORD_HEADER_BYTES, 1, MAX_ENTRY_BYTES_LIMIT, "entry log")
    _, crc, ledger_id, entry_id = _ENTRY_HEAD.unpack_from(view, offset)
    start = offset + ENTRY_RECORD_HEADER_BYTES
    data = view[start : start + length]
    if crc32c(data, crc32c(view[offset + 8 : start])) != crc:
        raise CorruptRecord(f"entry log record at offset {offset} (ledger {ledger_id} entry {entry_id}): "
                            "checksum mismatch", offset=offset)
    return ledger_id, entry_id, bytes(data), start + length


def scan_entry_log(buf: Buffer, offset: int = FILE_HEADER_BYTES
                   ) -> tuple[list[tuple[int, int, int, int]], int, StorageError | None]:
    """Every valid record from `offset`: (ledger_id, entry_id, record offset, data length), the end
    of the last one, and the error that stopped the scan early (None: clean end). Never raises."""
    found: list[tuple[int, int, int, int]] = []
    pos = offset
    while pos < len(buf):
        try:
            ledger_id, entry_id, data, nxt = decode_entry_record(buf, pos)
        except (TornRecord, CorruptRecord) as err:
            return found, pos, err
        found.append((ledger_id, entry_id, pos, len(data)))
        pos = nxt
    return found, pos, None
