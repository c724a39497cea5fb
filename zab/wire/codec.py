"""Wire format of Zab peer messages (documented in docs/formats.md).

A connection starts with one HELLO frame from the dialing side, then carries
message frames one way only (each node dials every other node to send to it).
Every frame: u32 payload length, u32 CRC32C of the payload, payload. A message
payload is u8 version, u8 type, then the fields below, big-endian. Decoding
never trusts a length before checking it against what is left and against the
configured maximum frame size.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from crc32c import crc32c

from zab.errors import FrameError
from zab.core.messages import (Ack, AckEpoch, AckNewLeader, Commit, FollowerInfo, Inform, LeaderInfo, Message, NewLeader,
                          Notification, Ping, Proposal, ReadIndexAck, ReadIndexProbe, Refused, Reject, Request,
                          ServerState, EnsembleInfo, SnapAck, SnapChunk, SnapEnd, Sync, SyncMode, SyncReply, SyncRequest, SyncTxns,
                          UpToDate)
from zab.core.txn import Txn

VERSION = 1
HELLO_MAGIC = b"QZAB"
_FRAME = struct.Struct(">II")
_TXN = struct.Struct(">QQQI")
_U64 = struct.Struct(">Q")
_SNAPCHUNK = struct.Struct(">QI")  # offset, CRC-32C of the data
_U64x2 = struct.Struct(">QQ")
DEFAULT_MAX_FRAME_BYTES = 64 << 20

_TYPES: dict[type, int] = {
    Notification: 1, FollowerInfo: 2, LeaderInfo: 3, AckEpoch: 4, Sync: 5, SyncTxns: 6, NewLeader: 7,
    AckNewLeader: 8, UpToDate: 9, Proposal: 10, Ack: 11, Commit: 12, Inform: 13, Request: 14, Reject: 15, Ping: 16,
    SyncRequest: 17, SyncReply: 18, Refused: 19, ReadIndexProbe: 20, ReadIndexAck: 21, SnapChunk: 22, SnapAck: 23,
    SnapEnd: 24, EnsembleInfo: 25,
}


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise FrameError(f"message truncated: need {n} bytes at offset {self.pos} of {len(self.buf)}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack(self.take(s.size))

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def blob(self) -> bytes:
        (n,) = struct.unpack(">I", self.take(4))
        return bytes(self.take(n))

    def txn(self) -> Txn:
        zxid, session, cxid, n = self.unpack(_TXN)
        return Txn(zxid, session, cxid, bytes(self.take(n)))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise FrameError(f"{len(self.buf) - self.pos} unexpected trailing bytes in message")


def _blob(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _txn(t: Txn) -> bytes:
    return _TXN.pack(t.zxid, t.session_id, t.cxid, len(t.data)) + t.data


def encode_message(msg: Message) -> bytes:
    """The payload of one message frame (without the frame header)."""
    head = bytes((VERSION, _TYPES[type(msg)]))
    match msg:
        case Notification():
            body = struct.pack(">qQqQB", msg.leader, msg.zxid, msg.peer_epoch, msg.election_epoch, msg.state)
        case FollowerInfo():
            body = struct.pack(">QQ?Q", msg.accepted_epoch, msg.last_zxid, msg.observer, msg.attempt)
        case LeaderInfo():
            body = struct.pack(">Q?", msg.new_epoch, msg.observer)
        case AckEpoch():
            body = _U64x2.pack(msg.current_epoch, msg.last_zxid)
        case Sync():
            body = struct.pack(">BQ?", msg.mode, msg.zxid, msg.snapshot is not None)
            body += _blob(msg.snapshot) if msg.snapshot is not None else b""
        case SyncTxns():
            body = struct.pack(">I", len(msg.txns)) + b"".join(_txn(t) for t in msg.txns)
        case NewLeader():
            body = _U64x2.pack(msg.epoch, msg.zxid)
        case AckNewLeader():
            body = _U64.pack(msg.epoch)
        case UpToDate():
            body = _U64.pack(msg.committed_zxid)
        case Proposal() | Inform():
            body = _txn(msg.txn)
        case Ack() | Commit():
            body = _U64.pack(msg.zxid)
        case Request():
            body = _U64x2.pack(msg.session_id, msg.cxid) + _blob(msg.data)
        case Reject():
            body = _U64x2.pack(msg.session_id, msg.cxid)
        case Ping():
            body = struct.pack(">I", len(msg.touches)) + b"".join(_U64.pack(t) for t in msg.touches)
        case SyncRequest():
            body = _U64x2.pack(msg.session_id, msg.cxid)
        case SyncReply():
            body = struct.pack(">QQQ", msg.session_id, msg.cxid, msg.zxid)
        case Refused():
            body = struct.pack(">QQQ", msg.session_id, msg.cxid, msg.zxid) + _blob(msg.data)
        case ReadIndexProbe() | ReadIndexAck():
            body = _U64.pack(msg.round)
        case SnapChunk():
            body = _SNAPCHUNK.pack(msg.offset, msg.crc) + _blob(msg.data)
        case SnapAck():
            body = _U64.pack(msg.received)
        case SnapEnd():
            body = _U64.pack(msg.total) + _blob(msg.digest)
        case EnsembleInfo():
            body = _U64.pack(msg.version) + _blob(msg.spec)
        case _:
            raise TypeError(f"not a Zab message: {msg!r}")
    return head + body


def _d_notification(r: _Reader) -> Message:
    leader, zxid, peer_epoch, election_epoch, state = r.unpack(struct.Struct(">qQqQB"))
    try:
        return Notification(leader, zxid, peer_epoch, election_epoch, ServerState(state))
    except ValueError:
        raise FrameError(f"unknown server state {state}") from None


def _d_sync(r: _Reader) -> Message:
    mode, zxid, has_snap = r.unpack(struct.Struct(">BQ?"))
    try:
        sync_mode = SyncMode(mode)
    except ValueError:
        raise FrameError(f"unknown sync mode {mode}") from None
    return Sync(sync_mode, zxid, r.blob() if has_snap else None)


def _d_sync_txns(r: _Reader) -> Message:
    (n,) = struct.unpack(">I", r.take(4))
    if n * _TXN.size > len(r.buf) - r.pos:
        raise FrameError(f"SYNCTXNS claims {n} transactions, more than the frame can hold")
    return SyncTxns(tuple(r.txn() for _ in range(n)))


def _d_ping(r: _Reader) -> Message:
    (n,) = struct.unpack(">I", r.take(4))
    if n * 8 > len(r.buf) - r.pos:
        raise FrameError(f"PING claims {n} session touches, more than the frame holds")
    return Ping(tuple(r.u64() for _ in range(n)))


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    1: _d_notification,
    2: lambda r: FollowerInfo(*r.unpack(struct.Struct(">QQ?Q"))),
    3: lambda r: LeaderInfo(*r.unpack(struct.Struct(">Q?"))),
    4: lambda r: AckEpoch(*r.unpack(_U64x2)),
    5: _d_sync,
    6: _d_sync_txns,
    7: lambda r: NewLeader(*r.unpack(_U64x2)),
    8: lambda r: AckNewLeader(r.u64()),
    9: lambda r: UpToDate(r.u64()),
    10: lambda r: Proposal(r.txn()),
    11: lambda r: Ack(r.u64()),
    12: lambda r: Commit(r.u64()),
    13: lambda r: Inform(r.txn()),
    14: lambda r: Request(*r.unpack(_U64x2), r.blob()),
    15: lambda r: Reject(*r.unpack(_U64x2)),
    16: _d_ping,
    17: lambda r: SyncRequest(*r.unpack(_U64x2)),
    18: lambda r: SyncReply(*r.unpack(struct.Struct(">QQQ"))),
    19: lambda r: Refused(*r.unpack(struct.Struct(">QQQ")), r.blob()),
    20: lambda r: ReadIndexProbe(r.u64()),
    21: lambda r: ReadIndexAck(r.u64()),
    22: lambda r: _d_snap_chunk(*r.unpack(_SNAPCHUNK), r.blob()),
    23: lambda r: SnapAck(r.u64()),
    24: lambda r: SnapEnd(r.u64(), r.blob()),
    25: lambda r: EnsembleInfo(r.u64(), r.blob()),
}


def _d_snap_chunk(offset: int, crc: int, data: bytes) -> SnapChunk:
    return SnapChunk(offset, data, crc)


def decode_message(payload: bytes | memoryview) -> Message:
    """Decode one message payload; any malformation raises FrameError."""
    r = _Reader(memoryview(payload))
    version, kind = r.unpack(struct.Struct(">BB"))
    if version != VERSION:
        raise FrameError(f"peer speaks message version {version}, we speak {VERSION}: upgrade the older node")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise FrameError(f"unknown message type {kind}")
    msg = decoder(r)
    r.done()
    return msg


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), crc32c(payload)) + payload


def encode_frame(msg: Message) -> bytes:
    return frame(encode_message(msg))


def encode_hello(cluster: str, sender: int) -> bytes:
    name = cluster.encode()
    return frame(HELLO_MAGIC + struct.pack(">HQH", VERSION, sender, len(name)) + name)


def decode_hello(payload: bytes | memoryview) -> tuple[str, int]:
    r = _Reader(memoryview(payload))
    if bytes(r.take(4)) != HELLO_MAGIC:
        raise FrameError("not a Quire peer connection (bad HELLO magic)")
    version, sender, n = r.unpack(struct.Struct(">HQH"))
    if version != VERSION:
        raise FrameError(f"peer speaks protocol version {version}, we speak {VERSION}")
    try:
        name = bytes(r.take(n)).decode()
    except UnicodeDecodeError:
        raise FrameError("HELLO cluster name is not UTF-8") from None
    r.done()
    return name, sender


class FrameDecoder:
    """Incremental frame splitter: feed bytes, iterate complete payloads."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buf += data
        while len(self._buf) >= _FRAME.size:
            length, crc = _FRAME.unpack_from(self._buf)
            if length > self.max_frame_bytes:
                raise FrameError(f"frame of {length} bytes exceeds max_frame_bytes={self.max_frame_bytes}")
            end = _FRAME.size + length
            if len(self._buf) < end:
                return
            payload = bytes(self._buf[_FRAME.size:end])
            del self._buf[:end]
            if crc32c(payload) != crc:
                raise FrameError("frame checksum mismatch: the connection is corrupt")
            yield payload

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
