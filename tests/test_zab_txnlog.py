"""TxnLog on real files: group commit, torn tails, corruption, truncation, rolling, purge."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from zab.storage.record import encode_record, scan_records
from zab.storage.storage_errors import DiskWriteFailed, LogCorruptError
from zab.core.txn import Txn
from zab.storage.txnlog import (
    PREALLOCATE_BYTES,
    SEGMENT_HEADER_BYTES,
    TxnLog,
    encode_segment_header,
    segment_name,
)


def txn(zxid: int, size: int = 8) -> Txn:
    return Txn(zxid=zxid, session_id=zxid * 3, cxid=zxid * 5, data=bytes([zxid % 251]) * size)


def txns(first: int, last: int) -> list[Txn]:
    return [txn(z) for z in range(first, last + 1)]


def zxids_of(log: TxnLog, after: int = 0) -> list[int]:
    return [t.zxid for t in log.read_after(after)]


def reopen(path: Path, **kwargs) -> TxnLog:
    return TxnLog.open(path, **kwargs)


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "txnlog"


def write_log(logdir: Path, records: list[Txn], **kwargs) -> None:
    with TxnLog.open(logdir, **kwargs) as log:
        log.append(records)
        log.sync()


# --- basics ------------------------------------------------------------------------


def test_new_log_is_empty_and_created(logdir):
    with TxnLog.open(logdir) as log:
        assert logdir.is_dir()
        assert (log.first_zxid, log.last_zxid, log.base_zxid) == (0, 0, 0)
        assert list(log.read_after(0)) == []


def test_round_trip_across_reopen(logdir):
    write_log(logdir, txns(1, 10))
    with reopen(logdir) as log:
        assert list(log.read_after(0)) == txns(1, 10)
        assert (log.first_zxid, log.last_zxid) == (1, 10)
        assert zxids_of(log, after=7) == [8, 9, 10]
        assert zxids_of(log, after=10) == []


def test_group_commit_counts_one_sync_for_many_appends(logdir):
    with TxnLog.open(logdir) as log:
        for zxid in range(1, 51):
            log.append([txn(zxid)])
        assert log.statistics()["records_pending_sync"] == 50
        log.sync()
        log.sync()  # nothing pending: free, not counted
        stats = log.statistics()
    assert stats["syncs"] == 1 and stats["records_appended"] == 50
    assert stats["records_per_sync"] == 50
    assert stats["bytes_written"] == SEGMENT_HEADER_BYTES + sum(len(encode_record(t)) for t in txns(1, 50))
    assert stats["last_sync_seconds"] > 0


def test_unsynced_appends_are_readable(logdir):
    with TxnLog.open(logdir) as log:
        log.append(txns(1, 3))
        assert zxids_of(log) == [1, 2, 3]


@pytest.mark.parametrize("bad", [[txn(5)], [txn(7), txn(6)], [txn(8), txn(8)]])
def test_append_refuses_non_increasing_zxids_and_writes_nothing(logdir, bad):
    with TxnLog.open(logdir) as log:
        log.append(txns(1, 5))
        with pytest.raises(ValueError):
            log.append(bad)
        assert log.last_zxid == 5
        log.append([txn(6)])
        assert zxids_of(log) == [1, 2, 3, 4, 5, 6]


def test_oversized_txn_in_a_batch_leaves_no_trace(logdir):
    with TxnLog.open(logdir) as log:
        with pytest.raises(ValueError):
            log.append([txn(1), Txn(zxid=2, session_id=0, cxid=0, data=bytes(17 * 1024 * 1024))])
        assert log.last_zxid == 0
        log.append([txn(1)])
        assert zxids_of(log) == [1]


def test_closed_log_refuses_use(logdir):
    log = TxnLog.open(logdir)
    log.close()
    with pytest.raises(ValueError):
        log.append([txn(1)])


def test_failed_fsync_poisons_the_log(logdir, monkeypatch):
    # After a failed fsync the page cache may have dropped the data (fsyncgate):
    # the only safe continuation is a restart that rescans the disk.
    log = TxnLog.open(logdir)
    log.append([txn(1)])

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(DiskWriteFailed, match="Input/output error"):
        log.sync()
    monkeypatch.undo()
    with pytest.raises(DiskWriteFailed, match="failed earlier.*start the node again"):
        log.sync()
    with pytest.raises(DiskWriteFailed):
        log.append([txn(2)])
    log.close()
    with reopen(logdir) as log:
        assert zxids_of(log) == [1]


# --- torn and corrupt tails ---------------------------------------------------------


def single_segment(logdir: Path) -> Path:
    (path,) = sorted(logdir.iterdir())
    return path


def records_end(path: Path) -> int:
    """Where the segment's records end: the newest segment is preallocated, zero fill after that."""
    return scan_records(path.read_bytes(), SEGMENT_HEADER_BYTES).valid_end


