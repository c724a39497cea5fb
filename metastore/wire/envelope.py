"""The request a node hands to Zab for a client write: the client's jute request plus
what only the receiving node knows (its clock, the connection's authenticated ids,
itself as the session's current owner).

The leader prepares transactions from these (metastore.core.prep); nobody else reads
them, and they are never logged (the transaction is).
Layout, big-endian: u8 version, u8 kind, u8 origin node id, i64 time_ms, u16 auth
id count, then per id two u16-length UTF-8 strings (scheme, id), then the payload:
for CLIENT, the jute request (RequestHeader + body) as the client sent it; for
CREATE_SESSION, the negotiated timeout as i32 ms; for CLOSE_SESSION, nothing; for
DELETE_CONTAINER (the leader's cleanup of empty containers and expired TTL nodes),
the path as UTF-8; for CLAIM_SESSION (a client reconnected here), nothing; for
INIT_SECRET (the first leader's cluster secret, metastore.core.cluster_secret), its bytes.
An auth id ("super", token) stands for a super identity its origin node granted;
the preparer honours it only with the token derived from the cluster secret.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 1
CLIENT, CREATE_SESSION, CLOSE_SESSION, DELETE_CONTAINER, CLAIM_SESSION, INIT_SECRET = 0, 1, 2, 3, 4, 5
_HEAD = struct.Struct(">BBBqH")
_LEN = struct.Struct(">H")


class EnvelopeError(ValueError):
    """Malformed envelope: a bug in this node or a corrupt peer message."""


@dataclass(slots=True, unsafe_hash=True)
class Envelope:
    kind: int
    origin: int
    time_ms: int
    auth: tuple[tuple[str, str], ...]
    payload: bytes  # jute RequestHeader + request body


MAX_FIELD = 0xFFFF  # u16: the auth count and each id's length; the client port keeps far below (edge_guard)


def _s(text: str) -> bytes:
    b = text.encode()
    if len(b) > MAX_FIELD:
        raise EnvelopeError(f"auth id of {len(b)} bytes does not fit the envelope: the client-port guard "
                            "(metastore.edge.edge_guard) must refuse it first")
    return _LEN.pack(len(b)) + b


def encode_envelope(e: Envelope) -> bytes:
    if len(e.auth) > MAX_FIELD:
        raise EnvelopeError(f"{len(e.auth)} auth ids do not fit the envelope: the client-port guard "
                            "(metastore.edge.edge_guard) must refuse them first")
    parts = [_HEAD.pack(VERSION, e.kind, e.origin, e.time_ms, len(e.auth))]
    for scheme, ident in e.auth:
        parts += [_s(scheme), _s(ident)]
    parts.append(e.payload)
    return b"".join(parts)


def decode_envelope(buf: bytes) -> Envelope:
    if len(buf) < _HEAD.size:
        raise EnvelopeError("envelope truncated")
    version, kind, origin, time_ms, n = _HEAD.unpack_from(buf)
    if version != VERSION:
        raise EnvelopeError(f"envelope version {version}, expected {VERSION}")
    if kind not in (CLIENT, CREATE_SESSION, CLOSE_SESSION, DELETE_CONTAINER, CLAIM_SESSION, INIT_SECRET):
        raise EnvelopeError(f"unknown envelope kind {kind}")
    pos = _HEAD.size
    auth = []
    for _ in range(n):
        pair = []
        for _ in range(2):
            if pos + 2 > len(buf):
                raise EnvelopeError("envelope truncated in auth ids")
            (size,) = _LEN.unpack_from(buf, pos)
            pos += 2
            if pos + size > len(buf):
                raise EnvelopeError("envelope truncated in auth ids")
            try:
                pair.append(buf[pos:pos + size].decode())
            except UnicodeDecodeError:
                raise EnvelopeError("auth id is not UTF-8") from None
            pos += size
        auth.append((pair[0], pair[1]))
    return Envelope(kind, origin, time_ms, tuple(auth), bytes(buf[pos:]))
