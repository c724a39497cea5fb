"""The single writer of a node's transaction log and snapshots (trio edge).

The core's log actions queue here in order. One long-lived thread takes
everything queued, performs it (fsync never runs on the event loop), fsyncs
once for all appended records (group commit), and hands the actions the core
attached to its LogSyncs back to the trio thread, which runs them only then.
Because there is exactly one writer and it consumes actions in order, a role
change can never leave an older persistence task writing after a truncation
(ZOOKEEPER-4712).

The thread is fed through a queue.SimpleQueue and answers through the trio
token: a batch costs one wake-up each way, where trio.to_thread.run_sync per
batch also woke a writer task, took a capacity limiter and a checkpoint. The
thread sleeps on a pipe rather than in the queue's get(): the event loop's
os.write to it releases the GIL, so the woken thread starts the disk write at
once instead of waiting for the loop's pass to end.

A follower's batch releases nothing but its ACK to the leader. The thread
hands those to `send_now` (the transport's send_from_thread, via the driver),
which writes them to the leader's link right after the fsync when the link is
idle; then the event loop is not woken at all. Whatever `send_now` leaves
goes back to the trio thread in order, as before.

What a finished batch releases waits in `take_done()` for the trio thread,
and `on_done` (a run_sync_soon callback) tells the driver to take it. The
driver also takes it before it steps any other event: on a leader, whose own
ACK is such a release, a follower's ACK that arrives after the leader's fsync
then finds the leader's vote already counted, instead of committing only on the
second follower's ACK or once the callback's wake-up has come round (in a probe
of lone writes on the benchmark machine the leader's own fsync ended before
the first follower ACK arrived in about half the writes, while its release
reached the event loop after that ACK in about 80%).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import trio

from zab.core.acks import coalesce_acks
from zab.core.actions import Action, InstallSnapshot, LogAppend, LogSync, LogTruncate, Send, TakeSnapshot
from zab.core.history import txn_bytes
from zab.core.messages import Ack
from zab.storage.recovery import purge
from edge.files import fsync_directory
from zab.storage.snapshot import SnapshotStore
from zab.storage.txnlog import TxnLog

log = logging.getLogger("quire.zab.log_writer")

DEFAULT_MAX_QUEUED_BYTES = 64 << 20


class LogWriter:
    def __init__(self, txnlog: TxnLog, snapshots: SnapshotStore, *, snapshots_retained: int,
                 on_done: Callable[[], None],
                 send_now: Callable[[list[Action]], list[Action]] | None = None,
                 max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES) -> None:
        self.txnlog = txnlog
        self.snapshots = snapshots
        self.snapshots_retained = snapshots_retained
        self.on_done = on_done  # in the trio thread: batches finished, take_done() has their releases
        # In the writer's thread, with a batch's released actions: sends what it can at once,
        # returns the rest (in order) for take_done. Only ever given ACK-only lists (see send_acks).
        self.send_now = send_now
        self._pending: list[Action] = []  # submitted in this step, not yet handed to the thread
        # Each item: the actions of one flush() and the bytes they hold (counted once, on submit).
        self._todo: queue.SimpleQueue[tuple[list[Action], int] | None] = queue.SimpleQueue()
        # The thread sleeps in os.read on this pipe; flush() wakes it with os.write, which releases
        # the GIL for the system call, so the thread takes the GIL and starts its write at once
        # rather than waiting for the event loop's pass to end (SimpleQueue.put holds the GIL).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already holds a wake-up: never block the loop
        # What finished batches released, in order, until the trio thread takes it (deque: the
        # thread appends and the trio thread pops without a lock).
        self._done: collections.deque[list[Action]] = collections.deque()
        self._submitted = 0  # actions handed to the thread (counted by the trio thread)
        self._performed = 0  # ... and performed (counted by the writer's thread)
        # Backpressure (issue 17): the bytes handed to the thread and not yet written are bounded
        # by max_queued_bytes; producers await wait_room() (the driver, before a client request
        # and before each read of a peer link). Each counter has one writing thread.
        self.max_queued_bytes = max_queued_bytes
        self._bytes_submitted = 0
        self._bytes_performed = 0
        self._room: trio.Event | None = None  # set by the trio thread when a waiter needs a wake-up
        self._room_wanted = False
        self.acks_sent_from_thread = 0
        self._error: BaseException | None = None  # from the thread or from on_done, raised by run()
        self._error_event = trio.Event()
        self._stopping = False
        self._closed = False  # run() has closed the wake-up pipe
        self.batches = 0
        self.fsync_seconds_total = 0.0
        self.snapshots_taken = 0

    def submit(self, action: Action) -> None:
        """Queue `action`; it reaches the thread at the next flush() (the driver's end of step)."""
        self._pending.append(action)

    def flush(self) -> None:
        """Hand what was submitted to the thread in one piece: a proposal's LogAppend and
        its LogSync then share one fsync instead of racing the thread into two."""
        if self._pending:
            nbytes = sum(map(_action_bytes, self._pending))
            self._submitted += len(self._pending)
            self._bytes_submitted += nbytes
            self._todo.put((self._pending, nbytes))
            self._pending = []
            self._wake()

    @property
    def queued_bytes(self) -> int:
        """Bytes of log actions handed to the thread and not yet performed."""
        return self._bytes_submitted - self._bytes_performed

    async def wait_room(self) -> None:
        """Return once the writer's backlog is below max_queued_bytes (at once, without a
        checkpoint, when it is already)."""
        while self.queued_bytes >= self.max_queued_bytes and self._error is None:
            if self._room is None:
                self._room = trio.Event()
            room = self._room
            self._room_wanted = True
            # The thread checks the flag after counting what it performed: check again now
            # that the flag is set, or a batch finished in between would wake nobody.
            if self.queued_bytes < self.max_queued_bytes:
                break
            await room.wait()

    def _room_made(self) -> None:
        """In the trio thread (run_sync_soon from the writer's thread): wake wait_room()."""
        room, self._room = self._room, None
        if room is not None:
            room.set()

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._thread_main, args=(token,), name="quire-log-writer", daemon=True)
        thread.start()
        try:
            await self._error_event.wait()
            assert self._error is not None
            raise self._error  # the disk failed (or a bug): the node stops rather than ack what it may not have
        finally:
            self._stopping = True
            self._todo.put(None)
            self._wake()
            # The log is closed after this returns: let a write in progress finish first.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wake(self) -> None:
        if self._closed:
            # The node is stopping: a step still running in another task of its nursery may flush,
            # but the pipe is closed (and its descriptor number may already name another file).
            return
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _thread_main(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            try:
                item = self._todo.get_nowait()
            except queue.Empty:
                os.read(self._wake_r, 4096)  # wake-ups are counted by the queue, not the pipe
                continue
            if item is None:
                return
            batch, nbytes = item
            while True:  # group commit: everything queued meanwhile shares this fsync
                try:
                    more = self._todo.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._todo.put(None)
                    break
                batch += more[0]
                nbytes += more[1]
            try:
                then, error = self._write(batch), None
            except BaseException as e:  # reported to the trio thread, which raises it
                then, error = [], e
            self.batches += 1
            self._performed += len(batch)
            self._bytes_performed += nbytes
            if self._room_wanted:
                self._room_wanted = False
                try:
                    token.run_sync_soon(self._room_made)
                except trio.RunFinishedError:
                    return
            if error is None and then:
                try:
                    then = coalesce_acks(then)
                    if self.send_now is not None and not self._stopping and send_acks(then):
                        left = self.send_now(then)
                        self.acks_sent_from_thread += len(then) - len(left)
                        then = left
                except BaseException as e:  # a bug: raised by run() like a disk failure, never a dead thread
                    then, error = [], e
            if error is None and not then:
                continue  # nothing for the event loop: do not wake it
            if error is None:
                self._done.append(then)  # before the wake-up: the driver may take it sooner still
            try:
                token.run_sync_soon(self._batch_done, error)
            except trio.RunFinishedError:
                return
            if error is not None:
                return

    def take_done(self) -> list[list[Action]]:
        """In the trio thread: what every batch finished since the last call released, oldest
        first (each list after the fsync of its batch). The driver runs them in that order."""
        done: list[list[Action]] = []
        while self._done:
            done.append(self._done.popleft())
        return done

    def _batch_done(self, error: BaseException | None) -> None:
        """In the trio thread, as a run_sync_soon callback: has the driver run what waited for
        the fsync (if it has not taken it already), one task switch sooner than waking a task
        for it. Such a callback must not raise, so a failure is handed to run(), which raises
        it in the nursery. Callbacks run in the order the thread queued them, so a batch's
        failure is reported after everything earlier batches released."""
        if self._stopping or self._error is not None:
            return
        if error is None and self._done:
            try:
                self.on_done()
            except BaseException as e:  # re-raised by run(): a bug is a crash, not a TrioInternalError
                error = e
        if error is not None:
            self._error = error
            self._error_event.set()

    def _write(self, batch: list[Action]) -> list[Action]:
        """Worker thread: perform `batch` in order; one fsync covers all appends."""
        then: list[Action] = []
        dirty = False
        for a in batch:
            if isinstance(a, LogAppend):
                self.txnlog.append(a.txns)
                dirty = True
            elif isinstance(a, LogSync):
                then.extend(a.then)
            elif isinstance(a, LogTruncate):
                self._sync(dirty)
                dirty = False
                self.txnlog.truncate_after(a.zxid)
            elif isinstance(a, InstallSnapshot):
                self._install(a, dirty)
                dirty = False
            elif isinstance(a, TakeSnapshot):
                self._sync(dirty)
                dirty = False
                self._snapshot(a)
            else:
                raise TypeError(f"not a log action: {a!r}")
        self._sync(dirty or bool(then))
        return then

    def _sync(self, dirty: bool) -> None:
        if dirty:
            start = time.perf_counter()
            self.txnlog.sync()
            self.fsync_seconds_total += time.perf_counter() - start

    def _install(self, a: InstallSnapshot, dirty: bool) -> None:
        # Cut the log back to the snapshot first: a crash between the steps then
        # leaves an older but consistent prefix, never records of another history
        # beyond the snapshot (ZOOKEEPER-3104 / 3642).
        # Our own state may be ahead of the leader's snapshot (it delivered less than
        # we did before it was elected); then the log stays until the new snapshot is
        # durable, and older state files go last, so every crash point recovers a
        # consistent state.
        self._sync(dirty)
        base = self.txnlog.base_zxid
        if base is None or base <= a.zxid:
            self.txnlog.truncate_after(a.zxid)
        self.snapshots.write(a.zxid, a.state)
        self.txnlog.reset(base_zxid=a.zxid)
        stale = [path for zxid, path in self.snapshots.files() if zxid != a.zxid]
        for path in stale:
            path.unlink()
        if stale:
            fsync_directory(self.snapshots.directory)

    def _snapshot(self, a: TakeSnapshot) -> None:
        state = a.frozen.to_bytes()
        self.snapshots.write(a.frozen.zxid, state)
        self.snapshots_taken += 1
        result = purge(self.snapshots, self.txnlog, self.snapshots_retained)
        log.info("event=snapshot zxid=%#x bytes=%d purged_snapshots=%d purged_segments=%d",
                 a.frozen.zxid, len(state), len(result.snapshots_removed), result.segments_removed)

    def statistics(self) -> dict:
        stats = dict(self.txnlog.statistics())
        stats.update(batches=self.batches, fsync_seconds_total=round(self.fsync_seconds_total, 6),
                     snapshots_taken=self.snapshots_taken, acks_sent_from_thread=self.acks_sent_from_thread,
                     queued=self._submitted - self._performed + len(self._pending),
                     queued_bytes=self.queued_bytes)
        return stats


def _action_bytes(a: Action) -> int:
    """What a queued log action holds in memory, as the writer's byte bound counts it."""
    if isinstance(a, LogAppend):
        return sum(map(txn_bytes, a.txns))
    if isinstance(a, InstallSnapshot):
        return len(a.state)
    return 0


def send_acks(actions: list[Action]) -> bool:
    """Whether `actions` are only ACKs to other nodes: what a follower's fsync releases, and
    all the writer's thread may send itself (anything else runs on the trio thread, in order)."""
    return all(type(a) is Send and type(a.msg) is Ack for a in actions)
