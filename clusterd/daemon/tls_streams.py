"""TLS on a node's connections (trio edge): the handshakes, with a deadline, and who may stay.

The services take these objects as optional hooks and know nothing of ssl:
- `PeerTls` (Zab peer links, zab/edge/transport.py): `accept` before the HELLO, `admit` after it
  (the certificate's node id must be the id the HELLO claims), `dial` after connecting (the
  server's certificate must name the node dialed).
- `ServerTls` (the client and bookie ports): `accept`, and `identities` for the client port's
  ACL ids (x509:<subject DN>).
- `ClientTls` (our metastore and bookie clients): `wrap` after connecting.

A refused connection is closed and logged once per cause (remote host and reason) at warning,
then at debug: a misconfigured peer redials every second and must not flood the log.
"""

from __future__ import annotations

import logging
import ssl

import trio

from clusterd.tls_context import certificate_node_ids, certificate_subject
from edge.tls_stream import TlsStream
from metastore.core.acl import Id
from edge.sockets import peer_address

log = logging.getLogger("quire.tls")

_HANDSHAKE_ERRORS = (trio.BrokenResourceError, trio.TooSlowError, trio.ClosedResourceError, OSError)


class TlsRefused(ConnectionError):
    """A TLS connection was refused (handshake failed, or the certificate names the wrong node).
    An OSError, so that callers that retry a failed connect retry this too."""


class _RefusalLog:
    MAX_REMEMBERED = 4096  # causes remembered; past it they are forgotten (and logged again), never hoarded

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, str]] = set()

    def refused(self, port: str, remote: str, reason: str) -> None:
        key = (port, remote.rsplit(":", 1)[0], reason)
        first = key not in self._seen
        if len(self._seen) >= self.MAX_REMEMBERED:
            self._seen.clear()
        self._seen.add(key)
        log.log(logging.WARNING if first else logging.DEBUG,
                "event=tls_refused port=%s remote=%s reason=%r%s", port, remote, reason,
                " (logged once per remote host and reason)" if first else "")


def _reason(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    if isinstance(e, trio.TooSlowError):
        return "no TLS handshake within the deadline"
    return str(e) or type(e).__name__


async def handshake(stream: trio.SocketStream, context: ssl.SSLContext, *, server_side: bool,
                    timeout_s: float, server_hostname: str | None = None) -> TlsStream:
    """The TLS handshake on `stream`, bounded by `timeout_s` (edge/tls_stream.py)."""
    tls = TlsStream(stream, context, server_side=server_side, server_hostname=server_hostname)
    with trio.fail_after(timeout_s):
        await tls.do_handshake()
    return tls


class ServerTls:
    """TLS on one listening port of a node."""

    def __init__(self, context: ssl.SSLContext, port_name: str, timeout_s: float) -> None:
        self.context = context
        self.port_name = port_name
        self.timeout_s = timeout_s
        self._refusals = _RefusalLog()
        self.refused = 0

    async def accept(self, stream: trio.SocketStream) -> TlsStream | None:
        """The handshake of an accepted connection; None when refused (closed and logged)."""
        try:
            return await handshake(stream, self.context, server_side=True, timeout_s=self.timeout_s)
        except _HANDSHAKE_ERRORS as e:
            self.refused += 1
            self._refusals.refused(self.port_name, peer_address(stream), _reason(e))
            await trio.aclose_forcefully(stream)
            return None
        except BaseException:  # cancelled mid-handshake: the socket is ours to close
            await trio.aclose_forcefully(stream)
            raise

    def identities(self, stream: trio.abc.Stream) -> list[Id]:
        """The ACL ids a TLS client authenticated as: x509:<subject DN> when it sent a certificate."""
        subject = certificate_subject(stream) if isinstance(stream, TlsStream) else None
        return [Id("x509", subject)] if subject else []


class PeerTls(ServerTls):
    """Mutual TLS on Zab peer links: both sides present node certificates of the cluster CA."""

    def __init__(self, server: ssl.SSLContext, client: ssl.SSLContext, timeout_s: float) -> None:
        super().__init__(server, "peer", timeout_s)
        self.client_context = client

    def admit(self, stream: trio.abc.Stream, peer: int) -> bool:
        """True when the certificate of an accepted link names the node its HELLO claims."""
        ids = certificate_node_ids(stream)
        if ids == {peer}:
            return True
        self.refused += 1
        named = ", ".join(map(str, sorted(ids))) or "no node"
        self._refusals.refused("peer", peer_address(stream),
                               f"HELLO claims node {peer}, the certificate names {named}")
        return False

    async def dial(self, stream: trio.SocketStream, peer: int) -> TlsStream:
        """The handshake of a link we dialed to `peer`; TlsRefused (an OSError) unless the server's
        certificate names `peer`. The raw stream is closed on refusal."""
        remote = peer_address(stream)
        try:
            tls = await handshake(stream, self.client_context, server_side=False, timeout_s=self.timeout_s)
        except _HANDSHAKE_ERRORS as e:
            await trio.aclose_forcefully(stream)
            reason = _reason(e)
            self._refusals.refused("peer-dial", remote, reason)
            raise TlsRefused(f"TLS to node {peer}: {reason}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        ids = certificate_node_ids(tls)
        if ids != {peer}:
            await trio.aclose_forcefully(tls)
            reason = f"dialed node {peer}, its certificate names {', '.join(map(str, sorted(ids))) or 'no node'}"
            self._refusals.refused("peer-dial", remote, reason)
            raise TlsRefused(reason)
        return tls


class ClientTls:
    """TLS for our clients of a node's client or bookie port (server name checked against `host`)."""

    def __init__(self, context: ssl.SSLContext, timeout_s: float = 5.0) -> None:
        self.context = context
        self.timeout_s = timeout_s

    async def wrap(self, stream: trio.SocketStream, host: str) -> TlsStream:
        """The handshake on a connected stream; TlsRefused (an OSError) on failure, stream closed."""
        try:
            return await handshake(stream, self.context, server_side=False, timeout_s=self.timeout_s,
                                   server_hostname=host if self.context.check_hostname else None)
        except _HANDSHAKE_ERRORS as e:
            await trio.aclose_forcefully(stream)
            raise TlsRefused(f"TLS to {host}: {_reason(e)}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
