"""Restarting a node from its data directory: snapshot + log combinations, holes, purge."""

from __future__ import annotations

from pathlib import Path

import pytest

from zab.storage.epochfile import ACCEPTED_EPOCH, CURRENT_EPOCH, write_epoch
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR, purge, recover
from zab.storage.snapshot import SnapshotStore, snapshot_name
from zab.storage.storage_errors import EpochFileError, MissingHistoryError
from zab.core.txn import Txn
from zab.storage.txnlog import TxnLog

SEGMENT_MAX = 200  # a few records per segment, so purge has whole segments to drop


def txn(zxid: int) -> Txn:
    return Txn(zxid=zxid, session_id=1, cxid=zxid, data=b"op%d" % zxid)


def log_txns(data_dir: Path, first: int, last: int) -> None:
    with TxnLog.open(data_dir / TXNLOG_DIR, segment_max_bytes=SEGMENT_MAX) as log:
        log.append([txn(z) for z in range(first, last + 1)])
        log.sync()


def snap(data_dir: Path, zxid: int) -> Path:
    return SnapshotStore(data_dir / SNAPSHOT_DIR).write(zxid, b"state@%d" % zxid)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def replayed(recovered) -> list[int]:
    return [t.zxid for t in recovered.txns]


def do_recover(data_dir: Path):
    recovered = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    recovered.log.close()
    return recovered


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "node1"


def test_brand_new_node_starts_empty(data_dir):
    r = do_recover(data_dir)
    assert (r.accepted_epoch, r.current_epoch, r.snapshot_zxid, r.snapshot_path) == (0, 0, 0, None)
    assert r.txns == [] and r.last_zxid == 0
    assert (data_dir / TXNLOG_DIR).is_dir() and (data_dir / SNAPSHOT_DIR).is_dir()


def test_log_only_replays_everything(data_dir):
    log_txns(data_dir, 1, 20)
    write_epoch(data_dir, ACCEPTED_EPOCH, 2)
    write_epoch(data_dir, CURRENT_EPOCH, 1)
    r = do_recover(data_dir)
    assert replayed(r) == list(range(1, 21)) and r.snapshot_path is None
    assert (r.accepted_epoch, r.current_epoch, r.last_zxid) == (2, 1, 20)


def test_snapshot_plus_log_replays_only_the_suffix(data_dir):
    log_txns(data_dir, 1, 20)
    snap(data_dir, 12)
    r = do_recover(data_dir)
    assert (r.snapshot_zxid, b"".join(r.snapshot_chunks())) == (12, b"state@12")
    assert replayed(r) == list(range(13, 21))


def test_snapshot_newer_than_the_log_is_fine(data_dir):
    # The state machine may apply a commit before this node's own fsync completes.
    log_txns(data_dir, 1, 5)
    snap(data_dir, 9)
    r = do_recover(data_dir)
    assert r.snapshot_zxid == 9 and r.txns == [] and r.last_zxid == 9


def test_invalid_newest_snapshot_falls_back_to_older_one(data_dir):
    log_txns(data_dir, 1, 20)
    snap(data_dir, 5)
    corrupt(snap(data_dir, 15))
    r = do_recover(data_dir)
    assert r.snapshot_zxid == 5 and replayed(r) == list(range(6, 21))


def test_all_snapshots_invalid_but_log_complete_replays_from_empty(data_dir):
    log_txns(data_dir, 1, 20)
    corrupt(snap(data_dir, 10))
    r = do_recover(data_dir)
    assert r.snapshot_path is None and replayed(r) == list(range(1, 21))


def test_all_snapshots_invalid_and_log_purged_refuses(data_dir):
    log_txns(data_dir, 1, 30)
    snap(data_dir, 20)
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    assert purge(r.snapshots, r.log, keep=1).segments_removed > 0
    r.log.close()
    corrupt(r.snapshots.path_for(20))
    with pytest.raises(MissingHistoryError, match="refuse to serve with missing history"):
        recover(data_dir)


def test_all_snapshots_invalid_and_log_empty_refuses(data_dir):
    corrupt(snap(data_dir, 10))
    with pytest.raises(MissingHistoryError, match="wipe"):
        recover(data_dir)