def cut_zero_fill(path: Path) -> int:
    """Cut a segment to its records, as a roll does; return its new size."""
    end = records_end(path)
    os.truncate(path, end)
    return end


def test_the_newest_segment_is_preallocated_and_written_in_place(logdir, caplog):
    write_log(logdir, txns(1, 5))
    path = single_segment(logdir)
    end = SEGMENT_HEADER_BYTES + sum(len(encode_record(t)) for t in txns(1, 5))
    assert path.stat().st_size == SEGMENT_HEADER_BYTES + PREALLOCATE_BYTES
    assert records_end(path) == end and scan_records(path.read_bytes(), SEGMENT_HEADER_BYTES).zero_fill
    with caplog.at_level(logging.WARNING, logger="quire.txnlog"):
        with reopen(logdir) as log:
            assert zxids_of(log) == [1, 2, 3, 4, 5]
            log.append(txns(6, 7))  # right after the last record, not after the zero fill
            log.sync()
    assert not caplog.records, "zero fill is a clean end, not a torn tail"
    assert path.stat().st_size == SEGMENT_HEADER_BYTES + PREALLOCATE_BYTES
    with reopen(logdir) as log:
        assert zxids_of(log) == list(range(1, 8))


def test_a_batch_larger_than_the_preallocation_grows_the_segment(logdir):
    big = Txn(zxid=2, session_id=1, cxid=1, data=bytes(PREALLOCATE_BYTES + 1000))
    write_log(logdir, [txn(1), big, txn(3)])
    with reopen(logdir) as log:
        assert [t.zxid for t in log.read_after(0)] == [1, 2, 3]
        assert list(log.read_after(0))[1] == big


def test_a_roll_right_after_reopening_cuts_the_zero_fill_of_the_segment_it_closes(logdir):
    write_log(logdir, txns(1, 3), segment_max_bytes=200)
    first = single_segment(logdir)
    with reopen(logdir, segment_max_bytes=200) as log:
        log.append(txns(4, 12))  # rolls before anything else was written in this run
        log.sync()
    paths = sorted(logdir.iterdir())
    assert len(paths) > 2 and paths[0] == first
    for path in paths[:-1]:
        assert path.stat().st_size == records_end(path) <= 200, path.name
    with reopen(logdir) as log:
        assert zxids_of(log) == list(range(1, 13))


def test_torn_last_record_at_every_byte_is_truncated_and_log_stays_usable(logdir, caplog):
    write_log(logdir, txns(1, 3))
    path = single_segment(logdir)
    synced = path.read_bytes()[: records_end(path)]
    last = encode_record(txn(4))
    for cut in range(1, len(last)):
        path.write_bytes(synced + last[:cut])
        with caplog.at_level(logging.WARNING, logger="quire.txnlog"):
            log = reopen(logdir)
        assert zxids_of(log) == [1, 2, 3]
        if last[:cut].strip(b"\0"):
            assert path.stat().st_size == len(synced)
            assert "torn" in caplog.text and str(len(synced)) in caplog.text and str(path) in caplog.text
        else:  # the length's leading zero bytes: zero fill, a clean end the next append overwrites
            assert path.stat().st_size == len(synced) + cut and not caplog.records
        caplog.clear()
        log.append([txn(4)])
        log.sync()
        log.close()
        with reopen(logdir) as log:
            assert zxids_of(log) == [1, 2, 3, 4]
        assert not caplog.records
        path.write_bytes(synced)


@pytest.mark.parametrize("tail", ["zeros", "garbage"])
def test_zero_or_garbage_tail_is_truncated(logdir, tail):
    write_log(logdir, txns(1, 5))
    path = single_segment(logdir)
    synced_size = cut_zero_fill(path)
    rng = random.Random(7)
    for length in (1, 8, 31, 4096):
        junk = bytes(length) if tail == "zeros" else rng.randbytes(length)
        with open(path, "ab") as file:
            file.write(junk)
        with reopen(logdir) as log:
            assert zxids_of(log) == [1, 2, 3, 4, 5]
        if tail == "zeros":  # a preallocated segment's clean end: kept, and written over next
            assert path.stat().st_size == synced_size + length
            os.truncate(path, synced_size)
        assert path.stat().st_size == synced_size


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_flipped_byte_in_last_record_is_truncated(logdir, caplog):
    write_log(logdir, txns(1, 5))
    path = single_segment(logdir)
    size = cut_zero_fill(path)
    last_start = size - len(encode_record(txn(5)))
    flip(path, size - 2)
    with caplog.at_level(logging.WARNING, logger="quire.txnlog"):
        with reopen(logdir) as log:
            assert zxids_of(log) == [1, 2, 3, 4]
    assert path.stat().st_size == last_start
    assert "corrupt" in caplog.text and f"offset {last_start}" in caplog.text


