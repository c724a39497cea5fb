"""One client connection of the client port (trio edge): its outgoing queue (an
edge/outbox.py Outbox, counted in bytes) and the task that writes it.

A client that stops reading its replies is cut off once what is queued for it
exceeds `ClientLimits.outgoing_max_bytes`, or once what every connection of the port
holds exceeds `ClientLimits.reply_max_bytes` (never waited for: the queue is what
the node would otherwise hold for it without bound).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from metastore.wire import jute
from metastore.core.acl import Id
from edge.outbox import ByteBudget, Outbox

log = logging.getLogger("quire.metastore")
Job = tuple[object, Callable[[], bool]]  # (the Pending write it waits for or None, answer it: False closes)


@dataclass(eq=False)
class Connection:
    id: int
    stream: trio.abc.Stream
    peer: str
    outgoing_max_bytes: int
    session_id: int = 0
    auth: list[Id] = field(default_factory=list)
    active: bool = True  # since the last touch round
    replies: collections.deque[Job] = field(default_factory=collections.deque)  # started, not yet answered
    reply_sizes: collections.deque[int] = field(default_factory=collections.deque)  # their request bytes
    reply_started: collections.deque[tuple[int, float]] = field(default_factory=collections.deque)  # (op, arrival)
    received: int = 0  # requests (ZooKeeper's cons: recved)
    sent: int = 0  # frames: answers and notifications (cons: sent)
    request_op: int = 0  # the request being started, and when it arrived (for the latency metrics)
    request_arrived: float = 0.0
    advanced: trio.Event = field(default_factory=trio.Event)  # set whenever replies were answered
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)  # reading requests and awaiting replies
    closed: bool = False
    cut_off: bool = False  # ended for queueing more than outgoing_max_bytes
    read_only: bool = False  # a read-only session (metastore/edge/handshake.py): reads only
    out: Outbox | None = None
    writer_scope: trio.CancelScope | None = None
    budget: ByteBudget | None = None  # the node-wide bound all client connections share

    def __post_init__(self) -> None:
        # One TLS record per reply: kazoo select()s on the socket before each read (see Outbox).
        self.out = Outbox(max_bytes=self.outgoing_max_bytes, record_per_item=True, budget=self.budget)

    @property
    def host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    def send(self, payload: bytes) -> None:
        """Queue one frame; write it now when nothing else is queued or in flight."""
        self.sent += 1
        self.send_raw(jute.frame(payload))

    def send_raw(self, data: bytes) -> None:
        if self.closed:
            return
        # Written now only when no other reply is known to be coming: a burst of replies goes
        # through the writer task, which sends whatever one loop turn produced in one write.
        if not self.out.send(data, direct=not self.replies):
            budget = self.budget
            log.info("event=client_dropped conn=%s peer=%s reason=outgoing_bytes queued=%d limit=%d node_queued=%s "
                     "node_limit=%s", self.id, self.peer, self.out.queued_bytes + len(data), self.outgoing_max_bytes,
                     budget and budget.used, budget and budget.limit)
            self.cut_off = True
            self.abort()  # a client that does not read its replies is cut off, never waited for

    def close(self) -> None:
        """End the connection once what is queued has been written."""
        self.closed = True
        self.out.close()

    def abort(self) -> None:
        """End the connection now, dropping what is queued."""
        self.close()
        self.out.abort()
        self.scope.cancel()
        if self.writer_scope is not None:
            self.writer_scope.cancel()

    async def run_writer(self, scope: trio.CancelScope) -> None:
        """Write queued frames until closed and drained; then cancel `scope` (the connection)."""
        self.writer_scope = scope
        try:
            await self.out.pump(self.stream)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


async def receive_exactly(stream: trio.abc.Stream, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            return None
        buf += data
    return buf
