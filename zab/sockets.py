"""Write-through on a trio socket stream (trio edge), shared by every connection that
has a writer task: Zab's peer links, the metastore's client port, the bookie's
client and service.

A lone message (a proposal to an idle follower, a reply, one add awaited at a
time) would otherwise wait for its connection's writer task to run in a later
scheduler pass; on a small machine shared by several processes every such pass
is a measurable slice of a sub-millisecond round trip. `write_now` hands the
bytes to the kernel at once instead. The caller guarantees that no `send_all`
is in progress on the stream and that nothing it queued earlier is still
unsent (otherwise bytes would interleave or reorder), and queues whatever the
socket did not take for its writer task.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from typing import Any

import trio

# The TLS of a node's own clients of the client port (MetaClient) and of the bookie port
# (BookieClient) when the caller passes none: clusterd sets them once at the root of a node's
# tasks (clusterd/tls_node.py use_node_certificate), and trio tasks inherit them, so the
# daemons' clients (registration, GC, AutoRecovery, the ledger SDK inside them) dial with the
# node's certificate without each of them carrying it. Unset elsewhere: plain TCP.
METASTORE_CLIENT_TLS: ContextVar[Any] = ContextVar("quire_metastore_client_tls", default=None)
BOOKIE_CLIENT_TLS: ContextVar[Any] = ContextVar("quire_bookie_client_tls", default=None)


def write_now(stream: trio.SocketStream, data: bytes) -> bytes | memoryview:
    """Write `data` without waiting; returns the part the socket did not take (empty: all sent).
    An error leaves everything unsent: the writer task's send_all meets it again and ends the
    connection the usual way. A TLS stream (no `socket`) takes nothing here: its bytes must be
    encrypted, so they always go through the writer task's send_all."""
    if not isinstance(stream, trio.SocketStream):
        return data
    try:
        sent = os.write(stream.socket.fileno(), data)
    except OSError:  # BlockingIOError (the send buffer is full), or a broken connection
        return data
    return memoryview(data)[sent:] if sent < len(data) else b""
