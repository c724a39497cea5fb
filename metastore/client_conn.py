"""One client connection of the client port (trio edge): its outgoing queue, counted
in bytes, and the task that writes it.

A client that stops reading its replies is cut off once what is queued for it
exceeds `ClientLimits.outgoing_max_bytes` (never waited for: the queue is what
the node would otherwise hold for it without bound).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from metastore import jute
from metastore.acl import Id
from edge.sockets import write_now

log = logging.getLogger("quire.metastore")
Job = tuple[object, Callable[[], bool]]  # (the Pending write it waits for or None, answer it: False closes)
BATCH_FRAMES = 256  # frames one write may join


@dataclass(eq=False)
class Connection:
    id: int
    stream: trio.abc.Stream
    peer: str
    outgoing_max_bytes: int
    session_id: int = 0
    auth: list[Id] = field(default_factory=list)
    active: bool = True  # since the last touch round
    idle: bool = False  # the writer task waits on an empty queue: nothing is in flight
    replies: collections.deque[Job] = field(default_factory=collections.deque)  # started, not yet answered
    reply_sizes: collections.deque[int] = field(default_factory=collections.deque)  # their request bytes
    advanced: trio.Event = field(default_factory=trio.Event)  # set whenever replies were answered
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)  # reading requests and awaiting replies
    closed: bool = False
    cut_off: bool = False  # ended for queueing more than outgoing_max_bytes
    out: collections.deque[bytes] = field(default_factory=collections.deque)
    out_bytes: int = 0  # queued and being written
    writer_scope: trio.CancelScope | None = None
    _wake: trio.Event = field(default_factory=trio.Event)

    @property
    def host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    def send(self, payload: bytes) -> None:
        """Queue one frame; write it now when nothing else is queued or in flight."""
        self.send_raw(jute.frame(payload))

    def send_raw(self, data: bytes) -> None:
        if self.closed:
            return
        if self.idle and not self.replies and not self.out:
            # Nothing in flight and no other reply known to be coming: write now, one
            # task switch sooner. A burst of replies keeps going through the writer,
            # which sends whatever one loop turn produced in one write.
            data = write_now(self.stream, data)  # on an error, the writer meets it itself
            if not data:
                return
        if self.out_bytes + len(data) > self.outgoing_max_bytes:
            log.info("event=client_dropped conn=%s peer=%s reason=outgoing_bytes queued=%d limit=%d",
                     self.id, self.peer, self.out_bytes + len(data), self.outgoing_max_bytes)
            self.cut_off = True
            self.abort()  # a client that does not read its replies is cut off, never waited for
            return
        self.idle = False
        self.out.append(data)
        self.out_bytes += len(data)
        self._wake.set()

    def close(self) -> None:
        """End the connection once what is queued has been written."""
        self.closed = True
        self._wake.set()

    def abort(self) -> None:
        """End the connection now, dropping what is queued."""
        self.close()
        self.out.clear()
        self.out_bytes = 0
        self.scope.cancel()
        if self.writer_scope is not None:
            self.writer_scope.cancel()

    async def run_writer(self, scope: trio.CancelScope) -> None:
        """Write queued frames until closed and drained; then cancel `scope` (the connection)."""
        self.writer_scope = scope
        send_frames = getattr(self.stream, "send_frames", None)  # a TLS stream (edge/tls_stream.py)
        try:
            while True:
                if not self.out:
                    if self.closed:
                        break
                    self.idle = True  # only while blocked on an empty queue (see send_raw)
                    try:
                        await self._wake.wait()
                    finally:
                        self.idle = False
                    self._wake = trio.Event()
                    continue
                chunks = [self.out.popleft() for _ in range(min(len(self.out), BATCH_FRAMES))]
                if send_frames is not None:
                    # TLS: one record per frame, all in one write. kazoo select()s on the socket before
                    # each read, so a second reply decrypted into its SSL buffer with the first would wait
                    # there for the next record to arrive (the next ping, seconds later); a record of its
                    # own stays in the kernel until kazoo reads it, and select() sees it.
                    await send_frames(chunks)
                    self.out_bytes -= sum(map(len, chunks))
                    continue
                # Replies and notifications queued meanwhile leave in one write.
                data = b"".join(chunks)
                await self.stream.send_all(data)
                self.out_bytes -= len(data)
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
