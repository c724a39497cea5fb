"""The single writer of a node's transaction log and snapshots (trio edge).

The core's log actions queue here in order. One long-lived thread takes
everything queued, performs it (fsync never runs on the event loop), fsyncs
once for all appended records (group commit), and hands the actions the core
attached to its LogSyncs back to the trio thread, which runs them only then.
Because there is exactly one writer and it consumes actions in order, a role
change can never leave an older persistence task writing after a truncation
(ZOOKEEPER-4712).

The thread, its batching, its hand-back through the trio token, fail-stop and
the byte bound are edge/group_commit.py's (shared with the bookie's storage);
what a batch does, and what it releases, are this module's.

A follower's batch releases nothing but its ACK to the leader. The thread
hands those to `send_now` (the transport's send_from_thread, via the driver),
which writes them to the leader's link right after the fsync when the link is
idle; then the event loop is not woken at all. Whatever `send_now` leaves
goes back to the trio thread in order, as before.

A local snapshot is not written here: the batch that meets TakeSnapshot makes the log durable
up to it and hands the frozen view to zab/edge/snapshotter.py, whose own thread writes it while
appends go on; its purge of older snapshots and log segments comes back here, in order with the
log's other changes.

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
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from zab.core.acks import coalesce_acks
from zab.core.actions import (Action, InstallSnapshot, LogAppend, LogSync, LogTruncate, Send, SnapBegin, SnapDiscard,
                              SnapWrite, TakeSnapshot)
from zab.core.history import txn_bytes
from zab.core.messages import Ack
from zab.edge.snapshotter import SnapshotDue, Snapshotter
from zab.storage.recovery import apply_purge
from edge.group_commit import GroupCommitWriter
from zab.storage.storage_errors import FIX_THE_DISK, DiskWriteFailed
from zab.storage.snapshot import RECEIVING_SUFFIX, PurgePlan, SnapshotFile, SnapshotStore
from zab.storage.txnlog import TxnLog

log = logging.getLogger("quire.zab.log_writer")

DEFAULT_MAX_QUEUED_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class PurgeAfterSnapshot:
    """Snapshotter -> log writer: the snapshot at `zxid` is durable; `plan`'s older snapshots and
    the log segments only they needed may go (in the writer's thread, the one owner of the log's
    files; the plan was made, reading the kept snapshots through, on the snapshotter's)."""
    zxid: int
    plan: PurgePlan


class LogWriter:
    """The node's one writer of its log and snapshots, on an edge/group_commit.py writer: submit
    and flush from the driver's steps, `run` in its nursery (it raises the disk's failure)."""

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
        # Backpressure (issue 17): producers await wait_room() (the driver, before a client request
        # and before each read of a peer link). The thread lives as long as run(): no idle exit.
        self._commit: GroupCommitWriter[Action, list[Action]] = GroupCommitWriter(
            self._write, on_done=self._batch_done, after_sync=self._release, max_queued_bytes=max_queued_bytes,
            idle_exit_s=None, name="quire-log-writer", metrics_log="txnlog")
        self.max_queued_bytes = max_queued_bytes
        self.acks_sent_from_thread = 0
        self._error: BaseException | None = None  # from the thread or from on_done, raised by run()
        self._error_event = trio.Event()
        self._stopping = False
        self.fsync_seconds_total = 0.0
        self.snapshotter = Snapshotter(snapshots, snapshots_retained, self._purge_after)
        self._receiving: SnapshotFile | None = None  # a SNAP being received (SnapBegin .. Install/Discard)

    @property
    def _done(self) -> collections.deque:
        """What finished batches handed back, until the trio thread takes it (the engine's)."""
        return self._commit.done

    @_done.setter
    def _done(self, done: collections.deque) -> None:
        self._commit.done = done  # a test watches the thread's appends through its own deque

    @property
    def batches(self) -> int:
        """Batches written (each one fsync at most)."""
        return self._commit.writes

    def submit(self, action: Action) -> None:
        """Queue `action`; it reaches the thread at the next flush() (the driver's end of step)."""
        self._pending.append(action)

    def flush(self) -> None:
        """Hand what was submitted to the thread in one piece: a proposal's LogAppend and
        its LogSync then share one fsync instead of racing the thread into two."""
        if self._pending:
            self._commit.submit(self._pending, sum(map(_action_bytes, self._pending)))
            self._pending = []

    @property
    def queued_bytes(self) -> int:
        """Bytes of log actions handed to the thread and not yet performed."""
        return self._commit.queued_bytes

    async def wait_room(self) -> None:
        """Return once the writer's backlog is below max_queued_bytes (at once, without a
        checkpoint, when it is already)."""
        await self._commit.wait_room()

    async def run(self) -> None:
        """Run the writer's thread until cancelled; raises the disk's failure (or a bug in the
        thread or in on_done). On the way out, a write in progress finishes first."""
        self._commit.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_snapshotter)
                try:
                    await self._error_event.wait()
                    assert self._error is not None
                    raise self._error  # the disk failed (or a bug): the node stops rather than ack what it may not have
                finally:
                    self.snapshotter.stop()  # a snapshot being written ends at its next piece
        finally:
            self._stopping = True
            self._commit.close()
            # The log is closed after this returns: let a write in progress finish first.
            with trio.CancelScope(shield=True):
                await self._commit.wait_closed()

    async def _run_snapshotter(self) -> None:
        try:
            await self.snapshotter.run()
        except OSError as e:  # fail-stop, as a log write's (the txn log's own FailStop raises DiskWriteFailed)
            raise DiskWriteFailed(f"writing a snapshot in {self.snapshots.directory}: {e}; {FIX_THE_DISK}") from e

    def _release(self, batch: list[Action], then: list[Action]) -> list[Action] | None:
        """Writer's thread, after the fsync: what the batch released, its ACKs coalesced, those
        to other nodes sent at once when that is all (send_now); None when nothing is left."""
        if not then:
            return None
        then = coalesce_acks(then)
        if self.send_now is not None and not self._stopping and send_acks(then):
            left = self.send_now(then)
            self.acks_sent_from_thread += len(then) - len(left)
            then = left
        return then or None

    def take_done(self) -> list[list[Action]]:
        """In the trio thread: what every batch finished since the last call released, oldest
        first (each list after the fsync of its batch). The driver runs them in that order."""
        done: list[list[Action]] = []
        for written in self._commit.take_done():
            if written.error is not None:
                self._fail(written.error)  # what was written before it is still run, in order
                break
            then = written.value
            if any(type(a) is SnapshotDue for a in then):
                for due in then:
                    if type(due) is SnapshotDue:
                        self.snapshotter.offer(due)
                then = [a for a in then if type(a) is not SnapshotDue]
            done.append(then)
        return done

    def _purge_after(self, zxid: int, plan: PurgePlan) -> None:
        """In the trio thread, from the snapshotter: queue the purge the snapshot at `zxid` allows."""
        self._commit.submit([PurgeAfterSnapshot(zxid, plan)])

    def _batch_done(self) -> None:
        """In the trio thread, as the engine's wake-up: has the driver run what waited for the
        fsync (if it has not taken it already), one task switch sooner than waking a task for
        it. A failure is handed to run(), which raises it in the nursery: the wake-up must not
        raise. Wake-ups come in the order written, so a batch's failure is reported after
        everything earlier batches released."""
        if self._stopping or self._error is not None:
            return
        try:
            self.on_done()
        except BaseException as e:  # re-raised by run(): a bug is a crash, not a TrioInternalError
            self._fail(e)
            return
        if self._commit.failed is not None:
            self._fail(self._commit.failed)  # on_done need not take: a failure is reported all the same

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            self._error_event.set()

    def _write(self, batch: list[Action]) -> list[Action]:
        """Worker thread: perform `batch` in order; one fsync covers all appends."""
        then: list[Action] = []
        dirty = synced = False
        for a in batch:
            if isinstance(a, LogAppend):
                self.txnlog.append(a.txns)
                dirty = True
            elif isinstance(a, LogSync):
                then.extend(a.then)
                synced = True
            elif isinstance(a, SnapWrite):
                self._receive(a)
                then.extend(a.then)  # a SNAPACK: the chunk is written; the fsync comes at the install
            elif isinstance(a, (SnapBegin, SnapDiscard)):
                self._begin_or_discard(a)
            elif isinstance(a, LogTruncate):
                self._sync(dirty)
                dirty = False
                self.txnlog.truncate_after(a.zxid)
            elif isinstance(a, InstallSnapshot):
                self._install(a, dirty)
                dirty = False
            elif isinstance(a, TakeSnapshot):
                self._sync(dirty)  # the log is durable up to the snapshot before it is written
                dirty = False
                then.append(SnapshotDue(a.frozen))
            elif isinstance(a, PurgeAfterSnapshot):
                self._purge(a)
            else:
                raise TypeError(f"not a log action: {a!r}")
        self._sync(dirty or synced)
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
        received, self._receiving = self._receiving, None
        assert received is not None and received.zxid == a.zxid, f"InstallSnapshot({a.zxid:#x}) without its SnapBegin"
        base = self.txnlog.base_zxid
        if base is None or base <= a.zxid:
            self.txnlog.truncate_after(a.zxid)
        received.commit()  # fsync, header, rename: the received file is the snapshot now
        log.info("event=snap_installed zxid=%#x bytes=%d", a.zxid, received.body_length)
        self.txnlog.reset(base_zxid=a.zxid)
        self.snapshots.remove([path for zxid, path in self.snapshots.files() if zxid != a.zxid])

    def _purge(self, a: PurgeAfterSnapshot) -> None:
        result = apply_purge(a.plan, self.snapshots, self.txnlog)
        log.info("event=snapshot_purge zxid=%#x purged_snapshots=%d purged_segments=%d",
                 a.zxid, len(result.snapshots_removed), result.segments_removed)

    def _begin_or_discard(self, a: SnapBegin | SnapDiscard) -> None:
        """A SNAP's partial file: any earlier one goes (a transfer cut before the core said so
        cannot leave it behind), and SnapBegin starts the new one."""
        if self._receiving is not None:
            log.warning("event=snap_discarded zxid=%#x bytes=%d (the transfer was cut; the next sync starts over)",
                        self._receiving.zxid, self._receiving.body_length)
            self._receiving.abort()
            self._receiving = None
        if isinstance(a, SnapBegin):
            self._receiving = self.snapshots.begin(a.zxid, RECEIVING_SUFFIX)

    def _receive(self, a: SnapWrite) -> None:
        assert self._receiving is not None, "SnapWrite without SnapBegin"
        self._receiving.write(a.data)

    def statistics(self) -> dict:
        stats = dict(self.txnlog.statistics())
        stats.update(batches=self.batches, fsync_seconds_total=round(self.fsync_seconds_total, 6),
                     snapshots_taken=self.snapshotter.taken, snapshots_skipped=self.snapshotter.skipped,
                     acks_sent_from_thread=self.acks_sent_from_thread,
                     queued=self._commit.queued + len(self._pending), queued_bytes=self.queued_bytes)
        return stats


def _action_bytes(a: Action) -> int:
    """What a queued log action holds in memory, as the writer's byte bound counts it."""
    if isinstance(a, LogAppend):
        return sum(map(txn_bytes, a.txns))
    if isinstance(a, SnapWrite):
        return len(a.data)
    return 0


def send_acks(actions: list[Action]) -> bool:
    """Whether `actions` are only ACKs to other nodes: what a follower's fsync releases, and
    all the writer's thread may send itself (anything else runs on the trio thread, in order)."""
    return all(type(a) is Send and type(a.msg) is Ack for a in actions)
