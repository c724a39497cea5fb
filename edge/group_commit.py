"""Group commit: one writer thread, and everything queued during a write shares the next one
(trio edge).

The Zab log writer (zab/edge/log_writer.py) and the bookie's storage (bookie/storage_commit.py)
make records durable the same way, written once here: the event loop `submit`s work and never
blocks on the disk; one thread at a time performs `write(items)` (the write and its fsync), with
everything that was queued while the previous write and fsync ran; `after_sync` runs in that
thread the moment the write returns (an answer can leave without waking the event loop); the
outcomes come back to the event loop in the order written, through `take_done()` and an
`on_done` wake-up. What each log writes, and what an outcome means, is its own.

Fail-stop: after a write raises, nothing more is written (the kernel's view of the file is no
longer trustworthy, edge/segments.py's FailStop). That write's items and every later
submission come back with the error, in order, so every waiter learns it.

Why a long-lived thread woken through a pipe rather than a thread hand-off per write
(trio.to_thread.run_sync, or trio.lowlevel.start_thread_soon): the event loop's os.write to the
pipe releases the GIL for the system call, so the woken thread takes it and starts the disk
write at once instead of when the loop's pass ends; and a write costs one wake-up each way, no
writer task, capacity limiter or checkpoint. A writer idle for `idle_exit_s` lets its thread end
(the next submission starts another), so an owner that is never closed (a bookie's storage in a
test) holds no thread; one with an explicit lifetime (the Zab log writer's `run`) keeps it.

Byte-bounded backpressure (issue 17): the bytes submitted and not yet written are counted, and
producers may `await wait_room()` until they are below `max_queued_bytes`.
"""

from __future__ import annotations

import collections
import os
import select
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

from edge import metrics

T = TypeVar("T")
R = TypeVar("R")


class Written(Generic[T, R]):
    """One write's outcome, handed back to the event loop: the items written together, what
    `after_sync` made of the write's result (`value`), or the `error` that stopped the writer."""

    __slots__ = ("items", "value", "error")

    def __init__(self, items: list[T], value: R | None, error: BaseException | None) -> None:
        self.items, self.value, self.error = items, value, error


