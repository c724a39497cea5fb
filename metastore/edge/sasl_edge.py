"""SASL and enforced authentication on the client port (edge), as ZooKeeper 3.9 serves them.

SASL (ZooKeeperServer.processSasl): a request of type OpCode.SASL carries a
GetSASLRequest token; the reply is a ReplyHeader with the request's xid, zxid 0 and err
0, then a SetSASLResponse with the server's token. The mechanism is DIGEST-MD5
(metastore/core/sasl_digest.py) with the users of cluster.toml's `sasl_users_file`. When the
exchange completes, the connection holds ("sasl", username), which ACLs name as
`sasl:<username>` and "auth" expands to. A failed exchange is answered AUTHFAILED (or
SESSIONCLOSEDREQUIRESASLAUTH when enforced authentication names sasl, as ZooKeeper
does) with a null token, and the connection closes; the session stays (the client may
reconnect to it with other credentials, or let it expire). Without a users file every
SASL request is refused that way: ZooKeeper would answer an empty token and leave a
client waiting for a mechanism that does not exist.

Enforced authentication (ZooKeeper's enforce.auth.enabled with enforce.auth.schemes,
cluster.toml `enforce_auth_schemes`): a request other than auth and sasl, pings and
closeSession included, on a connection holding no id of one of the schemes is answered
SESSIONCLOSEDREQUIRESASLAUTH (-124) and the connection closes
(AuthenticationHelper.enforceAuthentication).

Each connection's exchange lives here, keyed weakly by its Connection, so it ends with
the connection; the service only routes requests (MetastoreService._request).
"""

from __future__ import annotations

import logging
import secrets
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from metastore.wire import jute
from metastore.core.acl import Id
from metastore.edge.edge_guard import ClientRefused, check_auth
from metastore.wire.jute_defs import Err, OpCode
from metastore.core.sasl_digest import SASL_SCHEME, DigestMD5Server, SaslFailure, make_nonce
from metastore.core.sasl_users import JaasError, parse_jaas_users

if TYPE_CHECKING:
    from metastore.edge.client_conn import Connection

log = logging.getLogger("quire.metastore")

NULL_TOKEN = b"\xff\xff\xff\xff"  # SetSASLResponse(null): a buffer of length -1
ENFORCEABLE_SCHEMES = frozenset({"sasl", "digest", "x509"})  # "ip" is every connection's: never a proof
MAX_USERS_FILE_BYTES = 1 << 20


class SaslConfigError(Exception):
    """The SASL users file cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class SaslSettings:
    """The client port's SASL users and enforced authentication (cluster.toml)."""

    users: Mapping[str, str] = field(default_factory=dict, repr=False)  # empty: SASL is off; never logged
    enforce_auth_schemes: frozenset[str] = frozenset()  # empty: unauthenticated sessions are served


def load_settings(users_file: str | Path | None, enforce_auth_schemes: frozenset[str]) -> SaslSettings:
    """Read the users file (ZooKeeper's JAAS file, `Server` section) once, at start."""
    if not users_file:
        return SaslSettings({}, enforce_auth_schemes)
    return SaslSettings(read_users_file(Path(users_file)), enforce_auth_schemes)


def read_users_file(path: Path) -> dict[str, str]:
    """username -> password from a JAAS file; SaslConfigError says what is wrong with it."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_USERS_FILE_BYTES + 1)
    except OSError as e:
        raise SaslConfigError(f"sasl_users_file {path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_USERS_FILE_BYTES:
        raise SaslConfigError(f"sasl_users_file {path}: larger than {MAX_USERS_FILE_BYTES} bytes")
    try:
        return parse_jaas_users(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SaslConfigError(f"sasl_users_file {path}: not UTF-8 text") from None
    except JaasError as e:
        raise SaslConfigError(f"sasl_users_file {path}: {e}") from None


class SaslEdge:
    """SASL exchanges and enforced authentication for one client port."""

    def __init__(self, settings: SaslSettings, random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        self.settings = settings
        self._random_bytes = random_bytes
        self._exchanges: weakref.WeakKeyDictionary[Connection, DigestMD5Server] = weakref.WeakKeyDictionary()
        self.stats = {"sasl_authenticated": 0, "sasl_failed": 0, "auth_enforced": 0}

    def admits(self, conn: Connection, op: int) -> bool:
        """Whether the request may go on (enforced authentication lets auth and sasl through)."""
        schemes = self.settings.enforce_auth_schemes
        if not schemes or op in (OpCode.AUTH, OpCode.SASL):
            return True
        return any(ident.scheme in schemes for ident in conn.auth)

    def answer(self, conn: Connection, header, body) -> bool | None:
        """Answer a SASL request, or refuse a request `admits` did not let through.
        True: answered, the connection goes on; None: answered, the connection closes."""
        if header.type != OpCode.SASL:
            self.stats["auth_enforced"] += 1
            log.info("event=client_refused conn=%s peer=%s reason=unauthenticated schemes=%s required=%s",
                     conn.id, conn.peer, sorted({i.scheme for i in conn.auth}),
                     sorted(self.settings.enforce_auth_schemes))
            conn.send(jute.encode_reply(jute.ReplyHeader(header.xid, 0, Err.SESSION_CLOSED_REQUIRE_SASL_AUTH)))
            return None
        try:
            token = self._evaluate(conn, body.token or b"")
        except (SaslFailure, ClientRefused) as e:
            self.stats["sasl_failed"] += 1
            self._exchanges.pop(conn, None)
            log.info("event=sasl_failed conn=%s peer=%s error=%s", conn.id, conn.peer, e)
            code = Err.SESSION_CLOSED_REQUIRE_SASL_AUTH if SASL_SCHEME in self.settings.enforce_auth_schemes \
                else Err.AUTH_FAILED
            conn.send(jute.encode_reply(jute.ReplyHeader(header.xid, 0, code)) + NULL_TOKEN)
            return None
        conn.send(jute.encode_reply(jute.ReplyHeader(header.xid, 0, Err.OK), jute.SetSASLResponse(token)))
        return True

    def _evaluate(self, conn: Connection, token: bytes) -> bytes:
        if not self.settings.users:
            raise SaslFailure("SASL is not configured on this node (cluster.toml sasl_users_file)")
        exchange = self._exchanges.get(conn)
        if exchange is None:
            exchange = self._exchanges[conn] = DigestMD5Server(self.settings.users, make_nonce(self._random_bytes))
        answer = exchange.evaluate(token)
        if exchange.complete:
            assert exchange.user is not None
            ident = Id(SASL_SCHEME, exchange.user)
            check_auth(conn.auth, ident)
            if ident not in conn.auth:
                conn.auth.append(ident)
            self.stats["sasl_authenticated"] += 1
            log.info("event=sasl_authenticated conn=%s peer=%s user=%s", conn.id, conn.peer, exchange.user)
        return answer
