"""One connection's outgoing bytes and the task that writes them (trio edge).

Every port that writes to a socket uses it: Zab's peer links, the metastore's
client connections, the bookie service's connections and the bookie client.

A lone message is written through (edge/sockets.py `write_now`) when the link
is idle, a syscall instead of a scheduler pass of the writer task; everything
else is queued, and the writer task (`pump`) sends everything queued
in one write. What the socket did not take of a direct write goes to the front
of the queue, so frames never interleave or reorder.

The thread/lock protocol, the one place it is written down (for an outbox made with
`threads=True`; one made without refuses every write from another thread and its sends
skip the lock):
- `lock` (a threading.Lock) is held around every direct write, around the
  writer task taking data from the queue and marking itself `sending`, and
  around attaching and detaching the stream.
- A direct write, from trio's thread (`send`, `push`) or from another thread
  (`send_from_thread`: the bookie's and the Zab log writer's fsync threads
  answer the moment their fsync returns), happens only when the link is idle:
  a stream attached, the writer task not inside a write, nothing queued.
- Another thread never waits and never touches trio objects: when the socket
  took only part of its write, it queues the rest and wakes the writer task
  through the trio token (the only cross-thread call, and only in that case).
- `detach` drops the stream and the queue at once: a message sent afterwards
  waits for the next attached stream, never leaves on the old one.

Bounds: with `max_bytes` / `max_frames`, `send` refuses (returns False) what
would take a non-empty queue past either; one item always fits an empty
queue. A `ByteBudget` shared by the outboxes of a port bounds them together:
what they hold queued and in their writer tasks' hands, each past its first
queued item, stays within its limit (a refusal counts in `refusals`). The caller decides what a refusal means (Zab disconnects a follower
that cannot keep up; the client and bookie ports cut off a client that does
not read). What is in the writer task's hands is no longer counted.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import trio

from edge.sockets import write_now

@dataclass
class OutboxStats:
    """What left through one or more outboxes (an instance may be shared)."""

    frames_sent: int = 0
    bytes_sent: int = 0
    writes: int = 0  # system-call-sized writes: direct ones and the writer task's batches
    thread_frames_sent: int = 0  # by send_from_thread (counted under the lock)


class ByteBudget:
    """Bytes the outboxes sharing it may hold together, queued or in their writer task's hands:
    a node-wide bound on what clients that do not read can make a port hold (each outbox's own
    `max_bytes` bounds one connection only). Thread-safe: outboxes with threads share it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.refusals = 0
        self._lock = threading.Lock()

    def charge(self, nbytes: int) -> None:
        with self._lock:
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


