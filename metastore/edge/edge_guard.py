"""The client port's guard: the one place where a client's decoded input is checked
before it reaches the core (the Zab driver and its peer messages, the envelope the
leader prepares a transaction from, the read handlers), and where an answer is
checked before it goes back out. Pure: the service (metastore/edge/service.py) calls it
and turns what it raises into a reply or a closed connection.

Every field a client controls that reaches a fixed-width field downstream is
checked here or bounded by the frame limit (the audit, docs/metastore_wire.md
"Hostile clients"):

- ConnectRequest.session_id (i64) becomes the u64 session of Zab's REQUEST and
  SYNCREQUEST and of CreateSession/CloseSession records: it must be 0 (a new
  session) or a session id this cluster can issue (`tree.is_session_id`);
  anything else is answered as ZooKeeper answers an unknown session (a
  ConnectResponse with timeout 0: expired), then the connection closes.
- ConnectRequest.passwd must be PASSWORD_BYTES long to be a session's password;
  other lengths are a wrong password (expired, closed).
- ConnectRequest.time_out is clamped to the configured range before it is packed
  as an i32; last_zxid_seen is only compared.
- addAuth ids ride in the envelope behind u16 lengths and a u16 count: an id over
  MAX_AUTH_ID_BYTES or a connection with more than MAX_AUTH_IDS ids is refused
  with AUTH_FAILED, and the connection closes (ZooKeeper's answer to an auth it
  will not take).
- Request bodies are jute: each length is checked by the decoder against
  jute.maxbuffer (`ClientLimits.jute_max_buffer_bytes`) and the frame size, which
  also bounds a transaction below the peer frame limit; i32 versions, flags and
  perms stay i32; a TTL is checked by the preparer (0 < ttl < 2**40), paths by
  metastore.core.paths, data sizes by the preparer's per-znode limit.
- A reply larger than the frame limit a client accepts is not sent: the request
  gets MARSHALLINGERROR instead (`check_reply`).

What the service catches at its one guarded call (`CLIENT_FAULTS`): JuteError
(malformed or oversized bytes: the connection closes) and ClientRefused (one of
the refusals above: a reply with its code when it names one, then the connection
closes if `close`). Anything else is a bug in this node and stops it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metastore.core.acl import Id
from metastore.wire.jute_defs import DEFAULT_MAX_BUFFER_BYTES, PASSWORD_BYTES, Err, JuteError
from metastore.wire.jute_records import ConnectRequest
from metastore.core.ephemeral_owner import is_session_id
from metastore.core.watches import WatchLimits

MAX_AUTH_IDS = 64  # ids one connection may hold (ip plus addAuth ids); ZooKeeper has no limit
MAX_AUTH_ID_BYTES = 4096  # one id's UTF-8 bytes; the envelope's u16 would allow 65,535
FRAME_OVERHEAD_BYTES = 64 << 10  # a frame holds one maximal buffer plus header, path and ACLs


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Byte and count limits of the client port (docs/operations.md, with ZooKeeper's names)."""

    jute_max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES  # jute.maxbuffer
    outgoing_max_bytes: int = 32 << 20  # replies queued for one connection that does not read
    reply_max_bytes: int = 1 << 30  # ... for every connection of the node together
    max_client_connections: int = 60  # per client address: maxClientCnxns
    max_connections: int = 4096  # in total: maxCnxns
    handshake_timeout_ms: int = 10_000  # accept to complete ConnectRequest, first bytes included
    global_outstanding_limit: int = 1000  # requests started, not answered, all connections: globalOutstandingLimit
    global_outstanding_bytes: int = 64 << 20  # the same counted in request bytes
    max_watch_bytes_per_connection: int = 64 << 20  # watches one connection holds
    max_watch_bytes: int = 512 << 20  # ... all connections of the node together
    max_sessions: int = 100_000  # sessions in the tree; a new one beyond: the ConnectRequest is closed

    @property
    def watches(self) -> WatchLimits:
        """The watch index's bounds (metastore/core/watches.py)."""
        return WatchLimits(self.max_watch_bytes_per_connection, self.max_watch_bytes)

    @property
    def max_frame_bytes(self) -> int:
        """The largest request frame read and reply frame sent."""
        return self.jute_max_buffer_bytes + FRAME_OVERHEAD_BYTES


class ClientRefused(Exception):
    """A client's input the core must not see. `code` is the ZooKeeper error to answer
    (None: no reply), `close` whether the connection ends after it."""

    def __init__(self, reason: str, *, code: int | None = None, close: bool = True) -> None:
        super().__init__(reason)
        self.code, self.close = code, close


CLIENT_FAULTS = (JuteError, ClientRefused)


def check_connect(req: ConnectRequest) -> None:
    """ClientRefused (expired, close) unless the request names a new session or one
    this cluster could have issued."""
    if req.session_id == 0:
        return
    if not is_session_id(req.session_id):
        raise ClientRefused(f"session id {req.session_id:#x} is not one this cluster issues",
                            code=Err.SESSION_EXPIRED)
    if req.passwd is None or len(req.passwd) != PASSWORD_BYTES:
        raise ClientRefused(f"session password of {len(req.passwd or b'')} bytes, expected {PASSWORD_BYTES}",
                            code=Err.SESSION_EXPIRED)


def check_auth(held: Sequence[Id], new: Id) -> None:
    """ClientRefused (AUTH_FAILED, close) if `new` cannot be carried to the leader."""
    size = max(len(new.scheme.encode()), len(new.id.encode()))
    if size > MAX_AUTH_ID_BYTES:
        raise ClientRefused(f"auth id of {size} bytes exceeds {MAX_AUTH_ID_BYTES}", code=Err.AUTH_FAILED)
    if new not in held and len(held) >= MAX_AUTH_IDS:
        raise ClientRefused(f"a connection holds at most {MAX_AUTH_IDS} auth ids", code=Err.AUTH_FAILED)


def check_reply(payload: bytes, limits: ClientLimits) -> None:
    """ClientRefused (MARSHALLINGERROR, keep the connection) if a reply exceeds the frame
    limit: a ZooKeeper client refuses a frame above its jute.maxbuffer."""
    if len(payload) > limits.max_frame_bytes:
        raise ClientRefused(f"reply of {len(payload)} bytes exceeds {limits.max_frame_bytes} "
                            "(jute_max_buffer_bytes plus overhead)", code=Err.MARSHALLING_ERROR, close=False)
