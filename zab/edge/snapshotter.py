"""Local snapshots written beside the log, not in its way (trio edge).

A periodic snapshot used to be written by the log writer's thread between two batches of
appends. With a large tree that is seconds (a million znodes: about 3 s of encoding; a
gigabyte: a second of writing and its fsync), and no proposal was logged, acknowledged or
committed meanwhile. Every node counts the same delivered transactions, so every node
snapshotted at the same moment and the whole ensemble stopped writing: kazoo clients, whose
pings are answered in order behind their writes, gave up on their servers (the large-tree
benchmark lost thousands of connections loading a million znodes). ZooKeeper takes its
snapshots in a thread of their own for the same reason.

Here the log writer makes the log durable up to the snapshot's zxid (so a snapshot never gets
ahead of the log it cuts), then hands the frozen view back; `Snapshotter.run` writes it on a
worker thread of its own while appends go on, and when the file is durable hands the log writer
a purge, which runs in the writer's thread like every other change to the log's files.

One snapshot at a time: one that falls due while the last is still being written is skipped
(ZooKeeper does the same), since the next one comes `snapshot_every_txns` later anyway.
A failure to write one ends the node like any other disk failure (fail-stop): `run` raises it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from zab.core.statemachine import Frozen
from zab.storage.snapshot import PurgePlan, SnapshotStore

log = logging.getLogger("quire.zab.snapshotter")

# A local snapshot is encoded and written in pieces of this size: the writer never holds the whole.
SNAPSHOT_WRITE_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class SnapshotDue:
    """Log writer -> snapshotter, after the fsync that made the log durable up to `frozen.zxid`."""
    frozen: Frozen


class SnapshotCancelled(Exception):
    """The node is stopping: the snapshot being written is abandoned (its temporary file goes)."""


class Snapshotter:
    """Writes the node's local snapshots one at a time on a worker thread. `offer` from the
    trio thread; `run` in the log writer's nursery; `purge(zxid, plan)` is called in the trio
    thread after each durable snapshot (the log writer queues the plan for its own thread)."""

    def __init__(self, snapshots: SnapshotStore, keep: int, purge: Callable[[int, PurgePlan], None]) -> None:
        self.snapshots = snapshots
        self.keep = keep
        self._purge = purge
        self._send, self._receive = trio.open_memory_channel[Frozen](1)
        self._busy = False
        self._stopping = threading.Event()  # read by the worker thread between pieces
        self.taken = 0
        self.skipped = 0
        self._taken_changed = trio.Event()

    def offer(self, due: SnapshotDue) -> None:
        """A snapshot fell due: write it unless one is being written already."""
        if self._busy or self._stopping.is_set():
            self.skipped += 1
            log.info("event=snapshot_skipped zxid=%#x (the previous snapshot is still being written)",
                     due.frozen.zxid)
            return
        self._busy = True  # before the task takes it: a second offer in the same step is skipped
        self._send.send_nowait(due.frozen)

    async def run(self) -> None:
        """Write each offered snapshot until cancelled; raises a write's failure. Call `stop`
        before cancelling it: a snapshot in progress then ends at its next piece."""
        async for frozen in self._receive:
            try:
                plan = await trio.to_thread.run_sync(self._write, frozen, abandon_on_cancel=False)
            except SnapshotCancelled:
                return
            finally:
                self._busy = False
            self.taken += 1
            self._taken_changed.set()
            self._taken_changed = trio.Event()
            self._purge(frozen.zxid, plan)

    def stop(self) -> None:
        """Have a snapshot in progress give up at its next piece (the node is stopping)."""
        self._stopping.set()

    async def wait_taken(self, count: int) -> None:
        """Return once `count` snapshots have been written since the start (tests, tools)."""
        while self.taken < count:
            await self._taken_changed.wait()

    def _write(self, frozen: Frozen) -> PurgePlan:
        """Worker thread: encode and write the view piece by piece, fsync and rename it, then
        plan the purge it allows (reading the kept snapshots through, off the log's thread)."""
        started = time.perf_counter()
        file = self.snapshots.begin(frozen.zxid)
        try:
            for chunk in frozen.chunks(SNAPSHOT_WRITE_CHUNK_BYTES):
                if self._stopping.is_set():
                    raise SnapshotCancelled
                file.write(chunk)
        except BaseException:
            file.abort()
            raise
        written = time.perf_counter()
        file.commit()
        # write_s: encoded and in the page cache; sync_s: the fsync, header and rename that make it durable.
        log.info("event=snapshot zxid=%#x bytes=%d write_s=%.3f sync_s=%.3f", frozen.zxid, file.body_length,
                 written - started, time.perf_counter() - written)
        return self.snapshots.plan_purge(self.keep)
