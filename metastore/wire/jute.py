"""The ZooKeeper client wire protocol, sans I/O: framing, handshake, requests, replies, notifications.

Pure: bytes in, records out, and back (docs/metastore_wire.md describes the
protocol; metastore/wire/jute_codec.py the byte layouts; metastore/wire/jute_records.py
the records; metastore/wire/jute_defs.py the codes). A connection carries frames,
each an i32 length then that many payload bytes:

    client                                      server
    ConnectRequest (no header)          ->
                                        <-      ConnectResponse (no header)
    RequestHeader(xid, type) + body     ->
                                        <-      ReplyHeader(xid, zxid, err) + body
                                        <-      ReplyHeader(-1, -1, 0) + WatcherEvent

Instead of a frame, a connection may open with a four-letter admin word
(four_letter_word). Any malformed input raises JuteError; a well-formed request
with an opcode we do not decode raises its subclass UnknownOpcode, which
carries the xid so that the server can answer Err.UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import Any

from metastore.wire.jute_codec import (I32, KINDS, MULTI_READ_OPS, MULTI_WRITE_OPS, REPLY_HEADER, REQUEST_HEADER, Decoder,
                                  Reader, decode_record, encode_record, multi_request_decoder)
from metastore.wire.jute_defs import (DEFAULT_MAX_BUFFER_BYTES, DEFAULT_MAX_FRAME_BYTES, FOUR_LETTER_WORDS,
                                 PASSWORD_BYTES, PROTOCOL_VERSION, AddWatchMode, CreateMode, Err, EventType,
                                 JuteError, KeeperState, OpCode, Perms, UnknownOpcode, WatcherType, Xid)
from metastore.wire import jute_records
from metastore.wire.jute_records import *  # noqa: F403 (the records are part of this module's API)
from metastore.wire.jute_records import (AddWatchRequest, AuthPacket, CheckVersionRequest, CheckWatchesRequest,
                                    ConnectRequest, ConnectResponse, Create2Response, CreateRequest, CreateResponse,
                                    CreateTTLRequest, DeleteRequest, ErrorResponse, ExistsRequest, ExistsResponse,
                                    GetACLRequest, GetACLResponse, GetAllChildrenNumberRequest,
                                    GetAllChildrenNumberResponse, GetChildren2Request, GetChildren2Response,
                                    GetChildrenRequest, GetChildrenResponse, GetDataRequest, GetDataResponse,
                                    GetEphemeralsRequest, GetEphemeralsResponse, GetSASLRequest, MultiRequest,
                                    MultiResponse, ReconfigRequest, RemoveWatchesRequest, ReplyHeader, RequestHeader,
                                    SetACLRequest, SetACLResponse, SetDataRequest, SetDataResponse, SetSASLResponse,
                                    SetWatches, SetWatches2, SyncRequest, SyncResponse, WatcherEvent, WhoAmIResponse)

__all__ = [
    "DEFAULT_MAX_BUFFER_BYTES", "DEFAULT_MAX_FRAME_BYTES", "FOUR_LETTER_WORDS", "PASSWORD_BYTES", "PROTOCOL_VERSION",
    "AddWatchMode", "CreateMode", "Err", "EventType", "JuteError", "KeeperState", "OpCode", "Perms",
    "UnknownOpcode", "WatcherType", "Xid", "REQUEST_BODIES", "RESPONSE_BODIES",
    "decode_connect_request", "encode_connect_response", "decode_request", "encode_reply", "encode_notification",
    "encode_connect_request", "decode_connect_response", "encode_request", "decode_reply", "decode_notification",
    "reply_xid", "frame", "FrameReader", "four_letter_word", "encode_record", "decode_record",
] + jute_records.__all__

# The body each client request carries (None: header only). Opcodes absent here
# (notification, deleteContainer, createSession, error) are never sent by clients.
REQUEST_BODIES: dict[OpCode, type | None] = {
    OpCode.CREATE: CreateRequest, OpCode.DELETE: DeleteRequest, OpCode.EXISTS: ExistsRequest,
    OpCode.GET_DATA: GetDataRequest, OpCode.SET_DATA: SetDataRequest, OpCode.GET_ACL: GetACLRequest,
    OpCode.SET_ACL: SetACLRequest, OpCode.GET_CHILDREN: GetChildrenRequest, OpCode.SYNC: SyncRequest,
    OpCode.PING: None, OpCode.GET_CHILDREN2: GetChildren2Request, OpCode.CHECK: CheckVersionRequest,
    OpCode.MULTI: MultiRequest, OpCode.CREATE2: CreateRequest, OpCode.RECONFIG: ReconfigRequest,
    OpCode.CHECK_WATCHES: CheckWatchesRequest, OpCode.REMOVE_WATCHES: RemoveWatchesRequest,
    OpCode.CREATE_CONTAINER: CreateRequest, OpCode.CREATE_TTL: CreateTTLRequest, OpCode.MULTI_READ: MultiRequest,
    OpCode.AUTH: AuthPacket, OpCode.SET_WATCHES: SetWatches, OpCode.SASL: GetSASLRequest,
    OpCode.GET_EPHEMERALS: GetEphemeralsRequest, OpCode.GET_ALL_CHILDREN_NUMBER: GetAllChildrenNumberRequest,
    OpCode.SET_WATCHES2: SetWatches2, OpCode.ADD_WATCH: AddWatchRequest, OpCode.WHO_AM_I: None,
    OpCode.CLOSE_SESSION: None,
}

# The body of a successful reply to each request (None: header only). A reply
# with err != 0 never has a body.
RESPONSE_BODIES: dict[OpCode, type | None] = {
    OpCode.CREATE: CreateResponse, OpCode.DELETE: None, OpCode.EXISTS: ExistsResponse,
    OpCode.GET_DATA: GetDataResponse, OpCode.SET_DATA: SetDataResponse, OpCode.GET_ACL: GetACLResponse,
    OpCode.SET_ACL: SetACLResponse, OpCode.GET_CHILDREN: GetChildrenResponse, OpCode.SYNC: SyncResponse,
    OpCode.PING: None, OpCode.GET_CHILDREN2: GetChildren2Response,
    OpCode.CHECK: SetDataResponse,  # a standalone check answers with the node's Stat (ZooKeeper 3.9)
    OpCode.MULTI: MultiResponse, OpCode.CREATE2: Create2Response,
    OpCode.RECONFIG: GetDataResponse,  # the new configuration and the config znode's Stat
    OpCode.CHECK_WATCHES: None, OpCode.REMOVE_WATCHES: None, OpCode.CREATE_CONTAINER: Create2Response,
    OpCode.CREATE_TTL: Create2Response, OpCode.MULTI_READ: MultiResponse, OpCode.AUTH: None,
    OpCode.SET_WATCHES: None, OpCode.SASL: SetSASLResponse, OpCode.GET_EPHEMERALS: GetEphemeralsResponse,
    OpCode.GET_ALL_CHILDREN_NUMBER: GetAllChildrenNumberResponse, OpCode.SET_WATCHES2: None,
    OpCode.ADD_WATCH: ErrorResponse,  # always ErrorResponse(0), as ZooKeeper sends
    OpCode.WHO_AM_I: WhoAmIResponse, OpCode.CLOSE_SESSION: None,
}


def _decoders(bodies: dict[OpCode, type | None]) -> dict[int, Decoder | None]:
    return {int(op): (KINDS[cls].dec if cls is not None else None) for op, cls in bodies.items()}


_REQUEST_DECODERS = _decoders(REQUEST_BODIES)
_REQUEST_DECODERS[OpCode.MULTI] = multi_request_decoder(MULTI_WRITE_OPS, "multi")
_REQUEST_DECODERS[OpCode.MULTI_READ] = multi_request_decoder(MULTI_READ_OPS, "multiRead")
_RESPONSE_DECODERS = _decoders(RESPONSE_BODIES)
_NOTIFICATION_HEADER = REPLY_HEADER.pack(Xid.NOTIFICATION, -1, Err.OK)
_OPCODES = {int(op): op for op in OpCode}


# --- server side ---------------------------------------------------------------------

def decode_connect_request(payload: bytes, max_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> ConnectRequest:
    """The first frame of a client connection."""
    try:
        return decode_record(ConnectRequest, payload, max_bytes)
    except JuteError as e:
        raise JuteError(f"ConnectRequest: {e}") from None


def encode_connect_response(resp: ConnectResponse) -> bytes:
    return bytes(encode_record(resp))


def decode_request(payload: bytes, max_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> tuple[RequestHeader, Any]:
    """A request frame after the handshake: its header (type is an OpCode) and body (None
    for ping, closeSession and whoAmI). Raises UnknownOpcode for an opcode that is not in
    REQUEST_BODIES, JuteError for anything malformed."""
    r = Reader(payload, max_bytes)
    xid, op = r.int(), r.int()
    try:
        decoder = _REQUEST_DECODERS[op]
    except KeyError:
        raise UnknownOpcode(xid, op) from None
    header = RequestHeader(xid, _OPCODES[op])
    try:
        body = decoder(r) if decoder is not None else None
        r.done()
    except JuteError as e:
        raise JuteError(f"{header.type.name} request xid={xid}: {e}") from None
    return header, body


def encode_reply(header: ReplyHeader, body: Any = None) -> bytes:
    """A reply payload; body is RESPONSE_BODIES[the request's type], and None when header.err != 0."""
    out = bytearray(REPLY_HEADER.pack(header.xid, header.zxid, header.err))
    if body is not None:
        if header.err != Err.OK:
            raise ValueError(f"a reply with err {header.err} carries no body, got {body!r}")
        KINDS[type(body)].enc(out, body)
    return bytes(out)


def encode_notification(event: WatcherEvent) -> bytes:
    """A watch notification payload: xid -1, zxid -1, err 0, then the event."""
    out = bytearray(_NOTIFICATION_HEADER)
    KINDS[WatcherEvent].enc(out, event)
    return bytes(out)


# --- client side ---------------------------------------------------------------------

def encode_connect_request(req: ConnectRequest) -> bytes:
    return bytes(encode_record(req))


def decode_connect_response(payload: bytes, max_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> ConnectResponse:
    """The first frame from the server; time_out <= 0 means the session has expired."""
    try:
        return decode_record(ConnectResponse, payload, max_bytes)
    except JuteError as e:
        raise JuteError(f"ConnectResponse: {e}") from None


def encode_request(header: RequestHeader, body: Any = None) -> bytes:
    """A request payload; body must be of the type REQUEST_BODIES gives for header.type."""
    expected = REQUEST_BODIES[OpCode(header.type)]
    if type(body) is not (expected or type(None)):
        raise TypeError(f"{OpCode(header.type).name} request takes {expected and expected.__name__}, got {body!r}")
    out = bytearray(REQUEST_HEADER.pack(header.xid, header.type))
    if body is not None:
        KINDS[expected].enc(out, body)
    return bytes(out)


def reply_xid(payload: bytes) -> int:
    """The xid of a server frame: -1 notification, -2 ping, -4 auth, -8 setWatches, else a request's."""
    if len(payload) < REPLY_HEADER.size:
        raise JuteError(f"server frame of {len(payload)} bytes is shorter than a reply header")
    return I32.unpack_from(payload)[0]


def decode_reply(payload: bytes, expected_type: OpCode,
                 max_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> tuple[ReplyHeader, Any]:
    """A reply to a request of expected_type: header and body (None when err != 0, whatever
    follows the header then: some ZooKeeper versions send an empty record with errors)."""
    r = Reader(payload, max_bytes)
    header = ReplyHeader(r.int(), r.long(), r.int())
    if header.err != Err.OK:
        return header, None
    decoder = _RESPONSE_DECODERS[expected_type]
    try:
        body = decoder(r) if decoder is not None else None
        r.done()
    except JuteError as e:
        raise JuteError(f"reply xid={header.xid} to {OpCode(expected_type).name}: {e}") from None
    return header, body


def decode_notification(payload: bytes, max_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> WatcherEvent:
    r = Reader(payload, max_bytes)
    xid, _zxid, _err = r.int(), r.long(), r.int()
    if xid != Xid.NOTIFICATION:
        raise JuteError(f"frame with xid {xid} is not a notification (xid -1)")
    event = KINDS[WatcherEvent].dec(r)
    r.done()
    return event


# --- framing ---------------------------------------------------------------------------

def frame(payload: bytes) -> bytes:
    """Length-prefix one payload."""
    return I32.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into frame payloads. After a JuteError the stream is
    unusable: close the connection."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the payloads of the frames they complete, in order."""
        buf = self._buf
        buf += data
        frames, pos, end_of_data = [], 0, len(buf)
        with memoryview(buf) as view:
            while end_of_data - pos >= 4:
                (length,) = I32.unpack_from(buf, pos)
                if length < 0 or length > self.max_bytes:
                    raise JuteError(f"frame length {length} is outside 0..{self.max_bytes} (jute.maxbuffer)")
                end = pos + 4 + length
                if end > end_of_data:
                    break
                frames.append(bytes(view[pos + 4:end]))
                pos = end
        if pos:
            del buf[:pos]
        return frames

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buf)


def four_letter_word(first4: bytes) -> str | None:
    """The admin command a connection opens with (b"ruok", b"srvr", ...), or None when the
    first 4 bytes are an ordinary frame length. Every word, read as a length, is far
    above any max frame size, so the two cannot be confused."""
    if len(first4) != 4:
        raise ValueError(f"four_letter_word takes the first 4 bytes of a connection, got {len(first4)}")
    word = first4.decode("latin-1")
    return word if word in FOUR_LETTER_WORDS else None