def test_flipped_byte_before_valid_records_is_not_mistaken_for_a_tail(logdir):
    # Truncating here would drop records 3..5 that were synced and maybe acknowledged.
    write_log(logdir, txns(1, 5))
    path = single_segment(logdir)
    offset = SEGMENT_HEADER_BYTES + 2 * len(encode_record(txn(1))) + 12
    flip(path, offset)
    with pytest.raises(LogCorruptError, match="resync"):
        reopen(logdir)


def rolled_log(logdir: Path, last: int = 30, max_bytes: int = 200) -> list[Path]:
    write_log(logdir, txns(1, last), segment_max_bytes=max_bytes)
    return sorted(logdir.iterdir())


@pytest.mark.parametrize("damage", ["flip", "truncate", "zero_tail", "header"])
def test_damage_in_a_non_last_segment_raises(logdir, damage):
    paths = rolled_log(logdir)
    assert len(paths) >= 3
    victim = paths[1]
    size = victim.stat().st_size
    if damage == "flip":
        flip(victim, size - 3)
    elif damage == "truncate":
        os.truncate(victim, size - 5)
    elif damage == "zero_tail":
        with open(victim, "ab") as file:
            file.write(bytes(64))
    else:
        flip(victim, 9)
    with pytest.raises(LogCorruptError, match="wipe"):
        reopen(logdir)


def test_missing_middle_segment_raises(logdir):
    paths = rolled_log(logdir)
    paths[1].unlink()
    with pytest.raises(LogCorruptError, match="missing"):
        reopen(logdir)


def write_segment(logdir: Path, first: int, prev: int, zxids: list[int]) -> Path:
    logdir.mkdir(exist_ok=True)
    path = logdir / segment_name(first)
    path.write_bytes(encode_segment_header(first, prev) + b"".join(encode_record(txn(z)) for z in zxids))
    return path


def test_zxids_not_increasing_within_a_segment_raise(logdir):
    write_segment(logdir, 1, 0, [1, 3, 2])
    with pytest.raises(LogCorruptError, match="follows"):
        reopen(logdir)


def test_zxids_not_increasing_across_segments_raise(logdir):
    write_segment(logdir, 1, 0, [1, 9])
    write_segment(logdir, 5, 9, [5, 6])
    with pytest.raises(LogCorruptError):
        reopen(logdir)


def test_header_disagreeing_with_name_raises(logdir):
    path = write_segment(logdir, 1, 0, [1, 2])
    path.rename(logdir / segment_name(3))
    with pytest.raises(LogCorruptError):
        reopen(logdir)


@pytest.mark.parametrize("content", ["torn_header", "header_only", "zeros"])
def test_newest_segment_without_records_is_removed(logdir, content):
    write_log(logdir, txns(1, 4))
    cut_zero_fill(single_segment(logdir))  # as the roll that created the next segment did
    header = encode_segment_header(5, 4)
    body = {"torn_header": header[:11], "header_only": header, "zeros": bytes(4096)}[content]
    (logdir / segment_name(5)).write_bytes(body)
    with reopen(logdir) as log:
        assert zxids_of(log) == [1, 2, 3, 4]
        assert len(log.segment_paths()) == 1
        log.append([txn(5)])
        log.sync()
    with reopen(logdir) as log:
        assert zxids_of(log) == [1, 2, 3, 4, 5]


def test_torn_newest_header_with_records_behind_it_raises(logdir):
    write_log(logdir, txns(1, 4))
    path = write_segment(logdir, 5, 4, [5, 6])
    flip(path, 2)
    with pytest.raises(LogCorruptError):
        reopen(logdir)


# --- rolling ---------------------------------------------------------------------------


def test_rolling_splits_segments_that_chain_and_reopen(logdir):
    paths = rolled_log(logdir, last=40, max_bytes=200)
    assert len(paths) > 5
    assert all(p.stat().st_size <= 200 for p in paths[:-1])
    assert records_end(paths[-1]) <= 200
    assert [p.name for p in paths] == sorted(p.name for p in paths)
    with reopen(logdir, segment_max_bytes=200) as log:
        assert zxids_of(log) == list(range(1, 41))
        assert log.segment_paths() == paths
        log.append(txns(41, 60))
        log.sync()
    with reopen(logdir, segment_max_bytes=200) as log:
        assert zxids_of(log) == list(range(1, 61))