class GroupCommitWriter(Generic[T, R]):
    """One writer thread for one log. From the event loop: `submit`, `take_done`, `wait_room`,
    `close`. In the writer's thread: `write(items) -> result`, then `after_sync(items, result)`,
    whose return value is handed back (None: nothing for the event loop, which is not woken).
    `on_done()` runs in the event loop when finished writes wait in `take_done()`; it must not
    raise, and it need not take them (they wait for the next `take_done()`)."""

    def __init__(self, write: Callable[[list[T]], R], *, on_done: Callable[[], None],
                 after_sync: Callable[[list[T], R], R | None] | None = None,
                 max_queued_bytes: int | None = None, idle_exit_s: float | None = 10.0,
                 name: str = "quire-group-commit", metrics_log: str | None = None) -> None:
        self._write, self._on_done, self._after_sync = write, on_done, after_sync
        # (duration, batch size) histograms of edge/metrics.py, for a log the node's metrics name
        self._observed = None if metrics_log is None else (
            metrics.FSYNC_SECONDS.labels(metrics_log), metrics.FSYNC_BATCH.labels(metrics_log))
        self.max_queued_bytes, self.idle_exit_s, self.name = max_queued_bytes, idle_exit_s, name
        # Submissions in order (the event loop appends, the thread pops: no lock needed under the GIL).
        self._todo: collections.deque[tuple[list[T], int]] = collections.deque()
        # What finished writes hand back, until the event loop takes it.
        self.done: collections.deque[Written[T, R]] = collections.deque()
        # The thread sleeps on this pipe (see the module doc); a wake-up byte means "look at _todo".
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already holds a wake-up: never block the loop
        # An owner that is never closed (a bookie storage a test drops) returns the descriptors when
        # collected; the thread holds the writer while it runs, so that never happens under it.
        self._close_pipe = weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._close_pipe.atexit = False  # a daemon thread may still sleep on it while the interpreter exits
        self._pipe_open = True
        # A wake-up byte is on its way or the thread is awake: it looks at _todo before it sleeps
        # again, so the flushes of a busy write cost no system call each.
        self._wake_pending = False
        self._lock = threading.Lock()  # starting a thread vs. an idle one ending: never two writers
        self._running = False
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None  # of the latest submission's run
        self._closing = False
        self.failed: BaseException | None = None  # set by the thread: nothing more is written
        # Each counter has one writing thread (submitted: the event loop; written: the writer's).
        self._items_submitted = self._items_written = 0
        self._bytes_submitted = self._bytes_written = 0
        self._room: trio.Event | None = None
        self._room_wanted = False
        self.writes = 0

    # --- the event loop's side ---------------------------------------------------------------

    def submit(self, items: list[T], nbytes: int = 0) -> None:
        """Queue `items` (handed over: the writer may extend the list) holding `nbytes` for the
        byte bound, and wake the writer. Dropped after close(): the owner is stopping."""
        if self._closing:
            return
        self._token = trio.lowlevel.current_trio_token()
        self._items_submitted += len(items)
        self._bytes_submitted += nbytes
        self._todo.append((items, nbytes))
        if self._running:
            self._wake()
        else:
            self.start()

    def start(self) -> None:
        """Start the writer's thread now unless it runs (submit starts it when needed)."""
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        with self._lock:
            if self._running or self._closing:
                return
            self._running = True
            self._thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
            self._thread.start()

    def take_done(self) -> list[Written[T, R]]:
        """What every write finished since the last call handed back, oldest first: the owner
        may take it before the thread's wake-up comes round (that wake-up then finds nothing)."""
        done = self.done
        return [done.popleft() for _ in range(len(done))]

    @property
    def queued(self) -> int:
        """Items submitted and not yet written."""
        return self._items_submitted - self._items_written

    @property
    def queued_bytes(self) -> int:
        """Bytes submitted and not yet written."""
        return self._bytes_submitted - self._bytes_written

    async def wait_room(self) -> None:
        """Return once the bytes queued are below max_queued_bytes (at once, without a checkpoint,
        when they are already, or when there is no bound, or after a failure)."""
        bound = self.max_queued_bytes
        while bound is not None and self.queued_bytes >= bound and self.failed is None:
            if self._room is None:
                self._room = trio.Event()
            room = self._room
            self._room_wanted = True
            # The thread checks the flag after counting what it wrote: check again now that the
            # flag is set, or a write finished in between would wake nobody.
            if self.queued_bytes < bound:
                break
            await room.wait()

    def close(self) -> None:
        """No more submissions; the thread ends once what was submitted is written."""
        self._closing = True
        if self._running:
            self._wake()

    async def wait_closed(self) -> None:
        """After close(): until a write in progress has finished and the thread has ended, so the
        owner may close its files. Then the wake-up pipe is closed."""
        thread = self._thread
        if thread is not None:
            await trio.to_thread.run_sync(thread.join)
        self._pipe_open = False
        self._close_pipe()

    def statistics(self) -> dict:
        """Writes done, and what is submitted but not yet written."""
        return dict(writes=self.writes, queued=self.queued, queued_bytes=self.queued_bytes)

    def _wake(self) -> None:
        if self._wake_pending or not self._pipe_open:  # closed: the number may name another file now
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _room_made(self) -> None:
        room, self._room = self._room, None
        if room is not None:
            room.set()

    def _handed_back(self) -> None:
        if self.done:
            self._on_done()

    # --- the writer's thread -------------------------------------------------------------------

    def _thread_main(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            items, nbytes = taken
            value, error = self._perform(items)
            self._items_written += len(items)
            self._bytes_written += nbytes
            if self._room_wanted:
                self._room_wanted = False
                self._call_soon(self._room_made)
            if error is None and value is None:
                continue  # nothing for the event loop: do not wake it
            self.done.append(Written(items, value, error))  # before the wake-up: the owner may take it sooner
            self._call_soon(self._handed_back)

    def _perform(self, items: list[T]) -> tuple[R | None, BaseException | None]:
        if self.failed is not None:
            return None, self.failed
        try:
            self.writes += 1
            if self._observed is not None and metrics.ENABLED:
                start = time.perf_counter()
                result = self._write(items)
                seconds, batch = self._observed
                seconds.observe(time.perf_counter() - start)
                batch.observe(len(items))
            else:
                result = self._write(items)
            return (result if self._after_sync is None else self._after_sync(items, result)), None
        except BaseException as err:  # handed back to every waiter; a bug in after_sync stops it too
            self.failed = err
            return None, err

    def _call_soon(self, callback: Callable[[], None]) -> None:
        token = self._token
        assert token is not None
        try:
            token.run_sync_soon(callback)
        except trio.RunFinishedError:
            pass  # that run is over: nobody there waits

    def _take(self) -> tuple[list[T], int] | None:
        """Block until something is queued; take all of it (group commit). None: the thread ends."""
        todo = self._todo
        while not todo:
            if self._closing:
                return self._stop()
            # Cleared before _todo and _closing are looked at again, while submit() and close() set
            # them before they look at the flag: one side sees the other, no wake-up is lost.
            self._wake_pending = False
            if todo or self._closing:
                continue
            if not self._sleep():
                if self._idle_exit():
                    return None
        items, nbytes = todo.popleft()
        while todo:
            more, more_bytes = todo.popleft()
            items += more
            nbytes += more_bytes
        return items, nbytes

    def _sleep(self) -> bool:
        """Wait for a wake-up byte; False after idle_exit_s without one."""
        if self.idle_exit_s is not None:
            ready, _, _ = select.select([self._wake_r], [], [], self.idle_exit_s)
            if not ready:
                return False
        os.read(self._wake_r, 4096)  # wake-ups are counted by the queue, not the pipe
        return True

    def _idle_exit(self) -> bool:
        """Whether this idle thread may end. Marked not running before the queue is looked at
        again, while submit() appends before it looks at the flag: one of them sees the other."""
        with self._lock:
            self._running = False
        if not self._todo and not self._closing:
            return True
        with self._lock:
            if self._running:
                return True  # a submission started another thread meanwhile: it takes over
            self._running = True
            return False

    def _stop(self) -> None:
        with self._lock:
            self._running = False


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
