"""BookieStorage: one bookie's durable entry store (trio edge).

BookKeeper's design, simplified (docs/bookie_storage.md has the formats and
the crash rules):

- every add, master-key binding, fence, explicit LAC and deletion is a
  CRC-framed journal record; an add is acknowledged only once its record is
  fsynced (seed 001: "A bookie acknowledges a write once it has been
  persisted to disk");
- entries also go to entry log files (no fsync per add) and an in-memory
  index maps (ledger, entry) to their place;
- a checkpoint fsyncs the entry logs, writes the index image (tmp + fsync + rename) with the
  journal position it covers, and trims the journal before it. Only its cut (journal roll,
  index copy, entry log sizes) holds the disk, between two batches; the rest runs beside adds.

What a request may do, and the journal records it writes, is decided by bookie/ledger_rules.py
(LedgerRules, pure, shared with the simulator); this module makes those records durable.
Group commit (bookie/storage_commit.py): callers put records in the open batch; one write and
one fsync per batch in a worker thread. The service joins adds synchronously (`join_adds`) and
answers them from the batch (storage_commit's after_sync or on_done); the async methods await it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from bookie.errors import BookieError, NoSuchLedger, StorageError
from bookie.entrylog import Cut
from bookie.index import Index, Location, record_size
from bookie.ledger_rules import AddFields, DeleteLedgers, Fence, LedgerRules, Outcome, WriteLac
from bookie.storage_commit import Batch, GroupCommit
from bookie.storage_lac import LacWaiters
from bookie.storage_codec import FILE_HEADER_BYTES, scan_entry_log
from bookie.storage_config import AddRequest, BookieStorageConfig, CompactionStats
from bookie.checkpoint import Checkpoint
from bookie.storage_recovery import CHECKPOINT, disk_usage_fraction, read_only_reason, recover, write_checkpoint

_log = logging.getLogger("quire.bookie.storage")

__all__ = ["AddRequest", "BookieStorage", "BookieStorageConfig", "CompactionStats"]


class BookieStorage:
    """One bookie's journal, entry logs, index, fence flags, explicit LACs and cookie.

    Open with `await BookieStorage.open(directory, bookie_id, config)`. All
    methods are called from one trio run. Background work: start
    `await nursery.start(storage.run)` to checkpoint on the size/interval
    triggers of the config, re-check the disk and compact; or call
    checkpoint(), check_disk() and compact() yourself.

    Reads (read, lac, last_entry, is_fenced, ledgers) are synchronous: an index
    lookup and one pread of the record, done on the event loop (a cold read
    blocks the loop for one disk read; it also means reads never race the
    removal of a compacted entry log). Per-request outcomes are the BookieError
    classes of bookie/errors.py; StorageError means the disk failed or the
    directory cannot be used: stop serving and restart the bookie.
    """

    def __init__(self, directory: Path, config: BookieStorageConfig, recovered) -> None:
        """Internal: use BookieStorage.open()."""
        self.directory = directory
        self.config = config
        self.cookie = recovered.cookie
        self._index = recovered.index
        self._rules = LedgerRules(self._index, config.max_entry_bytes)  # every decision; the index is its state
        self._journal = recovered.journal
        self._entrylogs = recovered.entrylogs
        self._commits = GroupCommit(self._write_batch, self._apply, self._refusal, self._record_failure, directory)
        self._lac_waiters = LacWaiters(self._rules.lac_passed)
        self._fence_batches: dict[int, Batch] = {}  # ledger -> batch carrying its newest FENCE record
        self._checkpoint_wanted = trio.Event()
        self._checkpointing = trio.Lock()  # one checkpoint at a time, and none across a compaction or close
        self._journal_bytes_at_checkpoint = 0
        self._disk_usage = 0.0
        self._failed: str | None = None
        self._closed = False
        self._stats = dict(adds=0, add_bytes=0, adds_refused=0, batches=0, journal_records=0, checkpoints=0,
                           compactions=0, reads=0, replayed_records=recovered.replayed_records)

    # --- opening -------------------------------------------------------------------------

    @classmethod
    async def open(cls, directory: Path, bookie_id: int, config: BookieStorageConfig | None = None, *,
                   instance_id: str | None = None, cluster: str | None = None,
                   journal_directory: Path | None = None) -> BookieStorage:
        """Open (creating if fresh) the bookie directory and recover its state; the journal in
        `journal_directory` if given (a device of its own: storage_recovery.place_journal).

        A fresh directory gets a cookie with a new random instance id (see `instance_id`; the
        service records it in the metastore). Raises CookieMismatch if the directory or the
        journal belongs to another bookie id, cluster or instance, or has no cookie while
        `instance_id` (what the metastore recorded) is given; StorageError if the journal,
        checkpoint or entry logs are damaged beyond a torn tail."""
        config = config or BookieStorageConfig()
        directory = Path(directory)
        recovered = await trio.to_thread.run_sync(recover, directory, bookie_id, config, instance_id, cluster,
                                                  journal_directory)
        storage = cls(directory, config, recovered)
        storage._journal_bytes_at_checkpoint = 0
        await storage.check_disk()
        return storage

    @property
    def instance_id(self) -> str:
        """The random id this directory's cookie was created with."""
        return self.cookie.instance_id

    # --- writes -------------------------------------------------------------------------

    async def add_batch(self, adds: list[AddRequest]) -> list[BookieError | None]:
        """Store entries; return one outcome per add (None: stored, durably).

        Returns when every accepted add's journal record is fsynced, together
        with whatever else is pending (group commit). Refusals: BadRequest (the
        header's ids differ from the request's, malformed entry or key),
        EntryTooLarge, BookieReadOnly, NoSuchLedger (the ledger was deleted
        here), Unauthorized (another master key is bound), LedgerFenced (fenced
        and not a recovery add). Re-adding a stored entry is a success.
        """
        return await self.add_fields([(a.ledger_id, a.entry_id, a.master_key, a.data, a.recovery) for a in adds])

    async def add_fields(self, adds: list[AddFields]) -> list[BookieError | None]:
        """add_batch of (ledger_id, entry_id, master_key, packaged entry, recovery) tuples, without an
        AddRequest per entry."""
        results, batch = self.join_adds(adds)
        if batch is not None:
            await self._commits.wait(batch)
        return results

    def join_adds(self, adds: list[AddFields], answer: Callable[[], None] | None = None) -> tuple[list, Batch | None]:
        """The service's hot path, synchronous: admit the adds, put the accepted ones in the open batch
        and start writing it if the disk is free. Returns one outcome per add (None: accepted) and the
        batch they wait for (None when nothing needs writing); the accepted adds are stored once that
        batch is done without error (`batch.on_done`). `answer`, if every add is accepted, runs in the
        writer's thread after the fsync (added before the write starts, so it is never too late).
        Raises StorageError if the storage is closed or failed."""
        self._check_usable()
        records: list[bytes] = []
        entries: list[tuple[int, int, bytes, int]] = []
        results, record_count, woken = self._rules.admit_adds(adds, records, entries)
        refused = len(results) - results.count(None)
        if refused:
            self._stats["adds_refused"] += refused
        if not records:
            return results, None
        batch = self._commits.join(records, entries, record_count)
        if answer is not None and not refused:
            batch.after_sync.append(answer)
        if woken:  # before the write starts: the adds' LAC fields count at once (long polls answer sooner)
            self._notify(woken)
        self._commits.start()
        return results, batch

    async def add(self, req: AddRequest) -> None:
        """add_batch of one; raises its refusal."""
        (error,) = await self.add_batch([req])
        if error is not None:
            raise error

    def _decide(self, request: Fence | WriteLac | DeleteLedgers) -> Outcome:
        """The rules' outcome of a request (its refusal raised), its ledgers' LAC waiters woken."""
        self._check_usable()
        outcome = self._rules.step(request)
        if outcome.error is not None:
            raise outcome.error
        self._notify(outcome.woken)
        return outcome

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger durably and return this bookie's LAC for it (NO_ENTRY if none).

        From the moment this is called, non-recovery adds are refused; it
        returns once the fence record is fsynced. Fencing a ledger never seen
        here creates its state, so a late add is refused too. Raises
        Unauthorized, NoSuchLedger (deleted here), BadRequest. Fencing a fenced
        ledger writes nothing (recovery reads fence again and again): it answers
        the LAC once the first fence's record is durable, at once if it is.
        """
        outcome = self._decide(Fence(ledger_id, master_key))
        if outcome.records:
            carrier = self._fence_batches[ledger_id] = self._commits.open_batch  # the batch commit() joins
            await self._commits.commit(outcome.records, [])
        else:  # fenced already: its FENCE record is durable (read back on open), or on its way
            carrier = self._fence_batches.get(ledger_id)
            if carrier is not None:
                await self._commits.wait(carrier)
        if carrier is not None and self._fence_batches.get(ledger_id) is carrier:
            del self._fence_batches[ledger_id]  # durable now: later fences answer at once
        try:
            return self._rules.lac(ledger_id)  # again: an add or LAC may have raised it meanwhile
        except NoSuchLedger:
            return outcome.lac  # deleted meanwhile: the LAC it had when fenced

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        """Record an explicit LAC (the writer's, when no add carries it); the LAC never goes down.

        It takes effect at once; its journal record rides on the next group commit (or run()'s
        next tick, or close()) rather than cost an fsync: an explicit LAC is a hint for readers, as
        in BookKeeper. A crash that loses it lowers this bookie's LAC to what its entries carry;
        every LAC it had named an entry the writer had acknowledged (Qa durable copies), and
        recovery reads forward from the LAC until entries are absent. Binding an unseen ledger's
        key is still durable before the answer (docs/bookie_storage.md, Guarantees)."""
        outcome = self._decide(WriteLac(ledger_id, lac, master_key))
        if len(outcome.records) > 1:  # a KEY record first: durable before the answer
            await self._commits.commit(outcome.records, [])
        else:
            self._commits.join(outcome.records, [])

    def write_lac_nowait(self, ledger_id: int, lac: int, master_key: bytes) -> bool:
        """write_lac when it need not wait (the ledger's key is bound here already, the common case):
        True once in effect, or raises its refusal. False: nothing was done; call write_lac."""
        if not self._rules.is_bound(ledger_id):
            return False  # unseen, unbound or deleted here: write_lac binds durably, or refuses
        self._commits.join(self._decide(WriteLac(ledger_id, lac, master_key)).records, [])
        return True

    async def flush(self) -> None:
        """Write and fsync records waiting in the open batch with no caller waiting on them
        (explicit LACs). run() calls it every tick, close() before closing."""
        if self._commits.open_batch.record_count and self._failed is None and not self._closed:
            await self._commits.commit([], [])

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Drop ledgers from the index, durably (journal now, checkpoint later); reads answer
        NoSuchLedger at once and adds are refused. Disk space returns with compact()."""
        outcome = self._decide(DeleteLedgers(tuple(ledger_ids)))
        for ledger_id in outcome.woken:
            self._fence_batches.pop(ledger_id, None)
        if outcome.records:
            await self._commits.commit(outcome.records, [])

    # --- group commit (bookie/storage_commit.py) ---------------------------------------------

    def _refusal(self) -> str | None:
        if self._closed or self._failed is not None:
            return f"bookie storage {self.directory} is closed or failed; restart the bookie"
        return None

    def _record_failure(self, reason: str) -> None:
        self._failed = self._failed or reason

    def _write_batch(self, batch: Batch) -> list[int]:
        """Worker thread: one journal write, the entry log appends, one fsync."""
        self._journal.append(batch.records)
        try:
            positions = self._entrylogs.append_admitted(batch.entries)
        except OSError as err:
            raise StorageError(f"entry logs in {self.directory}: {err}; restart the bookie") from err
        self._journal.sync()
        return positions

    def _apply(self, batch: Batch, positions: list[int]) -> None:
        """After the fsync: index the entries (now readable) and wake LAC waiters."""
        self._notify(self._rules.stored(batch.entries, positions))
        self._stats["add_bytes"] += sum(len(entry[2]) for entry in batch.entries)
        self._stats["adds"] += len(batch.entries)
        self._stats["batches"] += 1
        self._stats["journal_records"] += batch.record_count
        if self._journal.bytes_written - self._journal_bytes_at_checkpoint >= self.config.checkpoint_every_bytes:
            self._checkpoint_wanted.set()

    def settle(self) -> None:
        """Apply a batch whose fsync is done but whose wake-up has not come round (storage_commit)."""
        self._commits.settle()

    # --- reads ------------------------------------------------------------------------

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The packaged entry as it was added. Raises NoSuchLedger, NoSuchEntry, or EntryCorrupt when
        the stored copy fails its checksum (the reader should ask another replica)."""
        where = self._rules.locate(ledger_id, entry_id)
        self._stats["reads"] += 1
        try:
            return self._entrylogs.read(where, ledger_id, entry_id)
        except OSError as err:
            raise StorageError(f"reading ledger {ledger_id} entry {entry_id}: {err}; check the disk") from err

    def lac(self, ledger_id: int) -> int:
        """max(LAC field of stored entries, explicit LAC); NO_ENTRY if neither. NoSuchLedger if unknown."""
        return self._rules.lac(ledger_id)

    def last_entry(self, ledger_id: int) -> int:
        """The highest entry id stored here (NO_ENTRY if none). NoSuchLedger if unknown."""
        return self._rules.last_entry(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced here (in memory: durable once fence() returned)."""
        return self._rules.is_fenced(ledger_id)

    def ledgers(self) -> list[int]:
        """Ids of the ledgers this bookie holds state for (not deleted ones), ascending."""
        return self._rules.ledgers()

    async def wait_lac(self, ledger_id: int, beyond: int) -> int:
        """Return the ledger's LAC once it is greater than `beyond` (long-poll reads; bound it with
        a cancel scope). Waits for a ledger not seen yet; raises NoSuchLedger if it is deleted."""
        while not self._rules.lac_passed(ledger_id, beyond):
            await self._lac_waiters.wait_notified(ledger_id)
        return self._rules.lac(ledger_id)  # NoSuchLedger if it was deleted

    def watch_lac(self, ledger_id: int, beyond: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` once the ledger's LAC is greater than `beyond` or the ledger is deleted here:
        at once if it is already, else from the step that raises it (an add's LAC field, an explicit LAC,
        a batch's fsync), so a long poll is answered without a task wake-up in between. Waits for a
        ledger not seen yet. Returns a function that cancels the watch (harmless once called). The
        callback must not block; an exception it raises is logged, not propagated to the writer of
        the LAC."""
        return self._lac_waiters.watch(ledger_id, beyond, callback)

    def _notify(self, ledger_ids: Iterable[int]) -> None:
        """The ledgers' LACs rose or they were deleted: their long polls look again."""
        for ledger_id in ledger_ids:
            self._lac_waiters.notify(ledger_id)

    # --- checkpoint, compaction, disk ----------------------------------------------------------

    async def checkpoint(self) -> None:
        """Fsync the entry logs, write the index image (tmp+fsync+rename) with the journal position it
        covers, and delete the journal segments before that position. Adds wait only for the cut
        (a journal roll and an index copy between two batches), not for the fsyncs and the image."""
        self._check_usable()
        async with self._checkpointing:
            async with self._commits.disk(priority=True):
                cut = await self._checkpoint_cut()
            await self._checkpoint_write(*cut)

    async def _checkpoint_cut(self) -> tuple[int, Index, Cut]:
        # Holding the disk, no batch is in flight: the index reflects every journal record written so
        # far, everything later goes to the segment roll() starts, and the entry logs hold exactly the
        # bytes the image indexes (later appends are past the cut's sizes, dropped on open and replayed).
        seq = await trio.to_thread.run_sync(self._journal.roll)
        image, logs = self._index.snapshot(), self._entrylogs.cut()
        self._journal_bytes_at_checkpoint = self._journal.bytes_written
        self._checkpoint_wanted = trio.Event()
        return seq, image, logs

    async def _checkpoint_write(self, seq: int, image: Index, cut: Cut, *,
                                dropping: frozenset[int] = frozenset()) -> None:
        # `dropping`: logs compaction emptied, unlisted, so if a crash precedes their removal, open deletes them.
        for log_id in dropping:
            assert image.live_bytes.pop(log_id, 0) == 0, f"entry log {log_id} still holds indexed entries"

        def work() -> int:
            sizes = self._entrylogs.sync(cut)
            logs = {log_id: (size, image.live_bytes.get(log_id, 0)) for log_id, size in sizes.items()
                    if log_id not in dropping}
            written = write_checkpoint(self.directory / CHECKPOINT, Checkpoint(seq, cut.next_log_id, logs, image))
            self._journal.trim_before(seq)
            return written

        try:
            size = await trio.to_thread.run_sync(work)
        except OSError as err:
            self._failed = f"checkpoint: {err}"
            raise StorageError(f"checkpoint of {self.directory} failed: {err}; restart the bookie") from err
        self._stats["checkpoints"] += 1
        _log.info("event=bookie_checkpoint journal_seq=%d bytes=%d ledgers=%d", seq, size, len(image.ledgers))

    async def compact(self) -> CompactionStats:
        """Rewrite entry logs whose live fraction is below config.compaction_threshold into the
        current log, checkpoint so the new places are durable, then delete the old logs."""
        self._check_usable()
        async with self._checkpointing, self._commits.disk(priority=True):
            sizes = self._entrylogs.sizes()
            current = self._entrylogs.current_id()
            victims = [log_id for log_id, size in sorted(sizes.items())
                       if log_id != current and self._live_fraction(log_id, size) < self.config.compaction_threshold]
            if not victims:
                return CompactionStats()
            moved = moved_bytes = 0
            for log_id in victims:
                count, nbytes = await self._compact_log(log_id)
                moved += count
                moved_bytes += nbytes
            cut = await self._checkpoint_cut()  # holding the disk throughout: the victims go right after
            await self._checkpoint_write(*cut, dropping=frozenset(victims))
            self._entrylogs.remove(victims)
            for log_id in victims:
                self._index.live_bytes.pop(log_id, None)
        self._stats["compactions"] += 1
        freed = sum(sizes[log_id] for log_id in victims) - moved_bytes
        _log.info("event=bookie_compaction logs=%d entries_moved=%d bytes_freed=%d", len(victims), moved, freed)
        return CompactionStats(len(victims), moved, moved_bytes, freed)

    def _live_fraction(self, log_id: int, size: int) -> float:
        payload = size - FILE_HEADER_BYTES
        return self._index.live_bytes.get(log_id, 0) / payload if payload > 0 else 0.0

    async def _compact_log(self, log_id: int) -> tuple[int, int]:
        """Copy the still-indexed records of one log to the current log; point the index at them."""
        _, buf = await trio.to_thread.run_sync(self._entrylogs.read_whole, log_id)
        records, _, stop = await trio.to_thread.run_sync(scan_entry_log, buf)
        if stop is not None:
            raise StorageError(f"entry log {log_id} is damaged ({stop}); compaction stopped: check the disk")
        live = []
        for i, (ledger_id, entry_id, offset, length) in enumerate(records):
            if self._index.get(ledger_id, entry_id) == Location(log_id, offset, length):
                live.append((ledger_id, entry_id, offset, length))
            if i % 10_000 == 9_999:
                await trio.sleep(0)  # keep serving while a big log is sifted
        items = [(lg, e, buf[off + record_size(0): off + record_size(n)]) for lg, e, off, n in live]
        try:
            locations = await trio.to_thread.run_sync(self._entrylogs.append, items)
        except OSError as err:
            self._failed = f"compaction: {err}"
            raise StorageError(f"compaction of {self.directory} failed: {err}; restart the bookie") from err
        moved_bytes = 0
        for (ledger_id, entry_id, offset, length), where in zip(live, locations):
            if self._index.move(ledger_id, entry_id, Location(log_id, offset, length), where, record_size(length)):
                moved_bytes += record_size(length)
        return len(live), moved_bytes

    @property
    def read_only(self) -> bool:
        """True while the disk is above disk_usage_threshold or the index above max_index_bytes: adds are refused."""
        return self._rules.read_only is not None

    async def check_disk(self) -> bool:
        """Recompute read-only from the filesystem's usage and the index's memory; return read_only."""
        self._disk_usage = await trio.to_thread.run_sync(disk_usage_fraction, self.directory)
        reason = read_only_reason(self._disk_usage, self._index.memory_bytes(), self.config)
        if (reason is not None) != self.read_only:
            _log.warning("event=bookie_%s reason=%r", "read_only" if reason else "writable", reason or "")
        self._rules.read_only = reason
        return reason is not None

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Background duties until cancelled or closed: checkpoint when checkpoint_every_bytes of journal were
        written or checkpoint_interval_ms passed with writes; re-check the disk; compact."""
        config = self.config
        now = trio.current_time()
        last = {"checkpoint": now, "disk": now, "compact": now}
        intervals = [ms for ms in (config.checkpoint_interval_ms, config.disk_check_interval_ms,
                                   config.compaction_interval_ms) if ms > 0]
        tick = min(intervals, default=1000) / 1000
        task_status.started()
        while not self._closed:
            with trio.move_on_after(tick):
                await self._checkpoint_wanted.wait()
            if self._closed:
                return
            await self.flush()
            now = trio.current_time()
            written = self._journal.bytes_written > self._journal_bytes_at_checkpoint
            due = config.checkpoint_interval_ms and now - last["checkpoint"] >= config.checkpoint_interval_ms / 1000
            if self._checkpoint_wanted.is_set() or (written and due):
                await self.checkpoint()
                last["checkpoint"] = now
            if now - last["disk"] >= config.disk_check_interval_ms / 1000:
                await self.check_disk()
                last["disk"] = now
            if config.compaction_interval_ms and now - last["compact"] >= config.compaction_interval_ms / 1000:
                await self.compact()
                last["compact"] = now

    # --- lifecycle ---------------------------------------------------------------------------

    def statistics(self) -> dict:
        """Counters: adds, bytes, batches, fsyncs and adds per fsync (the group-commit gain), journal
        and entry log sizes, checkpoints, compactions, read-only state."""
        stats: dict = dict(self._stats)
        fsyncs = self._journal.syncs
        stats.update(
            fsyncs=fsyncs, adds_per_fsync=self._stats["adds"] / fsyncs if fsyncs else 0.0,
            journal_bytes=self._journal.size_bytes(), journal_segments=self._journal.segment_count(),
            journal_bytes_written=self._journal.bytes_written,
            entry_logs=len(self._entrylogs.sizes()), entry_log_bytes=sum(self._entrylogs.sizes().values()),
            ledgers=len(self._index.ledgers), deleted_ledgers=len(self._index.deleted),
            index_bytes=self._index.memory_bytes(),
            entries=self._index.entry_count(), read_only=self.read_only, disk_usage=round(self._disk_usage, 4),
            pending_records=self._commits.open_batch.record_count, failed=self._failed)
        return stats

    async def close(self, *, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to or failed) and release the files. Unfinished adds fail."""
        if self._closed:
            return
        await self.flush()
        if checkpoint and self._failed is None:
            await self.checkpoint()
        async with self._checkpointing, self._commits.disk():
            self._closed = True
            self._journal.close()
            self._entrylogs.close()
            await self._commits.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"bookie storage {self.directory} is closed")
        if self._failed is not None:
            raise StorageError(f"bookie storage {self.directory} failed earlier ({self._failed}); restart the "
                               "bookie so that it recovers from its journal")