class Outbox:
    """The outgoing side of one link. `send` from trio's thread, `send_from_thread` from any
    other, and one writer task `await outbox.pump(stream)` per attached stream."""

    def __init__(self, *, max_bytes: int | None = None, max_frames: int | None = None, threads: bool = False,
                 record_per_item: bool = False, stats: OutboxStats | None = None,
                 budget: ByteBudget | None = None) -> None:
        self.lock = threading.Lock()
        # Whether another thread may write (send_from_thread). Without, the per-frame sends skip the
        # lock: on the bookie client's pipelined adds it cost more than the rest of a send together.
        self.threads = threads
        self.max_bytes, self.max_frames = max_bytes, max_frames
        # Over TLS, each queued item becomes a record of its own (kazoo select()s on the raw socket
        # before each read: two replies in one record would leave the second waiting in its SSL buffer).
        self.record_per_item = record_per_item
        self.stats = OutboxStats() if stats is None else stats
        self.stream: trio.abc.Stream | None = None
        self.sending = False  # the writer task holds data taken from the queue
        self.closed = False  # no more sends; the writer task ends once the queue is drained
        self.queued_bytes = 0
        self.queued_frames = 0
        self.budget = budget
        self._held = 0  # bytes charged to `budget`: queued, or taken by the writer task and not yet written
        self._bounded = max_bytes is not None or max_frames is not None or budget is not None
        self._queue: collections.deque[bytes | memoryview] = collections.deque()
        self._backlog = False  # a push left bytes: no more pushes until the writer task has them
        self._wake = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None

    @property
    def idle(self) -> bool:
        """Whether a direct write may go now (read under `lock` by writers)."""
        return self.stream is not None and not self.sending and not self._queue

    def send(self, data: bytes, frames: int = 1, *, direct: bool = True) -> bool:
        """From trio's thread: write `data` now if the link is idle and `direct`, else queue it.
        False: refused, over the bounds (nothing was queued)."""
        if self.closed:
            return True
        if not self.threads:
            return self._send(data, frames, direct)
        with self.lock:
            return self._send(data, frames, direct)

    def _send(self, data: bytes, frames: int, direct: bool) -> bool:
        if self._queue:
            if self._bounded and self._over(len(data), frames):
                return False
        elif direct and self.stream is not None and not self.sending:
            rest = write_now(self.stream, data)
            stats = self.stats
            stats.writes += 1
            stats.bytes_sent += len(data) - len(rest)
            if not rest:
                stats.frames_sent += frames
                return True
            data = rest
        self._enqueue(data, frames)
        return True

    def append(self, data: bytes) -> None:
        """From trio's thread: queue one frame for the writer task: no direct write, no bounds.
        The cheapest send, for a caller that knows more is coming in this step (the bookie
        client's pipelined adds)."""
        if not self.threads:
            self._enqueue(data)
            return
        with self.lock:
            self._enqueue(data)

    def _enqueue(self, data: bytes, frames: int = 1) -> None:
        """Queue `data` (trio's thread; under the lock if other threads write)."""
        queue = self._queue
        if not queue:
            self._wake.set()  # otherwise the writer task is woken already and takes everything queued
        queue.append(data)
        self.queued_bytes += len(data)
        self.queued_frames += frames
        if self.budget is not None:
            self._charge(len(data))

    def _charge(self, nbytes: int) -> None:
        if self.budget is not None:
            self.budget.charge(nbytes)
            self._held += nbytes

    def _release(self, nbytes: int) -> None:
        nbytes = min(nbytes, self._held)  # a detach released everything already
        if nbytes > 0:
            self.budget.release(nbytes)  # type: ignore[union-attr]  (_held > 0 only with a budget)
            self._held -= nbytes

    def _over(self, nbytes: int, frames: int) -> bool:
        if self.budget is not None and self.budget.used + nbytes > self.budget.limit:
            self.budget.refusals += 1
            return True
        return ((self.max_bytes is not None and self.queued_bytes + nbytes > self.max_bytes)
                or (self.max_frames is not None and self.queued_frames + frames > self.max_frames))

    def push(self) -> None:
        """From trio's thread: hand what is queued to the kernel now, unless the writer task holds
        data or an earlier push's rest is still queued (the socket is full: joining again is vain)."""
        with self.lock:
            queue = self._queue
            if self.stream is None or self.sending or self._backlog or not queue:
                return
            data = b"".join(queue)
            queue.clear()
            rest = write_now(self.stream, data)
            stats = self.stats
            stats.writes += 1
            stats.bytes_sent += len(data) - len(rest)
            stats.frames_sent += self.queued_frames
            self.queued_bytes, self.queued_frames = len(rest), 0
            self._release(len(data) - len(rest))
            if rest:
                queue.append(rest)
                self._backlog = True

    def send_from_thread(self, data: bytes, frames: int = 1) -> bool:
        """From a thread other than trio's: write `data` if the link is idle. True: it is the
        outbox's now (all written, or the rest queued for the writer task); False: nothing was
        written and the caller sends it from trio's thread."""
        if not self.threads:
            return False  # an outbox made without threads=True never takes a thread's write
        with self.lock:
            if self.closed or not self.idle or self._token is None:
                return False
            rest = write_now(self.stream, data)
            if rest is data:  # nothing taken (full, broken, or a TLS stream off its thread)
                return False
            self.stats.thread_frames_sent += frames
            if not rest:
                return True
            self._queue.append(rest)
            self.queued_bytes += len(rest)
            self._charge(len(rest))
            token = self._token
        try:
            token.run_sync_soon(self._wake.set)
        except trio.RunFinishedError:
            pass  # the run is over: nothing will write this link again
        return True

    def detach(self) -> None:
        """Drop the stream and everything queued (the link is gone or replaced)."""
        with self.lock:
            self.stream, self.sending, self._backlog = None, False, False
            self._queue.clear()
            self.queued_bytes = self.queued_frames = 0
            self._release(self._held)  # what the writer task holds goes with it
        self._wake.set()

    def close(self) -> None:
        """No more sends: the writer task returns once what is queued is written."""
        self.closed = True
        self._wake.set()

    def abort(self) -> None:
        """No more sends and nothing more written."""
        self.closed = True
        self.detach()

    async def pump(self, stream: trio.abc.Stream) -> None:
        """The writer task of `stream`: attaches it and writes what is queued until closed and
        drained or detached (then returns) or cancelled; a write's error propagates."""
        with self.lock:
            self.stream, self._token = stream, trio.lowlevel.current_trio_token()
        send_frames = getattr(stream, "send_frames", None) if self.record_per_item else None
        try:
            while True:
                with self.lock:
                    if self.stream is not stream:
                        return  # detached
                    queue = self._queue
                    self._backlog = False
                    if queue:  # everything queued leaves in one write
                        items = list(queue)
                        queue.clear()
                        nbytes, frames = self.queued_bytes, self.queued_frames
                        self.queued_bytes = self.queued_frames = 0
                        self.sending = True
                    else:
                        items = None
                if items is None:
                    if self.closed:
                        return
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                try:
                    if send_frames is not None:
                        await send_frames(items)
                    else:
                        await stream.send_all(items[0] if len(items) == 1 else b"".join(items))
                finally:
                    with self.lock:
                        if self.stream is stream:
                            self.sending = False
                        self._release(nbytes)
                stats = self.stats
                stats.writes += 1
                stats.bytes_sent += nbytes
                stats.frames_sent += frames
        finally:
            with self.lock:
                if self.stream is stream:
                    self.stream, self.sending = None, False
