"""Socket helpers shared by every port (trio edge): write-through on a trio socket stream,
for every connection that has a writer task (Zab's peer links, the metastore's client
port, the bookie's client and service); the remote address of a stream; the count of open
connections per client address that every serving port admits against; and the listeners
of every port, a failure to bind raised as PortUnavailable.

A lone message (a proposal to an idle follower, a reply, one add awaited at a
time) would otherwise wait for its connection's writer task to run in a later
scheduler pass; on a small machine shared by several processes every such pass
is a measurable slice of a sub-millisecond round trip. `write_now` hands the
bytes to the kernel at once instead. The caller guarantees that no `send_all`
is in progress on the stream and that nothing it queued earlier is still
unsent (otherwise bytes would interleave or reorder), and queues whatever the
socket did not take for its writer task. Over TLS the same holds, the
ciphertext being sealed at once (edge/tls_stream.py).
"""

from __future__ import annotations

import collections
import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import trio

# The TLS of a node's own clients of the client port (MetaClient) and of the bookie port
# (BookieClient) when the caller passes none: clusterd sets them once at the root of a node's
# tasks (clusterd/daemon/tls_node.py use_node_certificate), and trio tasks inherit them, so the
# daemons' clients (registration, GC, AutoRecovery, the ledger SDK inside them) dial with the
# node's certificate without each of them carrying it. Unset elsewhere: plain TCP.
METASTORE_CLIENT_TLS: ContextVar[Any] = ContextVar("quire_metastore_client_tls", default=None)
BOOKIE_CLIENT_TLS: ContextVar[Any] = ContextVar("quire_bookie_client_tls", default=None)


def write_now(stream: trio.SocketStream, data: bytes) -> bytes | memoryview:
    """Write `data` without waiting; returns the part the socket did not take (empty: all sent).
    An error leaves everything unsent: the writer task's send_all meets it again and ends the
    connection the usual way. A TLS stream (edge/tls_stream.py) seals the bytes first, and may return OWED: no plaintext is left
    but ciphertext is, which the caller's next send_all writes first (queue it as any rest)."""
    if not isinstance(stream, trio.SocketStream):
        direct = getattr(stream, "write_now", None)
        return data if direct is None else direct(data)
    try:
        sent = os.write(stream.socket.fileno(), data)
    except OSError:  # BlockingIOError (the send buffer is full), or a broken connection
        return data
    return memoryview(data)[sent:] if sent < len(data) else b""


def peer_address(stream: trio.abc.Stream) -> str:
    """"host:port" of the remote end of a socket stream, or of the socket under a TLS stream;
    "?" once the connection is gone (reset before it was asked)."""
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "?"


def peer_host(stream: trio.SocketStream) -> str | None:
    """The client's IP address, the unit of a per-address connection limit; None once the
    connection is gone (reset before it was served)."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return peer[0] if isinstance(peer, tuple) else str(peer)


class PortUnavailable(Exception):
    """A port this process must serve cannot be bound: another process holds it, or the address is
    not this machine's. A refusal at start (the environment's fault, not a bug); the message names
    the port, what it serves and what to do."""

    def __init__(self, what: str, host: str, port: int, error: OSError) -> None:
        self.what, self.host, self.port, self.errno = what, host, port, error.errno
        if error.errno == errno.EADDRINUSE:
            advice = (f"another process holds it (`ss -ltnp 'sport = :{port}'` shows which): stop it, or give "
                      "this node another port in cluster.toml")
        elif error.errno == errno.EACCES:
            advice = "ports below 1024 need privileges this user lacks: choose a port above 1023"
        else:  # EADDRNOTAVAIL, or a name that does not resolve (socket.gaierror)
            advice = "check that the node's host (or bind_host) in cluster.toml is an address of this machine"
        super().__init__(f"cannot listen for {what} on {host}:{port}: {error.strerror or error}; {advice}")


async def open_listeners(port: int, host: str, what: str) -> list[trio.SocketListener]:
    """trio.open_tcp_listeners, a failure to bind raised as PortUnavailable naming `what` the port
    serves (clusterd turns it into one line and its own exit status)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise PortUnavailable(what, host, port, e) from None


class ConnectionCounts:
    """Open connections per client address and in total, admitted against two limits
    (ZooKeeper's maxClientCnxns and maxCnxns); the setting names go into the refusal."""

    def __init__(self, per_address: int, total: int, *, per_address_setting: str, total_setting: str) -> None:
        self.per_address, self.total = per_address, total
        self._settings = per_address_setting, total_setting
        self._counts: collections.Counter[str] = collections.Counter()
        self._open = 0

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`; the reason it is refused (then not counted), or None."""
        if self._counts[host] >= self.per_address:
            return f"too many connections from {host}: max is {self.per_address} ({self._settings[0]})"
        if self._open >= self.total:
            return f"too many connections: max is {self.total} ({self._settings[1]})"
        self._counts[host] += 1
        self._open += 1
        return None

    @property
    def open(self) -> int:
        """Connections admitted and not yet released."""
        return self._open

    def release(self, host: str) -> None:
        """A connection admitted from `host` has ended."""
        self._counts[host] -= 1
        self._open -= 1
        if self._counts[host] <= 0:
            del self._counts[host]


@asynccontextmanager
async def admitted(counts: ConnectionCounts, stream: trio.SocketStream) -> AsyncIterator[str | None]:
    """Admit a new connection against `counts` for the block: its refusal (then the stream is
    closed at once and not counted), or None. For ports whose connections need no more than a
    close when refused (the HTTP ports)."""
    host = peer_host(stream)
    refused = "the connection was reset before it was served" if host is None else counts.admit(host)
    if refused is not None:
        await trio.aclose_forcefully(stream)
        yield refused
        return
    try:
        yield None
    finally:
        counts.release(host)
