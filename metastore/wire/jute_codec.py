"""Jute binary encoding of the client-protocol records, both directions.

Primitives, all big-endian, as zookeeper.jute's BinaryOutputArchive writes them:
int = i32; long = i64; boolean = one byte, 0 or 1; buffer = i32 length then
the bytes (-1: null); ustring = i32 length then UTF-8 (-1: null); vector<T> =
i32 count then that many T (-1: null). A nested record is its fields in order,
with no tag, length or padding. Field order and types are those of
zookeeper.jute; the schema of each record is declared once below.

The decoder never trusts a length or a count: each is checked against the
bytes left in the payload and against max_bytes (jute.maxbuffer) before
anything is allocated, and every malformation raises JuteError. Encoders trust
their input: a record holding a value its wire type cannot carry is our bug
and raises struct.error / TypeError.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

from metastore.wire.jute_defs import JuteError, OpCode
from metastore.wire.jute_records import (ACL, AddWatchRequest, AuthPacket, CheckResult, CheckVersionRequest,
    CheckWatchesRequest, ClientInfo, ConnectRequest, ConnectResponse, Create2Response, CreateRequest, CreateResponse,
    CreateTTLRequest, DeleteRequest, DeleteResult, ErrorResponse, ErrorResult, ExistsRequest, ExistsResponse,
    GetACLRequest, GetACLResponse, GetAllChildrenNumberRequest, GetAllChildrenNumberResponse, GetChildren2Request,
    GetChildren2Response, GetChildrenRequest, GetChildrenResponse, GetDataRequest, GetDataResponse,
    GetEphemeralsRequest, GetEphemeralsResponse, GetSASLRequest, Id, MultiHeader, MultiRequest, MultiResponse,
    ReconfigRequest, RemoveWatchesRequest, ReplyHeader, RequestHeader, SetACLRequest, SetACLResponse, SetDataRequest,
    SetDataResponse, SetSASLResponse, SetWatches, SetWatches2, Stat, SyncRequest, SyncResponse, WatcherEvent,
    WhoAmIResponse)

I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
STAT = struct.Struct(">qqqqiiiqiiq")  # Stat's 11 fields, in zookeeper.jute order (68 bytes)
REPLY_HEADER = struct.Struct(">iqi")
REQUEST_HEADER = struct.Struct(">ii")
MULTI_HEADER = struct.Struct(">i?i")
_NULL = I32.pack(-1)


class Reader:
    """A cursor over one payload that checks every read against what is left."""

    __slots__ = ("buf", "pos", "max_bytes")

    def __init__(self, payload: bytes | bytearray | memoryview, max_bytes: int) -> None:
        self.buf = payload if type(payload) is bytes else bytes(payload)
        self.pos = 0
        self.max_bytes = max_bytes

    def left(self) -> int:
        return len(self.buf) - self.pos

    def _truncated(self, need: int, what: str) -> JuteError:
        return JuteError(f"truncated {what}: needs {need} bytes at offset {self.pos}, {self.left()} left")

    def int(self) -> int:
        pos = self.pos
        if pos + 4 > len(self.buf):
            raise self._truncated(4, "int")
        self.pos = pos + 4
        return I32.unpack_from(self.buf, pos)[0]

    def long(self) -> int:
        pos = self.pos
        if pos + 8 > len(self.buf):
            raise self._truncated(8, "long")
        self.pos = pos + 8
        return I64.unpack_from(self.buf, pos)[0]

    def bool(self) -> bool:
        pos = self.pos
        if pos >= len(self.buf):
            raise self._truncated(1, "boolean")
        b = self.buf[pos]
        if b > 1:
            raise JuteError(f"boolean byte at offset {pos} is {b}, not 0 or 1")
        self.pos = pos + 1
        return b == 1

    def length(self, what: str, item_bytes: int = 1) -> int:
        """A length or count prefix, checked; -1 (null) is returned as is."""
        pos = self.pos
        if pos + 4 > len(self.buf):
            raise self._truncated(4, f"{what} length")
        n = I32.unpack_from(self.buf, pos)[0]
        self.pos = pos = pos + 4
        if n < -1:
            raise JuteError(f"{what} at offset {pos - 4} has negative length {n}")
        if n > self.max_bytes:
            raise JuteError(f"{what} of length {n} exceeds the limit of {self.max_bytes} (jute.maxbuffer)")
        if n * item_bytes > len(self.buf) - pos:
            raise JuteError(f"{what} of length {n} at offset {pos - 4} runs past the end ({self.left()} bytes left)")
        return n

    def buffer(self) -> bytes | None:
        n = self.length("buffer")
        if n < 0:
            return None
        pos = self.pos
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def blob(self) -> bytes:
        """A buffer whose null reads as b""."""
        n = self.length("buffer")
        if n <= 0:
            return b""
        pos = self.pos
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def ustring(self) -> str | None:
        n = self.length("ustring")
        return None if n < 0 else self._utf8(n)

    def text(self) -> str:
        """A ustring whose null reads as ""."""
        n = self.length("ustring")
        return "" if n < 0 else self._utf8(n)

    def _utf8(self, n: int) -> str:
        pos = self.pos
        self.pos = pos + n
        try:
            return self.buf[pos:pos + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise JuteError(f"ustring at offset {pos} is not UTF-8: {e.reason}") from None

    def stat(self) -> Stat:
        pos = self.pos
        if pos + STAT.size > len(self.buf):
            raise self._truncated(STAT.size, "Stat")
        self.pos = pos + STAT.size
        return Stat(*STAT.unpack_from(self.buf, pos))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise JuteError(f"{self.left()} unexpected trailing bytes at offset {self.pos}")


Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[Reader], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """How one jute type is written and read."""

    enc: Encoder
    dec: Decoder
    min_bytes: int  # the fewest bytes a value takes on the wire: bounds vector counts


def _put_int(out: bytearray, v: int) -> None:
    out += I32.pack(v)


def _put_long(out: bytearray, v: int) -> None:
    out += I64.pack(v)


def _put_bool(out: bytearray, v: bool) -> None:
    out.append(1 if v else 0)


def _put_buffer(out: bytearray, v: bytes | None) -> None:
    if v is None:
        out += _NULL
    else:
        out += I32.pack(len(v))
        out += v


def _put_ustring(out: bytearray, v: str | None) -> None:
    if v is None:
        out += _NULL
    else:
        b = v.encode("utf-8")
        out += I32.pack(len(b))
        out += b


def _put_stat(out: bytearray, s: Stat) -> None:
    out += STAT.pack(s.czxid, s.mzxid, s.ctime, s.mtime, s.version, s.cversion, s.aversion,
                     s.ephemeral_owner, s.data_length, s.num_children, s.pzxid)


INT = Kind(_put_int, Reader.int, 4)
LONG = Kind(_put_long, Reader.long, 8)
BOOL = Kind(_put_bool, Reader.bool, 1)
DATA = Kind(_put_buffer, Reader.buffer, 4)  # null stays None (znode data)
BUFFER = Kind(_put_buffer, Reader.blob, 4)  # null reads as b""
USTRING = Kind(_put_ustring, Reader.text, 4)  # null reads as ""
OPT_USTRING = Kind(_put_ustring, Reader.ustring, 4)  # null stays None
STAT_KIND = Kind(_put_stat, Reader.stat, STAT.size)


def vector(item: Kind) -> Kind:
    """vector<item>, as a tuple; null reads as ()."""
    put, get = item.enc, item.dec

    def enc(out: bytearray, values: Any) -> None:
        out += I32.pack(len(values))
        for v in values:
            put(out, v)

    def dec(r: Reader) -> tuple:
        n = r.length("vector", max(item.min_bytes, 1))
        return tuple(get(r) for _ in range(n)) if n > 0 else ()

    return Kind(enc, dec, 4)


def _trailing_bool(absent: bool | None) -> Kind:
    """The read-only flag at the end of the handshake records: old peers omit it."""

    def enc(out: bytearray, v: bool | None) -> None:
        if v is not None:
            _put_bool(out, v)

    def dec(r: Reader) -> bool | None:
        return r.bool() if r.left() else absent

    return Kind(enc, dec, 0)


KINDS: dict[type, Kind] = {Stat: STAT_KIND}


def _constructor(cls: type, decs: tuple[Decoder, ...]) -> Decoder:
    """Read the fields in order and build the record (unrolled for the usual sizes: this is the hot path)."""
    match decs:
        case ():
            return lambda r: cls()
        case (a,):
            return lambda r: cls(a(r))
        case (a, b):
            return lambda r: cls(a(r), b(r))
        case (a, b, c):
            return lambda r: cls(a(r), b(r), c(r))
        case (a, b, c, d):
            return lambda r: cls(a(r), b(r), c(r), d(r))
    return lambda r: cls(*[get(r) for get in decs])


def record(cls: type, *fields: tuple[str, Kind]) -> Kind:
    """Declare the wire schema of a record class: its fields, in order, with their kinds."""
    names = tuple(name for name, _ in fields)
    assert names == tuple(f.name for f in dataclasses.fields(cls)), f"{cls.__name__} schema != its fields"
    encs = tuple(kind.enc for _, kind in fields)
    decs = tuple(kind.dec for _, kind in fields)
    pairs = tuple(zip(names, encs))

    def enc(out: bytearray, rec: Any) -> None:
        for name, put in pairs:
            put(out, getattr(rec, name))

    kind = Kind(enc, _constructor(cls, decs), sum(k.min_bytes for _, k in fields))
    KINDS[cls] = kind
    return kind


# --- the schemas: zookeeper.jute ---------------------------------------------------

ID = record(Id, ("scheme", USTRING), ("id", USTRING))
ACL_KIND = record(ACL, ("perms", INT), ("id", ID))
ACLS = vector(ACL_KIND)
PATHS = vector(USTRING)
CLIENT_INFO = record(ClientInfo, ("auth_scheme", USTRING), ("user", USTRING))

record(ConnectRequest, ("protocol_version", INT), ("last_zxid_seen", LONG), ("time_out", INT),
       ("session_id", LONG), ("passwd", BUFFER), ("read_only", _trailing_bool(None)))
record(ConnectResponse, ("protocol_version", INT), ("time_out", INT), ("session_id", LONG),
       ("passwd", BUFFER), ("read_only", _trailing_bool(False)))
record(RequestHeader, ("xid", INT), ("type", INT))
record(ReplyHeader, ("xid", INT), ("zxid", LONG), ("err", INT))
record(MultiHeader, ("type", INT), ("done", BOOL), ("err", INT))
record(AuthPacket, ("type", INT), ("scheme", USTRING), ("auth", BUFFER))
record(WatcherEvent, ("type", INT), ("state", INT), ("path", USTRING))
record(ErrorResponse, ("err", INT))
record(SetWatches, ("relative_zxid", LONG), ("data_watches", PATHS), ("exist_watches", PATHS),
       ("child_watches", PATHS))
record(SetWatches2, ("relative_zxid", LONG), ("data_watches", PATHS), ("exist_watches", PATHS),
       ("child_watches", PATHS), ("persistent_watches", PATHS), ("persistent_recursive_watches", PATHS))

record(CreateRequest, ("path", USTRING), ("data", DATA), ("acl", ACLS), ("flags", INT))
record(CreateTTLRequest, ("path", USTRING), ("data", DATA), ("acl", ACLS), ("flags", INT), ("ttl", LONG))
record(CreateResponse, ("path", USTRING))
record(Create2Response, ("path", USTRING), ("stat", STAT_KIND))
record(DeleteRequest, ("path", USTRING), ("version", INT))
record(ExistsRequest, ("path", USTRING), ("watch", BOOL))
record(ExistsResponse, ("stat", STAT_KIND))
record(GetDataRequest, ("path", USTRING), ("watch", BOOL))
record(GetDataResponse, ("data", DATA), ("stat", STAT_KIND))
record(SetDataRequest, ("path", USTRING), ("data", DATA), ("version", INT))
record(SetDataResponse, ("stat", STAT_KIND))
record(GetACLRequest, ("path", USTRING))
record(GetACLResponse, ("acl", ACLS), ("stat", STAT_KIND))
record(SetACLRequest, ("path", USTRING), ("acl", ACLS), ("version", INT))
record(SetACLResponse, ("stat", STAT_KIND))
record(GetChildrenRequest, ("path", USTRING), ("watch", BOOL))
record(GetChildrenResponse, ("children", PATHS))
record(GetChildren2Request, ("path", USTRING), ("watch", BOOL))
record(GetChildren2Response, ("children", PATHS), ("stat", STAT_KIND))
record(SyncRequest, ("path", USTRING))
record(SyncResponse, ("path", USTRING))
record(CheckVersionRequest, ("path", USTRING), ("version", INT))
record(CheckWatchesRequest, ("path", USTRING), ("type", INT))
record(RemoveWatchesRequest, ("path", USTRING), ("type", INT))
record(AddWatchRequest, ("path", USTRING), ("mode", INT))
record(GetEphemeralsRequest, ("prefix_path", USTRING))
record(GetEphemeralsResponse, ("ephemerals", PATHS))
record(GetAllChildrenNumberRequest, ("path", USTRING))
record(GetAllChildrenNumberResponse, ("total_number", INT))
record(WhoAmIResponse, ("client_info", vector(CLIENT_INFO)))
record(ReconfigRequest, ("joining_servers", OPT_USTRING), ("leaving_servers", OPT_USTRING),
       ("new_members", OPT_USTRING), ("cur_config_id", LONG))
record(GetSASLRequest, ("token", DATA))
record(SetSASLResponse, ("token", DATA))
record(DeleteResult)
record(CheckResult)
record(ErrorResult, ("err", INT))  # an ErrorResponse body


# --- multi: MultiHeader-delimited sequences (ZooKeeper's MultiOperationRecord / MultiResponse) ---
# Each op or result is a MultiHeader(type, done=False, err) then its record; a
# MultiHeader with done=True (type -1, err -1) ends the sequence.

MULTI_WRITE_OPS: dict[int, type] = {
    OpCode.CREATE: CreateRequest, OpCode.CREATE2: CreateRequest, OpCode.CREATE_CONTAINER: CreateRequest,
    OpCode.CREATE_TTL: CreateTTLRequest, OpCode.DELETE: DeleteRequest, OpCode.SET_DATA: SetDataRequest,
    OpCode.CHECK: CheckVersionRequest,
}
MULTI_READ_OPS: dict[int, type] = {OpCode.GET_CHILDREN: GetChildrenRequest, OpCode.GET_DATA: GetDataRequest}
RESULT_OPS: dict[type, int] = {
    CreateResponse: OpCode.CREATE, Create2Response: OpCode.CREATE2, DeleteResult: OpCode.DELETE,
    SetDataResponse: OpCode.SET_DATA, CheckResult: OpCode.CHECK, GetDataResponse: OpCode.GET_DATA,
    GetChildrenResponse: OpCode.GET_CHILDREN, ErrorResult: OpCode.ERROR,
}
_RESULT_TYPES = {op: cls for cls, op in RESULT_OPS.items()}
_END = MULTI_HEADER.pack(-1, True, -1)


def _multi_entries(r: Reader, types: dict[int, type], what: str) -> tuple[tuple[int, Any], ...]:
    entries = []
    while True:
        op, done, _err = r.int(), r.bool(), r.int()
        if done:
            return tuple(entries)
        cls = types.get(op)
        if cls is None:
            raise JuteError(f"{what} entry {len(entries)} has type {op}, which a {what} cannot hold")
        entries.append((op, KINDS[cls].dec(r)))


def multi_request_decoder(types: dict[int, type], what: str) -> Decoder:
    """The decoder of a multi (types = MULTI_WRITE_OPS) or multiRead (MULTI_READ_OPS) body."""
    return lambda r: MultiRequest(tuple((OpCode(op), rec) for op, rec in _multi_entries(r, types, what)))


def _enc_multi_request(out: bytearray, req: MultiRequest) -> None:
    for op, rec in req.ops:
        assert type(rec) is (MULTI_WRITE_OPS.get(op) or MULTI_READ_OPS.get(op)), f"multi op {op} with {rec!r}"
        out += MULTI_HEADER.pack(op, False, -1)
        KINDS[type(rec)].enc(out, rec)
    out += _END


def _enc_multi_response(out: bytearray, resp: MultiResponse) -> None:
    for result in resp.results:
        err = result.err if type(result) is ErrorResult else 0
        out += MULTI_HEADER.pack(RESULT_OPS[type(result)], False, err)
        KINDS[type(result)].enc(out, result)
    out += _END


def _dec_multi_response(r: Reader) -> MultiResponse:
    return MultiResponse(tuple(rec for _, rec in _multi_entries(r, _RESULT_TYPES, "multi response")))


ALL_MULTI_OPS = MULTI_WRITE_OPS | MULTI_READ_OPS
KINDS[MultiRequest] = Kind(_enc_multi_request, multi_request_decoder(ALL_MULTI_OPS, "multi"), 9)
KINDS[MultiResponse] = Kind(_enc_multi_response, _dec_multi_response, 9)


def encode_record(rec: Any, out: bytearray | None = None) -> bytearray:
    """Append the jute encoding of any record above to out (a new buffer if None)."""
    out = bytearray() if out is None else out
    KINDS[type(rec)].enc(out, rec)
    return out


def decode_record(cls: type, payload: bytes | bytearray | memoryview, max_bytes: int) -> Any:
    """Decode exactly one record of type cls filling the whole payload."""
    r = Reader(payload, max_bytes)
    rec = KINDS[cls].dec(r)
    r.done()
    return rec
