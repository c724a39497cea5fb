"""The bookie storage engine on real files with real fsyncs: round trips, refusals, restarts,
group commit, torn tails, corruption, cookies, read-only, deletion and compaction."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from bookie.entry import NO_ENTRY, master_key
from bookie.errors import (BadRequest, BookieReadOnly, CookieMismatch, EntryCorrupt, EntryTooLarge, LedgerFenced,
                           NoSuchEntry, NoSuchLedger, StorageError, Unauthorized)
from bookie.storage import AddRequest, BookieStorage, BookieStorageConfig
from bookie.storage_codec import FILE_HEADER_BYTES, scan_journal
from bookie_fixtures import KEY, SMALL, add_all, add_req, checkpoint_held_after_its_cut, packaged, trio_test
from bookie_fixtures import open_small_storage as open_storage

OTHER_KEY = master_key(b"not the password")


# --- round trips ---------------------------------------------------------------------------


@trio_test
async def test_adds_read_back_with_lac_and_last_entry(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(5, i) for i in range(20)])
    assert [storage.read(5, i) for i in range(20)] == [packaged(5, i) for i in range(20)]
    assert storage.lac(5) == 18 and storage.last_entry(5) == 19 and storage.ledgers() == [5]
    with pytest.raises(NoSuchEntry):
        storage.read(5, 20)
    with pytest.raises(NoSuchLedger):
        storage.read(6, 0)
    with pytest.raises(NoSuchLedger):
        storage.lac(6)
    await storage.close()


@trio_test
async def test_re_adding_a_stored_entry_is_idempotent(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(1, 0))
    fsyncs = storage.statistics()["fsyncs"]
    await storage.add(add_req(1, 0))
    assert storage.statistics()["fsyncs"] == fsyncs, "a stored entry needs no new journal record"
    assert storage.read(1, 0) == packaged(1, 0)
    await storage.close()


@trio_test
async def test_striped_and_far_apart_entry_ids_are_indexed(tmp_path):
    storage = await open_storage(tmp_path)
    ids = [0, 1, 3, 4, 6, 7, 10**6, 2**63 - 1, 5]
    for entry_id in ids:
        await storage.add(add_req(2, entry_id, lac=NO_ENTRY))
    for entry_id in ids:
        assert storage.read(2, entry_id) == packaged(2, entry_id, lac=NO_ENTRY)
    assert storage.last_entry(2) == 2**63 - 1
    with pytest.raises(NoSuchEntry):
        storage.read(2, 2)
    await storage.close()
    storage = await open_storage(tmp_path)
    assert storage.read(2, 10**6) == packaged(2, 10**6, lac=NO_ENTRY)
    await storage.close()


# --- refusals --------------------------------------------------------------------------------


@trio_test
async def test_a_ledger_is_bound_to_the_first_master_key(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(3, 0))
    with pytest.raises(Unauthorized):
        await storage.add(add_req(3, 1, key=OTHER_KEY))
    with pytest.raises(Unauthorized):
        await storage.fence(3, OTHER_KEY)
    with pytest.raises(Unauthorized):
        await storage.write_lac(3, 0, OTHER_KEY)
    await storage.close()
    storage = await open_storage(tmp_path)
    with pytest.raises(Unauthorized):
        await storage.add(add_req(3, 1, key=OTHER_KEY))
    await storage.close()


@trio_test
async def test_bad_requests_are_refused_per_add(tmp_path):
    storage = await open_storage(tmp_path, BookieStorageConfig(max_entry_bytes=200))
    results = await storage.add_batch([
        add_req(1, 0),
        AddRequest(1, 1, KEY, packaged(1, 2)),  # header names entry 2
        AddRequest(1, 3, KEY, b"short"),
        AddRequest(1, 4, b"k" * 5, packaged(1, 4)),
        add_req(1, 5, b"x" * 300),
    ])
    assert results[0] is None
    assert [type(r) for r in results[1:]] == [BadRequest, BadRequest, BadRequest, EntryTooLarge]
    assert storage.last_entry(1) == 0
    await storage.close()


@trio_test
async def test_fence_refuses_adds_but_recovery_adds_pass_and_survive_restart(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(9, i) for i in range(3)])
    assert await storage.fence(9, KEY) == 1
    assert storage.is_fenced(9)
    with pytest.raises(LedgerFenced):
        await storage.add(add_req(9, 3))
    await storage.add(add_req(9, 3, recovery=True))
    assert storage.read(9, 3) == packaged(9, 3)
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)
    assert storage.is_fenced(9)
    with pytest.raises(LedgerFenced):
        await storage.add(add_req(9, 4))
    await storage.close()


@trio_test
async def test_a_repeat_fence_of_a_durably_fenced_ledger_writes_nothing_but_still_checks_the_key(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(9, i) for i in range(3)])
    assert await storage.fence(9, KEY) == 1
    before = storage.statistics()
    assert [await storage.fence(9, KEY) for _ in range(5)] == [1] * 5  # recovery reads fence every time
    after = storage.statistics()
    assert (after["journal_records"], after["fsyncs"]) == (before["journal_records"], before["fsyncs"])
    with pytest.raises(Unauthorized):
        await storage.fence(9, OTHER_KEY)
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)  # fenced on disk: a fence after a restart writes nothing either
    records = storage.statistics()["journal_records"]
    assert await storage.fence(9, KEY) == 1 and storage.statistics()["journal_records"] == records
    await storage.close()


@trio_test
async def test_a_fence_repeated_while_the_first_is_being_written_waits_for_it_and_writes_nothing(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(9, i) for i in range(3)])
    records = storage.statistics()["journal_records"]
    entered, release = threading.Event(), threading.Event()
    real_sync = storage._journal.sync

    def held_sync() -> None:  # the worker thread holds the first fence's batch in its fsync
        entered.set()
        release.wait(30)
        real_sync()

    storage._journal.sync = held_sync
    answers: list[int] = []

    async def fence() -> None:
        answers.append(await storage.fence(9, KEY))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fence)
        await trio.to_thread.run_sync(entered.wait)
        nursery.start_soon(fence)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [] and storage.is_fenced(9), "neither answers before the FENCE record is durable"
        assert storage.statistics()["pending_records"] == 0, "the repeat joined no record of its own"
        release.set()
    assert answers == [1, 1] and storage.statistics()["journal_records"] == records + 1
    await storage.close()


@trio_test
async def test_an_explicit_lac_takes_effect_at_once_and_rides_on_the_next_group_commit(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(4, i) for i in range(3)])
    fsyncs = storage.statistics()["fsyncs"]
    await storage.write_lac(4, 2, KEY)
    assert storage.lac(4) == 2 and storage.statistics()["fsyncs"] == fsyncs  # a hint: no fsync of its own
    assert storage.statistics()["pending_records"] == 1
    await storage.add(add_req(4, 3))  # the next group commit carries it
    assert storage.statistics()["pending_records"] == 0
    await storage.write_lac(4, 3, KEY)
    await storage.close(checkpoint=False)  # close writes what is pending
    storage = await open_storage(tmp_path)
    assert storage.lac(4) == 3
    await storage.close()


@trio_test
async def test_fencing_an_unknown_ledger_creates_it_so_a_late_add_is_refused(tmp_path):
    storage = await open_storage(tmp_path)
    assert await storage.fence(44, KEY) == NO_ENTRY
    with pytest.raises(LedgerFenced):
        await storage.add(add_req(44, 0))
    assert storage.lac(44) == NO_ENTRY and storage.last_entry(44) == NO_ENTRY
    await storage.close()


@trio_test
async def test_explicit_lac_is_persisted_and_wakes_long_polls(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(4, i) for i in range(5)])
    assert storage.lac(4) == 3
    seen = []

    async def poll():
        seen.append(await storage.wait_lac(4, 3))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.sleep(0.01)
        assert seen == []
        await storage.write_lac(4, 4, KEY)
    assert seen == [4] and storage.lac(4) == 4
    await storage.write_lac(4, 2, KEY)  # never goes down
    assert storage.lac(4) == 4
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)
    assert storage.lac(4) == 4
    await storage.close()


@trio_test
async def test_wait_lac_returns_when_an_add_carries_a_higher_lac(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(8, 0))
    async with trio.open_nursery() as nursery:
        result = []
        nursery.start_soon(lambda: _collect(result, storage.wait_lac(8, NO_ENTRY)))
        await trio.sleep(0.01)
        await storage.add(add_req(8, 1))
    assert result == [0]
    await storage.close()


@trio_test
async def test_watch_lac_calls_back_from_the_step_that_raises_the_lac(tmp_path):
    """A long poll's watch fires synchronously: at once if the LAC passed already, else inside the
    join_adds that carries a higher LAC field (before its fsync), the explicit LAC, or the deletion."""
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(9, i) for i in range(3)])  # stored LAC fields up to 1
    fired: list[str] = []
    storage.watch_lac(9, 0, lambda: fired.append("at once"))
    assert fired == ["at once"]
    storage.watch_lac(9, 1, lambda: fired.append("add"))
    cancel = storage.watch_lac(9, 5, lambda: fired.append("cancelled"))
    cancel()
    _, batch = storage.join_adds([(9, 3, KEY, packaged(9, 3), False)])  # carries LAC 2
    assert fired == ["at once", "add"] and batch is not None and not batch.done.is_set()
    storage.watch_lac(9, 2, lambda: fired.append("explicit"))
    storage.watch_lac(9, 3, lambda: fired.append("deleted"))
    await storage.write_lac(9, 3, KEY)
    assert fired[-1] == "explicit"
    await storage.delete_ledgers([9])
    assert fired == ["at once", "add", "explicit", "deleted"]
    storage.watch_lac(77, NO_ENTRY, lambda: fired.append("unseen"))  # waits for a ledger not seen yet
    await storage.add(add_req(77, 0))  # its LAC field is -1: the LAC has not passed -1 yet
    assert fired[-1] == "deleted"
    await storage.add(add_req(77, 1))
    assert fired[-1] == "unseen"
    await storage.close()


async def _collect(into: list, awaitable) -> None:
    into.append(await awaitable)


# --- restarts ---------------------------------------------------------------------------------


@trio_test
async def test_reopen_after_close_and_without_close_recovers_everything(tmp_path):
    storage = await open_storage(tmp_path)
    reqs = [add_req(ledger, i, os.urandom(300)) for ledger in (1, 2, 3) for i in range(40)]
    await add_all(storage, reqs)
    await storage.checkpoint()
    more = [add_req(4, i, os.urandom(100)) for i in range(30)]
    await add_all(storage, more)
    await storage.fence(2, KEY)
    # No close: as if the process died (the files stay as the kernel has them).
    storage2 = await open_storage(tmp_path)
    for req in reqs + more:
        assert storage2.read(req.ledger_id, req.entry_id) == req.data
    assert storage2.is_fenced(2) and not storage2.is_fenced(1)
    assert storage2.statistics()["replayed_records"] > 0
    await storage2.close()
    storage3 = await open_storage(tmp_path)
    assert storage3.statistics()["replayed_records"] == 0, "close() checkpoints"
    for req in reqs + more:
        assert storage3.read(req.ledger_id, req.entry_id) == req.data
    assert storage3.ledgers() == [1, 2, 3, 4]
    await storage3.close()


@trio_test
async def test_checkpoint_trims_the_journal_and_rotates_entry_logs(tmp_path):
    storage = await open_storage(tmp_path)
    for batch in range(10):
        await add_all(storage, [add_req(1, batch * 20 + i, b"p" * 400) for i in range(20)])
    stats = storage.statistics()
    assert stats["journal_segments"] > 1 and stats["entry_logs"] > 1
    await storage.checkpoint()
    assert storage.statistics()["journal_segments"] == 1
    assert len(list((tmp_path / "journal").glob("journal.*"))) == 1
    await storage.close()
    storage = await open_storage(tmp_path)
    assert all(storage.read(1, i) == packaged(1, i, b"p" * 400) for i in range(200))
    await storage.close()


@trio_test
async def test_adds_go_on_while_a_checkpoint_fsyncs_the_entry_logs(tmp_path, monkeypatch):
    """Only a checkpoint's cut holds the disk: adds are durable and answered while its entry log
    fsync is held, and the entries written after the cut come back from the journal on reopen."""
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(1, i) for i in range(50)])
    async with checkpoint_held_after_its_cut(storage, monkeypatch):
        with trio.fail_after(5):
            await add_all(storage, [add_req(1, i) for i in range(50, 100)])
        assert storage.statistics()["checkpoints"] == 0, "the checkpoint's fsync is still held"
    assert storage.statistics()["checkpoints"] == 1
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)
    assert storage.statistics()["replayed_records"] == 50, "the adds after the cut are the journal's to replay"
    assert all(storage.read(1, i) == packaged(1, i) for i in range(100))
    await storage.close()


@trio_test
async def test_run_checkpoints_on_the_size_trigger(tmp_path):
    config = BookieStorageConfig(checkpoint_every_bytes=4096, checkpoint_interval_ms=3_600_000)
    storage = await open_storage(tmp_path, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        await add_all(storage, [add_req(1, i, b"z" * 500) for i in range(20)])
        with trio.fail_after(10):
            while storage.statistics()["checkpoints"] == 0:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await storage.close()


# --- group commit --------------------------------------------------------------------------------


@trio_test
async def test_group_commit_merges_concurrent_adds_into_few_fsyncs(tmp_path):
    storage = await open_storage(tmp_path, BookieStorageConfig())
    await add_all(storage, [add_req(ledger, i) for ledger in range(10) for i in range(100)])
    stats = storage.statistics()
    assert stats["adds"] == 1000
    # Whatever arrives while one fsync runs waits for the next: the number of fsyncs is bounded
    # by the rounds of arrival, not by the number of adds.
    assert stats["fsyncs"] <= 100, stats
    assert stats["adds_per_fsync"] >= 10
    await storage.close()


@trio_test
async def test_join_adds_starts_the_journal_write_at_once_and_calls_back_once_durable(tmp_path):
    """The service's path: no task between the request and its fsync. join_adds admits the adds and
    hands their batch to a worker thread before returning; the callback runs once it is durable."""
    storage = await open_storage(tmp_path)
    await storage.add(add_req(3, 0))
    adds = [(r.ledger_id, r.entry_id, r.master_key, r.data, r.recovery)
            for r in (add_req(3, 1), add_req(3, 2), add_req(3, 0, key=OTHER_KEY))]
    outcomes, batch = storage.join_adds(adds)
    assert outcomes[:2] == [None, None] and isinstance(outcomes[2], Unauthorized)
    assert storage.statistics()["pending_records"] == 0  # already handed to the writer thread
    seen = []
    batch.on_done(seen.append)
    more, second = storage.join_adds([(3, 3, KEY, packaged(3, 3), False)])  # joins the next batch
    assert more == [None] and second is not batch
    with pytest.raises(NoSuchEntry):
        storage.read(3, 1)  # readable only once durable
    await batch.done.wait()
    assert seen == [None] and storage.read(3, 2) == packaged(3, 2)
    await second.done.wait()  # started by the first batch's completion, with no caller writing it
    assert storage.read(3, 3) == packaged(3, 3)
    late = []
    batch.on_done(late.append)  # on a finished batch: called at once
    assert late == [None]
    # Nothing to write: every add refused or already durable, no batch to wait for.
    assert storage.join_adds([(3, 1, KEY, packaged(3, 1), False)]) == ([None], None)
    await storage.close()


@trio_test
async def test_an_accepted_adds_lac_field_counts_before_its_fsync_and_wakes_long_polls(tmp_path):
    """Like an explicit LAC, the LAC an add carries names an entry the writer acknowledged: it counts
    as soon as the add is accepted (a writer appending back to back needs no explicit LAC for its
    tailing readers), while the entry itself is readable only once durable."""
    storage = await open_storage(tmp_path)
    await storage.add(add_req(6, 0))
    seen = []

    async def poll():
        seen.append(await storage.wait_lac(6, NO_ENTRY))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == []
        _, batch = storage.join_adds([(6, 1, KEY, packaged(6, 1, lac=0), False)])
        assert storage.lac(6) == 0 and not batch.done.is_set()  # before the fsync
        with pytest.raises(NoSuchEntry):
            storage.read(6, 1)
    assert seen == [0]
    await batch.done.wait()
    assert storage.read(6, 1) == packaged(6, 1, lac=0)
    _, batch = storage.join_adds([(6, 2, KEY, packaged(6, 2, lac=NO_ENTRY), False)])
    assert storage.lac(6) == 0  # never goes down
    await batch.done.wait()
    await storage.close()


@trio_test
async def test_a_failed_batch_write_fails_every_waiter_and_the_storage(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(2, 0))

    def broken_sync() -> None:
        raise StorageError("journal: fsync failed (simulated); restart the bookie")

    storage._journal.sync = broken_sync
    outcomes, batch = storage.join_adds([(2, 1, KEY, packaged(2, 1), False)])
    seen = []
    batch.on_done(seen.append)
    with pytest.raises(StorageError, match="restart the bookie"):
        await storage.add(add_req(2, 2))  # joined the next batch, refused once the first failed
    await batch.done.wait()
    assert outcomes == [None] and isinstance(seen[0], StorageError) and "simulated" in str(seen[0])
    with pytest.raises(NoSuchEntry):
        storage.read(2, 1)
    with pytest.raises(StorageError, match="restart the bookie"):
        await storage.add(add_req(2, 3))
    await storage.close(checkpoint=False)


# --- damage -----------------------------------------------------------------------------------


def _journal_segments(path: Path) -> list[Path]:
    return sorted((path / "journal").glob("journal.*"))


@trio_test
async def test_a_torn_journal_tail_is_cut_and_acknowledged_adds_survive(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(1, i) for i in range(10)])
    segment = _journal_segments(tmp_path)[-1]
    with open(segment, "r+b") as file:  # in place, just after the last record: the segment is preallocated
        file.seek(scan_journal(segment.read_bytes(), FILE_HEADER_BYTES).end)
        file.write(b"\x00\x00\x01\x00garbage that never finished")
    storage = await open_storage(tmp_path)
    assert [storage.read(1, i) for i in range(10)] == [packaged(1, i) for i in range(10)]
    await storage.add(add_req(1, 10))
    await storage.close()
    storage = await open_storage(tmp_path)
    assert storage.read(1, 10) == packaged(1, 10)
    await storage.close()


@trio_test
async def test_journal_corruption_before_the_tail_refuses_to_start(tmp_path):
    storage = await open_storage(tmp_path)
    for i in range(10):
        await storage.add(add_req(1, i))
    segment = _journal_segments(tmp_path)[-1]
    raw = bytearray(segment.read_bytes())
    raw[FILE_HEADER_BYTES + 30] ^= 0xFF  # inside the first record; valid records follow
    segment.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="followed by valid records"):
        await open_storage(tmp_path)


@trio_test
async def test_a_missing_journal_segment_refuses_to_start(tmp_path):
    storage = await open_storage(tmp_path, BookieStorageConfig(journal_segment_bytes=4096))
    for i in range(60):
        await storage.add(add_req(1, i, b"q" * 200))
    segments = _journal_segments(tmp_path)
    assert len(segments) >= 3
    segments[1].unlink()
    with pytest.raises(StorageError, match="missing"):
        await open_storage(tmp_path)


@trio_test
@pytest.mark.parametrize("wipe", ["segments", "directory"])
async def test_a_wiped_journal_after_a_checkpoint_refuses_to_start(tmp_path, wipe):
    # The adds after the checkpoint live only in the journal: opening without it would answer
    # "no such entry" for entries this bookie acknowledged.
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(1, i) for i in range(5)])
    await storage.checkpoint()
    await add_all(storage, [add_req(1, i) for i in range(5, 10)])
    await storage.close()
    if wipe == "segments":
        for segment in _journal_segments(tmp_path):
            segment.unlink()
    else:
        shutil.rmtree(tmp_path / "journal")
    with pytest.raises(StorageError, match="journal directory wiped"):
        await open_storage(tmp_path)


@trio_test
async def test_a_corrupt_entry_log_record_is_reported_on_read(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(1, i, b"payload" * 10) for i in range(3)])
    await storage.close()
    log = sorted((tmp_path / "entrylogs").iterdir())[0]
    raw = bytearray(log.read_bytes())
    raw[FILE_HEADER_BYTES + 24 + 50] ^= 0x01  # inside the first record's data
    log.write_bytes(bytes(raw))
    storage = await open_storage(tmp_path)
    readable = 0
    for i in range(3):
        try:
            assert storage.read(1, i) == packaged(1, i, b"payload" * 10)
            readable += 1
        except EntryCorrupt as err:
            assert "another bookie" in str(err)
    assert readable == 2
    await storage.close()


@trio_test
async def test_a_corrupt_checkpoint_refuses_to_start(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(1, 0))
    await storage.close()
    path = tmp_path / "checkpoint"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="wipe"):
        await open_storage(tmp_path)


# --- cookie ------------------------------------------------------------------------------------


@trio_test
async def test_a_wiped_directory_under_a_known_instance_is_refused(tmp_path):
    storage = await open_storage(tmp_path / "b")
    instance = storage.instance_id
    await storage.add(add_req(1, 0))
    await storage.close()
    reopened = await open_storage(tmp_path / "b", instance_id=instance)
    await reopened.close()
    with pytest.raises(CookieMismatch, match="wiped"):
        await open_storage(tmp_path / "wiped", instance_id=instance)
    other = await open_storage(tmp_path / "other")
    await other.close()
    with pytest.raises(CookieMismatch):
        await open_storage(tmp_path / "other", instance_id=instance)


@trio_test
async def test_a_swapped_directory_of_another_bookie_is_refused(tmp_path):
    storage = await BookieStorage.open(tmp_path, 1, SMALL, cluster="east")
    await storage.close()
    with pytest.raises(CookieMismatch, match="belongs to bookie 1"):
        await BookieStorage.open(tmp_path, 2, SMALL)
    with pytest.raises(CookieMismatch, match="cluster"):
        await BookieStorage.open(tmp_path, 1, SMALL, cluster="west")


@trio_test
async def test_data_without_a_cookie_is_refused(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(1, 0))
    await storage.close()
    (tmp_path / "cookie").unlink()
    with pytest.raises(CookieMismatch, match="no cookie"):
        await open_storage(tmp_path)


# --- read-only --------------------------------------------------------------------------------


@trio_test
async def test_over_the_disk_threshold_adds_are_refused_and_reads_still_served(tmp_path):
    storage = await open_storage(tmp_path)
    await storage.add(add_req(1, 0))
    await storage.close()
    full = await open_storage(tmp_path, BookieStorageConfig(disk_usage_threshold=0.0))
    assert full.read_only
    with pytest.raises(BookieReadOnly):
        await full.add(add_req(1, 1))
    assert full.read(1, 0) == packaged(1, 0)
    await full.fence(1, KEY)  # recovery must still be able to fence a full bookie
    object.__setattr__(full.config, "disk_usage_threshold", 1.0)
    assert await full.check_disk() is False
    await full.add(add_req(1, 1, recovery=True))
    await full.close()


# --- deletion and compaction ---------------------------------------------------------------------


@trio_test
async def test_deleted_ledgers_are_gone_and_stay_gone_after_restart(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(ledger, i) for ledger in (1, 2) for i in range(5)])
    await storage.delete_ledgers([1])
    with pytest.raises(NoSuchLedger):
        storage.read(1, 0)
    with pytest.raises(NoSuchLedger):
        await storage.add(add_req(1, 5))
    assert storage.ledgers() == [2]
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)
    assert storage.ledgers() == [2]
    await storage.checkpoint()
    await storage.close()
    storage = await open_storage(tmp_path)
    assert storage.ledgers() == [2] and storage.read(2, 4) == packaged(2, 4)
    await storage.close()


@trio_test
async def test_compaction_rewrites_mostly_dead_logs_and_keeps_live_entries(tmp_path):
    config = BookieStorageConfig(journal_segment_bytes=8192, entry_log_bytes=16384, compaction_threshold=0.6)
    storage = await open_storage(tmp_path, config)
    payload = b"c" * 500
    for i in range(60):  # interleaved: each entry log holds both ledgers
        await storage.add_batch([add_req(1, i, payload), add_req(2, i, payload)])
    await storage.add_batch([add_req(3, 0)])
    before = storage.statistics()
    await storage.delete_ledgers([1])
    result = await storage.compact()
    assert result.logs_compacted >= 2 and result.entries_moved >= 60 and result.bytes_freed > 0
    after = storage.statistics()
    assert after["entry_log_bytes"] < before["entry_log_bytes"]
    assert all(storage.read(2, i) == packaged(2, i, payload) for i in range(60))
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path, config)
    assert all(storage.read(2, i) == packaged(2, i, payload) for i in range(60))
    assert storage.read(3, 0) == packaged(3, 0)
    assert (await storage.compact()).logs_compacted == 0, "live logs are left alone"
    await storage.close()
