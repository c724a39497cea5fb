"""The bookie wire protocol: request and response messages and their bytes (pure).

Documented byte by byte in docs/bookie_wire.md. Every frame is

    u32 body length | u32 CRC32C of the body | body

and every body starts with u8 version, u8 type, u64 request id. The client
chooses request ids; a response echoes its request's id and has the request's
type with the high bit set. Requests on one connection are pipelined and may be
answered out of order (a read waiting on the disk or a long poll does not hold
back the adds behind it).

Decoders never trust a length before checking it against what is left and the
configured maximum; anything malformed raises DecodeError, which carries the
request id when one was readable (the bookie answers BAD_REQUEST to it, then
closes the connection). This module does no I/O.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from crc32c import crc32c

from bookie import errors
from bookie.entry import HEADER_BYTES as ENTRY_HEADER_BYTES

VERSION = 1
FRAME = struct.Struct(">II")  # body length, CRC32C of the body
HEAD = struct.Struct(">BBQ")  # version, type, request id
MASTER_KEY_BYTES = 32
FRAME_OVERHEAD_BYTES = 128  # header bytes a frame may add around an entry (the largest is 57)
MAX_ERROR_MESSAGE_BYTES = 1024
MAX_ID = 2**63 - 1
NO_ENTRY = -1  # "no entry": the LAC of a ledger with none confirmed

RESPONSE_BIT = 0x80
FLAG_RECOVERY_ADD = 0x01  # ADD: a recoverer re-adding an entry, allowed on a fenced ledger
FLAG_FENCE = 0x01  # READ: fence the ledger first (recovery reads fence too: FAULTS.md)


class Kind(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    LONG_POLL = 4
    WRITE_LAC = 5
    FENCE = 6


class Status(enum.IntEnum):
    """Per-request outcome on the wire; each error is one class of bookie/errors.py."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    TOO_LARGE = 5
    READ_ONLY = 6
    OVERLOADED = 7
    BAD_REQUEST = 8
    CORRUPT = 9


ERROR_OF_STATUS: dict[Status, type[errors.BookieError]] = {
    Status.NO_SUCH_LEDGER: errors.NoSuchLedger,
    Status.NO_SUCH_ENTRY: errors.NoSuchEntry,
    Status.FENCED: errors.LedgerFenced,
    Status.UNAUTHORIZED: errors.Unauthorized,
    Status.TOO_LARGE: errors.EntryTooLarge,
    Status.READ_ONLY: errors.BookieReadOnly,
    Status.OVERLOADED: errors.Overloaded,
    Status.BAD_REQUEST: errors.BadRequest,
    Status.CORRUPT: errors.EntryCorrupt,
}


def status_of(error: BaseException) -> Status:
    """The wire status for a per-request error raised by the storage or the service."""
    for status, cls in ERROR_OF_STATUS.items():
        if isinstance(error, cls):
            return status
    raise TypeError(f"{error!r} has no wire status")  # a bug: only BookieErrors are answered