def test_snapshots_deleted_and_log_purged_refuses(data_dir):
    log_txns(data_dir, 1, 30)
    with TxnLog.open(data_dir / TXNLOG_DIR, segment_max_bytes=SEGMENT_MAX) as log:
        assert log.purge_through(10) > 0
    with pytest.raises(MissingHistoryError):
        recover(data_dir)


def test_gap_between_snapshot_and_log_refuses(data_dir):
    log_txns(data_dir, 1, 30)
    with TxnLog.open(data_dir / TXNLOG_DIR, segment_max_bytes=SEGMENT_MAX) as log:
        log.purge_through(15)
        base = log.base_zxid
    snap(data_dir, base - 2)
    with pytest.raises(MissingHistoryError, match="starts after"):
        recover(data_dir)


def test_snapshot_install_then_log_reset_then_restart(data_dir):
    # SNAP sync: the leader's snapshot replaces the whole local history.
    log_txns(data_dir, 1, 10)
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    r.log.truncate_after(50)
    r.snapshots.write(50, b"state@50")
    r.log.reset(base_zxid=50)
    r.log.append([txn(51), txn(52)])
    r.log.sync()
    r.log.close()
    r = do_recover(data_dir)
    assert r.snapshot_zxid == 50 and replayed(r) == [51, 52]


def test_empty_log_continues_from_the_snapshot_after_restart(data_dir):
    # Snapshot installed, log reset, crash before any append: the next segment
    # must still record that the log starts after the snapshot, so that losing
    # the snapshot later is detected instead of replaying from an empty state.
    snap(data_dir, 40)
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    r.log.append([txn(41)])
    r.log.sync()
    r.log.close()
    corrupt(r.snapshots.path_for(40))
    with pytest.raises(MissingHistoryError):
        recover(data_dir)


def test_torn_log_tail_is_repaired_during_recovery(data_dir):
    log_txns(data_dir, 1, 3)
    (segment,) = (data_dir / TXNLOG_DIR).iterdir()
    with open(segment, "ab") as file:
        file.write(b"\x00\x00\x00\x30\x12")
    r = do_recover(data_dir)
    assert replayed(r) == [1, 2, 3]


def test_corrupt_epoch_file_stops_recovery(data_dir):
    data_dir.mkdir()
    (data_dir / ACCEPTED_EPOCH).write_bytes(b"3 00000000\n")
    with pytest.raises(EpochFileError):
        recover(data_dir)


def test_leftover_snapshot_tmp_is_discarded(data_dir):
    snap(data_dir, 5)
    tmp = data_dir / SNAPSHOT_DIR / (snapshot_name(9) + ".tmp")
    tmp.write_bytes(b"partial")
    r = do_recover(data_dir)
    assert r.snapshot_zxid == 5 and not tmp.exists()


def test_recovered_log_accepts_appends_and_survives_another_restart(data_dir):
    log_txns(data_dir, 1, 5)
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    r.log.append([txn(6), txn(7)])
    r.log.sync()
    r.log.close()
    assert replayed(do_recover(data_dir)) == list(range(1, 8))


# --- purge ---------------------------------------------------------------------------


def test_purge_keeps_n_snapshots_and_the_segments_they_need(data_dir):
    log_txns(data_dir, 1, 60)
    for zxid in (10, 20, 30, 40, 50):
        snap(data_dir, zxid)
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    result = purge(r.snapshots, r.log, keep=2)
    assert [p.name for p in result.snapshots_removed] == [snapshot_name(z) for z in (10, 20, 30)]
    assert result.segments_removed > 0
    assert r.snapshots.valid_zxids() == [40, 50]
    assert r.log.first_zxid <= 41  # recovery from snapshot 40 still has every later record
    r.log.close()
    # Even if the newest kept snapshot is lost, the oldest kept one plus the log suffice.
    corrupt(r.snapshots.path_for(50))
    r = do_recover(data_dir)
    assert r.snapshot_zxid == 40 and replayed(r) == list(range(41, 61))


def test_purge_without_valid_snapshot_keeps_the_whole_log(data_dir):
    log_txns(data_dir, 1, 30)
    corrupt(snap(data_dir, 20))
    r = recover(data_dir, segment_max_bytes=SEGMENT_MAX)
    result = purge(r.snapshots, r.log, keep=1)
    assert result.snapshots_removed == [] and result.segments_removed == 0
    assert r.log.first_zxid == 1
    r.log.close()
