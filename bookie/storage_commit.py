"""Group commit for BookieStorage (trio edge): the open batch, one batch write at a time in the
writer's thread, and the disk lock that checkpoints and compactions share with it.

Callers never write themselves. `join` puts records into the open batch; `start` hands that batch
at once to the writer's thread (edge/group_commit.py, never the event loop) if the disk is idle,
synchronously: no task stands between a request and its fsync. Back in the event loop (the
writer's wake-up) the storage applies the batch, its waiters and callbacks learn the outcome, and
the next batch, of everything that joined meanwhile, starts right there. Batches grow with load:
whatever arrives during one fsync goes into the next. A waiter's cancellation never stops a write
others wait on. Checkpoints and compactions hold the disk (`disk(priority=True)`) between two
batches; while one waits, no batch starts (otherwise a steady add stream would starve it).

The batching happens here, not in the engine: one Batch (one done event, one list of callbacks)
collects every join while a write is in flight, where submitting each join to the engine would
make a Batch per request.

A batch's `after_sync` callables run in the writer's thread right after its fsync, before the event
loop hears of it: the service answers adds from there when the connection is idle, one thread hand-
off sooner than from `on_done`. From that moment the batch is also `settle()`-able: the event loop
applies it (indexes its entries) before it serves any request, whether or not the write's wake-up
has come round, so a read that follows an answer finds the entry.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from bookie.errors import StorageError
from edge.group_commit import GroupCommitWriter

_log = logging.getLogger("quire.bookie.storage")


class Batch:
    """Records waiting for one journal write + fsync, and the entries they carry."""

    __slots__ = ("records", "record_count", "entries", "done", "error", "callbacks", "after_sync")

    def __init__(self) -> None:
        self.records: list[bytes] = []  # encoded journal records, possibly in several chunks each
        self.record_count = 0
        self.entries: list[tuple[int, int, bytes, int]] = []  # ledger, entry, packaged entry, its LAC field
        self.done = trio.Event()
        self.error: StorageError | None = None
        self.callbacks: list[Callable[[StorageError | None], None]] = []
        # In the writer's thread, after the fsync (see the module doc): must not block, nor raise.
        self.after_sync: list[Callable[[], None]] = []

    def on_done(self, callback: Callable[[StorageError | None], None]) -> None:
        """Call `callback(error)` in the event loop once the batch is durable (error None) or failed.
        It must not raise, nor block."""
        if self.done.is_set():
            callback(self.error)
        else:
            self.callbacks.append(callback)


class GroupCommit:
    """One batch write at a time. `write(batch)` runs in the writer's thread and returns the entries'
    positions; `apply(batch, positions)` runs in the event loop after it; `refusal()` says why
    nothing may be written any more (closed or failed: the batch fails with it), else None;
    `failed(reason)` records a failed write (the storage refuses further use)."""

    def __init__(self, write: Callable[[Batch], list[int]], apply: Callable[[Batch, list[int]], None],
                 refusal: Callable[[], str | None], failed: Callable[[str], None], directory: object) -> None:
        self._write, self._apply, self._refusal, self._failed = write, apply, refusal, failed
        self._directory = directory
        self.open_batch = Batch()
        self._busy = False  # a batch write, checkpoint or compaction holds the disk
        self._priority_waiting = 0
        self._idle = trio.Event()
        self._synced: tuple[Batch, list[int]] | None = None  # durable, not yet applied (set by the writer's thread)
        self._writer: GroupCommitWriter[Batch, list[int]] = GroupCommitWriter(
            self._write_one, on_done=self._handed_back, after_sync=self._synced_now, name="quire-bookie-journal",
            metrics_log="journal")

    def join(self, records: list[bytes], entries: list, count: int | None = None) -> Batch:
        """Put records (and the entries they carry) in the open batch; returns it. `count`: how many
        records `records` holds (default: one per item). Nothing is written until start()."""
        batch = self.open_batch
        batch.records += records
        batch.record_count += len(records) if count is None else count
        batch.entries += entries
        return batch

    async def commit(self, records: list[bytes], entries: list, count: int | None = None) -> None:
        """join + start, and return once the batch is durable; raises its StorageError."""
        batch = self.join(records, entries, count)
        self.start()
        await self.wait(batch)

    @staticmethod
    async def wait(batch: Batch) -> None:
        """Until `batch` is durable; raises its StorageError. Cancelling the wait does not stop the write."""
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def start(self) -> None:
        """Write the open batch in the writer's thread now, unless it is empty or the disk is held (a
        batch in flight, or a checkpoint or compaction holding or waiting for it: the open batch then
        starts when the disk is released)."""
        batch = self.open_batch
        if not batch.records or self._busy or self._priority_waiting:
            return
        self.open_batch = Batch()
        refusal = self._refusal()
        if refusal is not None:
            self._finish(batch, StorageError(refusal))
            return
        self._busy = True
        self._writer.submit([batch])

    def _write_one(self, batches: list[Batch]) -> list[int]:
        # One batch in flight at a time (start() waits for the disk), so the engine never groups two:
        # what arrives meanwhile joins the open batch instead, one Batch and one wake-up per write.
        (batch,) = batches
        return self._write(batch)

    def _synced_now(self, batches: list[Batch], positions: list[int]) -> list[int]:
        """In the writer's thread, after the fsync: settle() may apply the batch from now on, then
        its after_sync callables answer (see the module doc)."""
        (batch,) = batches
        self._synced = (batch, positions)
        for send in batch.after_sync:
            try:
                send()
            except BaseException:  # noqa: BLE001 - the write is done: its wake-up must still go
                _log.exception("event=after_sync_failed directory=%s", self._directory)
        return positions

    async def close(self) -> None:
        """End the writer's thread and return its wake-up pipe (the storage is closing, disk held)."""
        self._writer.close()
        await self._writer.wait_closed()

    def settle(self) -> None:
        """In the event loop: apply the batch whose write is durable, if its wake-up has not come round."""
        synced = self._synced
        if synced is not None:
            self._synced = None
            self._written(*synced, None)

    def _handed_back(self) -> None:
        for written in self._writer.take_done():
            (batch,) = written.items
            synced = self._synced
            if synced is not None and synced[0] is batch:
                self._synced = None
            elif batch.done.is_set():
                continue  # settle() applied it already
            self._written(batch, written.value, written.error)

    def _written(self, batch: Batch, positions: list[int] | None, failure: BaseException | None) -> None:
        """In the event loop, once the batch's write returned: apply it, wake its waiters, release
        the disk and start the next batch (or let a waiting checkpoint have the disk)."""
        error: StorageError | None = None
        try:
            if failure is not None:
                raise failure
            assert positions is not None
            self._apply(batch, positions)
        except BaseException as err:  # noqa: BLE001 - every waiter must learn that it is not durable
            self._failed(f"{type(err).__name__}: {err}")
            error = err if isinstance(err, StorageError) else StorageError(
                f"bookie storage {self._directory}: batch write failed ({err!r}); restart the bookie")
            if not isinstance(err, StorageError):  # a bug: the node stops on the StorageError, logged here
                _log.error("event=batch_write_failed directory=%s error=%r", self._directory, err, exc_info=err)
        self._release()
        self._finish(batch, error)
        self.start()

    def _finish(self, batch: Batch, error: StorageError | None) -> None:
        batch.error = error
        batch.done.set()
        callbacks, batch.callbacks = batch.callbacks, []
        for callback in callbacks:
            try:
                callback(error)
            except Exception:  # noqa: BLE001 - a waiter's bug must not stop the others (or the loop)
                _log.exception("event=batch_callback_failed directory=%s", self._directory)

    @asynccontextmanager
    async def disk(self, *, priority: bool = False) -> AsyncIterator[None]:
        """Hold the disk: no batch is written meanwhile. Checkpoints and compactions take `priority`:
        each finished batch starts the next one at once, so without priority they could wait
        forever. Adds arriving meanwhile join one batch, started when the disk is released."""
        self._priority_waiting += priority
        try:
            while self._busy or (self._priority_waiting and not priority):
                await self._idle.wait()
        finally:
            self._priority_waiting -= priority
        self._busy = True
        try:
            yield
        finally:
            self._release()
            self.start()  # what joined while we held the disk

    def _release(self) -> None:
        self._busy = False
        idle, self._idle = self._idle, trio.Event()
        idle.set()