class DecodeError(ValueError):
    """The bytes are not a valid frame or message: the peer is at fault.
    `request_id` is the id read from the body, or None if the body was too damaged."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


# -- messages -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AddEntry:
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    data: bytes  # the packaged entry (bookie/entry.py), stored as it came
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class ReadEntry:
    request_id: int
    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes | None = None  # required when fencing


@dataclass(frozen=True, slots=True)
class ReadLac:
    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class LongPoll:
    request_id: int
    ledger_id: int
    previous_lac: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class WriteLac:
    request_id: int
    ledger_id: int
    lac: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class Fence:
    request_id: int
    ledger_id: int
    master_key: bytes


Request = AddEntry | ReadEntry | ReadLac | LongPoll | WriteLac | Fence


@dataclass(slots=True)
class Response:
    """One answer. Fields a kind does not carry stay at their defaults:
    ADD: entry_id; READ: entry_id, data; READ_LAC, FENCE: lac; LONG_POLL: lac and
    data (None when the entry after previous_lac is not stored here); WRITE_LAC: none.
    An error carries only `message`."""

    request_id: int
    kind: Kind
    status: Status
    ledger_id: int = 0
    entry_id: int = NO_ENTRY
    lac: int = NO_ENTRY
    data: bytes | None = None
    message: str = ""

    def error(self) -> errors.BookieError:
        """The typed error of a non-OK response."""
        assert self.status is not Status.OK
        return ERROR_OF_STATUS[self.status](f"bookie: {self.message or self.status.name.lower()}")


# -- encoding -------------------------------------------------------------------------

_ADD = struct.Struct(">BBQQQB32s")
_READ = struct.Struct(">BBQQQB")
_READ_LAC = struct.Struct(">BBQQ")
_LONG_POLL = struct.Struct(">BBQQqI")
_WRITE_LAC = struct.Struct(">BBQQq32s")
_FENCE = struct.Struct(">BBQQ32s")
_R_STATUS = struct.Struct(">BBQB")
_R_ERROR = struct.Struct(">BBQBH")
_R_ENTRY = struct.Struct(">BBQBQQ")  # ADD (nothing follows) and READ (the entry follows)
_R_LAC = struct.Struct(">BBQBQq")  # READ_LAC, FENCE
_R_LONG_POLL = struct.Struct(">BBQBQqB")
_R_LEDGER = struct.Struct(">BBQBQ")  # WRITE_LAC
_ENTRY_IDS = struct.Struct(">QQ")  # the first fields of a packaged entry


def _frame(head: bytes, data: bytes = b"") -> bytes:
    crc = crc32c(data, crc32c(head)) if data else crc32c(head)
    return b"".join((FRAME.pack(len(head) + len(data), crc), head, data))


def encode_add(request_id: int, ledger_id: int, entry_id: int, master_key: bytes, data: bytes,
               recovery: bool = False) -> bytes:
    """The frame of one ADD (the client's hot path: no message object is built)."""
    head = _ADD.pack(VERSION, Kind.ADD, request_id, ledger_id, entry_id, FLAG_RECOVERY_ADD if recovery else 0,
                     master_key)
    return _frame(head, data)


def encode_add_ok(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    """The frame of a successful ADD's answer (the bookie's hot path: no Response object)."""
    head = _R_ENTRY.pack(VERSION, Kind.ADD | RESPONSE_BIT, request_id, Status.OK, ledger_id, entry_id)
    return FRAME.pack(len(head), crc32c(head)) + head


def encode_request(req: Request) -> bytes:
    """The frame of one request."""
    match req:
        case AddEntry():
            return encode_add(req.request_id, req.ledger_id, req.entry_id, req.master_key, req.data, req.recovery)
        case ReadEntry():
            head = _READ.pack(VERSION, Kind.READ, req.request_id, req.ledger_id, req.entry_id,
                              FLAG_FENCE if req.fence else 0)
            if req.fence:
                assert req.master_key is not None and len(req.master_key) == MASTER_KEY_BYTES
                head += req.master_key
            return _frame(head)
        case ReadLac():
            return _frame(_READ_LAC.pack(VERSION, Kind.READ_LAC, req.request_id, req.ledger_id))
        case LongPoll():
            return _frame(_LONG_POLL.pack(VERSION, Kind.LONG_POLL, req.request_id, req.ledger_id, req.previous_lac,
                                          req.timeout_ms))
        case WriteLac():
            return _frame(_WRITE_LAC.pack(VERSION, Kind.WRITE_LAC, req.request_id, req.ledger_id, req.lac,
                                          req.master_key))
        case Fence():
            return _frame(_FENCE.pack(VERSION, Kind.FENCE, req.request_id, req.ledger_id, req.master_key))
    raise TypeError(f"not a bookie request: {req!r}")


def encode_response(resp: Response) -> bytes:
    """The frame of one response."""
    kind = resp.kind | RESPONSE_BIT
    if resp.status is not Status.OK:
        message = resp.message.encode("utf-8", "replace")[:MAX_ERROR_MESSAGE_BYTES]
        return _frame(_R_ERROR.pack(VERSION, kind, resp.request_id, resp.status, len(message)), message)
    match resp.kind:
        case Kind.ADD:
            return _frame(_R_ENTRY.pack(VERSION, kind, resp.request_id, 0, resp.ledger_id, resp.entry_id))
        case Kind.READ:
            assert resp.data is not None
            return _frame(_R_ENTRY.pack(VERSION, kind, resp.request_id, 0, resp.ledger_id, resp.entry_id), resp.data)
        case Kind.READ_LAC | Kind.FENCE:
            return _frame(_R_LAC.pack(VERSION, kind, resp.request_id, 0, resp.ledger_id, resp.lac))
        case Kind.LONG_POLL:
            head = _R_LONG_POLL.pack(VERSION, kind, resp.request_id, 0, resp.ledger_id, resp.lac,
                                     resp.data is not None)
            return _frame(head, resp.data or b"")
        case Kind.WRITE_LAC:
            return _frame(_R_LEDGER.pack(VERSION, kind, resp.request_id, 0, resp.ledger_id))
    raise AssertionError(f"unknown response kind {resp.kind!r}")


# -- decoding -------------------------------------------------------------------------

class FrameSplitter:
    """Incremental frame splitter: feed the bytes of a socket read, get complete, checked bodies.

    A frame longer than max_frame_bytes (refused before it is buffered) or whose CRC
    does not match makes the stream unusable: feed raises DecodeError, unless good
    frames came before it in the same bytes; those are returned and the error is
    kept in `error` (check it after handling them) and raised by the next feed.

    Work is linear in the bytes fed: the reads of an incomplete frame are kept as a list and
    joined once, when the frame's bytes are all there (issue 17: re-joining on every read made a
    5 MiB frame trickled in small reads cost gigabytes of copying on the shared event loop).
    `bytes_copied` counts the copying done to assemble frames (not the copy that makes each body):
    at most three times the bytes fed."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.error: DecodeError | None = None
        self._chunks: list[bytes] = []  # the reads holding the start of an incomplete frame
        self._pending = 0  # their total length
        self._need = FRAME.size  # how many bytes that frame needs before it can be split
        self.bytes_copied = 0

    def statistics(self) -> dict[str, int]:
        """Bytes copied to assemble frames so far, and bytes held for an incomplete one."""
        return {"bytes_copied": self.bytes_copied, "pending_bytes": self._pending}

    def feed(self, data: bytes) -> list[bytes]:
        if self.error is not None:
            raise self.error
        if self._chunks:
            self._chunks.append(data)
            self._pending += len(data)
            if self._pending < self._need:
                return []
            data = b"".join(self._chunks)  # the one join of this frame's reads
            self.bytes_copied += len(data)
            self._chunks, self._pending = [], 0
        bodies = []
        pos, end = 0, len(data)
        while end - pos >= 8:
            length, crc = FRAME.unpack_from(data, pos)
            if length > self.max_frame_bytes:
                self.error = DecodeError(f"frame of {length} bytes exceeds max_frame_bytes={self.max_frame_bytes}",
                                         _peek_request_id(data, pos + 8, end))
                break
            if end - pos - 8 < length:
                break
            body = data[pos + 8:pos + 8 + length]  # one copy, and bytes: sliced again without copying twice
            if crc32c(body) != crc:
                self.error = DecodeError("frame checksum mismatch: the connection is corrupt")
                break
            bodies.append(body)
            pos += 8 + length
        if pos < end and self.error is None:
            self._keep(data, pos, end)
        if self.error is not None and not bodies:
            raise self.error
        return bodies

    def _keep(self, data: bytes, pos: int, end: int) -> None:
        """Hold the start of an incomplete frame until the rest of it arrives."""
        if pos or not isinstance(data, bytes):  # a caller's bytearray may be reused: copy it
            data = bytes(data[pos:])
            self.bytes_copied += end - pos
        self._chunks, self._pending = [data], len(data)
        self._need = FRAME.size + FRAME.unpack_from(data)[0] if len(data) >= FRAME.size else FRAME.size

    @property
    def pending_bytes(self) -> int:
        return self._pending


def _peek_request_id(buf: bytes | bytearray, pos: int, end: int) -> int | None:
    if end - pos >= HEAD.size:
        version, _, request_id = HEAD.unpack_from(buf, pos)
        if version == VERSION:
            return request_id
    return None


def _head(body: bytes) -> tuple[int, int]:
    """(type, request id) of a body; DecodeError if too short or another version."""
    if len(body) < HEAD.size:
        raise DecodeError(f"message of {len(body)} bytes is shorter than its {HEAD.size}-byte header")
    version, kind, request_id = HEAD.unpack_from(body)
    if version != VERSION:
        raise DecodeError(f"peer speaks bookie protocol version {version}, we speak {VERSION}: upgrade the older side",
                          request_id)
    return kind, request_id


def _unpack(s: struct.Struct, body: bytes, request_id: int, what: str, exact: bool = True) -> tuple:
    if len(body) < s.size or (exact and len(body) != s.size):
        raise DecodeError(f"{what} of {len(body)} bytes, expected {s.size}", request_id)
    return s.unpack_from(body)


def _check_ids(request_id: int, ledger_id: int, *entries: int) -> None:
    if ledger_id > MAX_ID:
        raise DecodeError(f"ledger id {ledger_id} is out of range", request_id)
    for entry in entries:
        if not NO_ENTRY <= entry <= MAX_ID:
            raise DecodeError(f"entry id {entry} is out of range", request_id)


def decode_add(body: bytes) -> tuple[int, int, int, bytes, bytes, bool]:
    """(request id, ledger, entry, master key, packaged entry, recovery) of an ADD body, with the
    checks of decode_request but no message object (the bookie's hot path); DecodeError if malformed."""
    if len(body) < _ADD.size:
        return _d_add(body, _head(body)[1])  # raises the short-message error decode_request would
    version, kind, rid, ledger, entry, flags, key = _ADD.unpack_from(body)
    if version != VERSION or kind != Kind.ADD:
        return _d_add(body, _head(body)[1])
    if ledger > MAX_ID or entry > MAX_ID or flags & ~FLAG_RECOVERY_ADD or len(body) < _ADD.size + ENTRY_HEADER_BYTES:
        return _d_add(body, rid)  # raises the precise DecodeError
    if _ENTRY_IDS.unpack_from(body, _ADD.size) != (ledger, entry):
        return _d_add(body, rid)
    return rid, ledger, entry, key, body[_ADD.size:], flags == FLAG_RECOVERY_ADD


def _d_add(body: bytes, rid: int) -> AddEntry:
    _, kind, _, ledger, entry, flags, key = _unpack(_ADD, body, rid, "ADD", exact=False)
    if kind != Kind.ADD:
        raise DecodeError(f"not an ADD: request type {kind}", rid)
    _check_ids(rid, ledger, entry)
    if flags & ~FLAG_RECOVERY_ADD:
        raise DecodeError(f"ADD with unknown flags {flags:#x}", rid)
    if len(body) < _ADD.size + ENTRY_HEADER_BYTES:
        raise DecodeError(f"ADD of ledger {ledger} entry {entry} carries {len(body) - _ADD.size} bytes, "
                          f"less than a packaged entry's {ENTRY_HEADER_BYTES}-byte header", rid)
    # Only the ids, cheaply: the storage checks the rest of the header (BadRequest, per request).
    in_ledger, in_entry = _ENTRY_IDS.unpack_from(body, _ADD.size)
    if (in_ledger, in_entry) != (ledger, entry):
        raise DecodeError(f"ADD of ledger {ledger} entry {entry} carries the entry of ledger {in_ledger} "
                          f"entry {in_entry}", rid)
    return AddEntry(rid, ledger, entry, key, body[_ADD.size:], bool(flags & FLAG_RECOVERY_ADD))


def _d_read(body: bytes, rid: int) -> Request:
    _, _, _, ledger, entry, flags = _unpack(_READ, body, rid, "READ", exact=False)
    _check_ids(rid, ledger, entry)
    if flags & ~FLAG_FENCE:
        raise DecodeError(f"READ with unknown flags {flags:#x}", rid)
    fence = bool(flags & FLAG_FENCE)
    expected = _READ.size + (MASTER_KEY_BYTES if fence else 0)
    if len(body) != expected:
        raise DecodeError(f"READ of {len(body)} bytes, expected {expected}", rid)
    return ReadEntry(rid, ledger, entry, fence, body[_READ.size:] if fence else None)


def _d_long_poll(body: bytes, rid: int) -> Request:
    _, _, _, ledger, previous, timeout_ms = _unpack(_LONG_POLL, body, rid, "LONG_POLL")
    _check_ids(rid, ledger, previous)
    return LongPoll(rid, ledger, previous, timeout_ms)


def _d_write_lac(body: bytes, rid: int) -> Request:
    _, _, _, ledger, lac, key = _unpack(_WRITE_LAC, body, rid, "WRITE_LAC")
    _check_ids(rid, ledger, lac)
    return WriteLac(rid, ledger, lac, key)


def _d_read_lac(body: bytes, rid: int) -> Request:
    ledger = _unpack(_READ_LAC, body, rid, "READ_LAC")[3]
    _check_ids(rid, ledger)
    return ReadLac(rid, ledger)


def _d_fence(body: bytes, rid: int) -> Request:
    _, _, _, ledger, key = _unpack(_FENCE, body, rid, "FENCE")
    _check_ids(rid, ledger)
    return Fence(rid, ledger, key)


_REQUEST_DECODERS = {Kind.ADD: _d_add, Kind.READ: _d_read, Kind.READ_LAC: _d_read_lac,
                     Kind.LONG_POLL: _d_long_poll, Kind.WRITE_LAC: _d_write_lac, Kind.FENCE: _d_fence}


def decode_request(body: bytes) -> Request:
    """Decode one request body (a frame's payload); DecodeError if malformed."""
    kind, rid = _head(body)
    decoder = _REQUEST_DECODERS.get(kind)  # type: ignore[call-overload]
    if decoder is None:
        raise DecodeError(f"unknown request type {kind}", rid)
    return decoder(body, rid)


def decode_response(body: bytes) -> Response:
    """Decode one response body; DecodeError if malformed."""
    code, rid = _head(body)
    try:
        kind = Kind(code & ~RESPONSE_BIT)
    except ValueError:
        kind = None
    if kind is None or not code & RESPONSE_BIT:
        raise DecodeError(f"unknown response type {code}", rid)
    if len(body) < _R_STATUS.size:
        raise DecodeError(f"response of {len(body)} bytes has no status", rid)
    try:
        status = Status(body[HEAD.size])
    except ValueError:
        raise DecodeError(f"unknown status {body[HEAD.size]}", rid) from None
    if status is not Status.OK:
        n = _unpack(_R_ERROR, body, rid, "error response", exact=False)[4]
        if len(body) != _R_ERROR.size + n:
            raise DecodeError(f"error response of {len(body)} bytes, its message needs {_R_ERROR.size + n}", rid)
        return Response(rid, kind, status, message=body[_R_ERROR.size:].decode("utf-8", "replace"))
    return _RESPONSE_DECODERS[kind](body, rid)


def _r_entry(body: bytes, rid: int) -> Response:
    is_add = body[1] & ~RESPONSE_BIT == Kind.ADD
    ledger, entry = _unpack(_R_ENTRY, body, rid, "response", exact=is_add)[4:]
    _check_ids(rid, ledger, entry)
    if is_add:
        return Response(rid, Kind.ADD, Status.OK, ledger, entry)
    return Response(rid, Kind.READ, Status.OK, ledger, entry, data=body[_R_ENTRY.size:])


def _r_lac(body: bytes, rid: int) -> Response:
    _, code, _, _, ledger, lac = _unpack(_R_LAC, body, rid, "response")
    _check_ids(rid, ledger, lac)
    return Response(rid, Kind(code & ~RESPONSE_BIT), Status.OK, ledger, lac=lac)


def _r_long_poll(body: bytes, rid: int) -> Response:
    _, _, _, _, ledger, lac, has_entry = _unpack(_R_LONG_POLL, body, rid, "LONG_POLL response", exact=False)
    _check_ids(rid, ledger, lac)
    rest = body[_R_LONG_POLL.size:]
    if has_entry > 1 or (not has_entry and rest):
        raise DecodeError("LONG_POLL response: bad entry flag or trailing bytes", rid)
    return Response(rid, Kind.LONG_POLL, Status.OK, ledger, lac=lac, data=rest if has_entry else None)


def _r_ledger(body: bytes, rid: int) -> Response:
    ledger = _unpack(_R_LEDGER, body, rid, "WRITE_LAC response")[4]
    _check_ids(rid, ledger)
    return Response(rid, Kind.WRITE_LAC, Status.OK, ledger)


_RESPONSE_DECODERS = {Kind.ADD: _r_entry, Kind.READ: _r_entry, Kind.READ_LAC: _r_lac, Kind.FENCE: _r_lac,
                      Kind.LONG_POLL: _r_long_poll, Kind.WRITE_LAC: _r_ledger}