def test_record_larger_than_segment_max_gets_its_own_segment(logdir):
    with TxnLog.open(logdir, segment_max_bytes=64) as log:
        log.append([txn(1, size=500), txn(2, size=500), txn(3)])
        log.sync()
        assert len(log.segment_paths()) == 3
    with reopen(logdir, segment_max_bytes=64) as log:
        assert zxids_of(log) == [1, 2, 3]


def test_tiny_segment_max_is_refused(logdir):
    with pytest.raises(ValueError):
        TxnLog.open(logdir, segment_max_bytes=SEGMENT_HEADER_BYTES)


# --- truncate_after ------------------------------------------------------------------


@pytest.mark.parametrize("keep_through", [0, 1, 7, 13, 29, 30, 45])
def test_truncate_after_keeps_exactly_the_prefix_and_appends_continue(logdir, keep_through):
    rolled_log(logdir, last=30)
    with reopen(logdir, segment_max_bytes=200) as log:
        log.truncate_after(keep_through)
        kept = list(range(1, min(keep_through, 30) + 1))
        assert zxids_of(log) == kept
        assert log.last_zxid == (kept[-1] if kept else 0)
        nxt = log.last_zxid + 100
        log.append([txn(nxt), txn(nxt + 1)])
        log.sync()
    with reopen(logdir, segment_max_bytes=200) as log:
        assert zxids_of(log) == kept + [nxt, nxt + 1]


def test_truncate_after_a_zxid_between_records(logdir):
    write_log(logdir, [txn(z) for z in (2, 4, 6, 8)])
    with reopen(logdir) as log:
        log.truncate_after(5)
        assert zxids_of(log) == [2, 4]
        log.truncate_after(1)
        assert zxids_of(log) == [] and log.last_zxid == 0
        assert log.base_zxid == 0
        log.append([txn(3)])
        log.sync()
    with reopen(logdir) as log:
        assert zxids_of(log) == [3]


def test_truncate_after_makes_unsynced_survivors_durable(logdir):
    with TxnLog.open(logdir) as log:
        log.append(txns(1, 6))
        log.truncate_after(4)
        assert log.statistics()["records_pending_sync"] == 0
    with reopen(logdir) as log:
        assert zxids_of(log) == [1, 2, 3, 4]


def test_truncate_before_the_log_base_is_refused(logdir):
    rolled_log(logdir, last=30)
    with reopen(logdir, segment_max_bytes=200) as log:
        log.purge_through(10)
        base = log.base_zxid
        assert base and base >= 4
        with pytest.raises(ValueError):
            log.truncate_after(base - 1)
        log.truncate_after(base)
        assert log.last_zxid == 0 and log.base_zxid == base


# --- reset and purge -------------------------------------------------------------------


def test_reset_removes_everything_and_records_the_new_base(logdir):
    rolled_log(logdir, last=30)
    with reopen(logdir, segment_max_bytes=200) as log:
        log.reset(base_zxid=100)
        assert list(logdir.iterdir()) == []
        assert (log.last_zxid, log.base_zxid) == (0, 100)
        log.append(txns(101, 103))
        log.sync()
    with reopen(logdir, segment_max_bytes=200) as log:
        assert zxids_of(log) == [101, 102, 103]
        assert log.base_zxid == 100


def test_reset_without_a_base_marks_it_unknown(logdir):
    write_log(logdir, txns(1, 3))
    with reopen(logdir) as log:
        log.reset()
        log.append([txn(50)])
        log.sync()
    with reopen(logdir) as log:
        assert log.base_zxid is None and zxids_of(log) == [50]


def test_purge_through_deletes_whole_old_segments_only(logdir):
    paths = rolled_log(logdir, last=30)
    with reopen(logdir, segment_max_bytes=200) as log:
        assert log.purge_through(0) == 0
        removed = log.purge_through(10)
        assert removed >= 1
        assert log.first_zxid <= 11  # a record > 10 was never removed
        assert log.segment_paths() == paths[removed:]
        assert log.purge_through(10_000) == len(paths) - removed - 1
        assert log.segment_paths() == paths[-1:]  # the segment being appended to stays
        survivors = zxids_of(log)
        log.append([txn(31)])
        log.sync()
    with reopen(logdir, segment_max_bytes=200) as log:
        assert zxids_of(log) == survivors + [31]
        assert log.base_zxid == survivors[0] - 1
