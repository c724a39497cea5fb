"""Restart of a Zab node from its data directory, and retention of old files.

Layout of a data directory:

    <data_dir>/acceptedEpoch, <data_dir>/currentEpoch   zab.storage.epochfile
    <data_dir>/snapshots/snapshot.<zxid>                 zab.storage.snapshot
    <data_dir>/txnlog/log.<first zxid>                   zab.storage.txnlog

The node's state is the newest valid snapshot plus every logged txn after it.
Recovery refuses to start a node whose history has a hole (no valid snapshot
and a log that does not begin at the start of history, or a log that begins
after the snapshot ends): serving from such a state would silently forget
committed transactions (ZOOKEEPER-2325, ZOOKEEPER-3231; FAULTS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zab.storage.epochfile import read_epochs
from edge.files import ensure_directory
from zab.storage.snapshot import PurgePlan, SnapshotStore, read_body
from zab.storage.storage_errors import WIPE_ZAB_STATE, MissingHistoryError
from zab.core.txn import Txn
from zab.storage.txnlog import DEFAULT_SEGMENT_MAX_BYTES, TxnLog

TXNLOG_DIR = "txnlog"
SNAPSHOT_DIR = "snapshots"

_WIPE_ADVICE = "refuse to serve with missing history rather than start empty: " + WIPE_ZAB_STATE


@dataclass(frozen=True)
class Recovered:
    """Everything a node needs to resume: epochs, state, the txns to replay, open stores.

    Replay `txns` (all with zxid > snapshot_zxid, in order) on top of the
    snapshot at `snapshot_path` (None: the empty initial state), read in pieces
    with snapshot_chunks(). `log` is open for appends.
    """

    accepted_epoch: int
    current_epoch: int
    snapshot_zxid: int
    snapshot_path: Path | None
    txns: list[Txn]
    log: TxnLog
    snapshots: SnapshotStore

    def snapshot_chunks(self) -> Iterator[bytes] | None:
        """The snapshot's state in bounded pieces, read from its file as they are taken (checked
        whole once already; its CRC is checked again at the end), or None without a snapshot."""
        return None if self.snapshot_path is None else read_body(self.snapshot_path)

    @property
    def last_zxid(self) -> int:
        """The zxid the node's state reaches after replay (its lastZxid in Zab)."""
        return max(self.snapshot_zxid, self.txns[-1].zxid if self.txns else 0)


@dataclass(frozen=True)
class PurgeResult:
    snapshots_removed: list[Path]
    segments_removed: int


def recover(data_dir: Path, *, segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES) -> Recovered:
    """Read a node's data directory (creating it if new) and return its durable state.

    Repairs what a crash may leave (a torn log tail, temporary files); raises a
    StorageError subclass for anything that needs the operator.
    """
    data_dir = Path(data_dir)
    ensure_directory(data_dir)
    accepted_epoch, current_epoch = read_epochs(data_dir)
    snapshots = SnapshotStore(data_dir / SNAPSHOT_DIR)
    snapshots.discard_temporaries()
    log = TxnLog.open(data_dir / TXNLOG_DIR, segment_max_bytes=segment_max_bytes)
    try:
        newest = snapshots.newest_valid_file()  # checked in bounded pieces, never read whole
        snapshot_zxid, state = newest if newest is not None else (0, None)
        _check_history(snapshots, log, newest is not None, snapshot_zxid)
        if log.last_zxid == 0:
            # An empty log continues from the snapshot; record that for the next
            # segment so that a later recovery can check the log starts there.
            log.reset(base_zxid=snapshot_zxid)
        txns = list(log.read_after(snapshot_zxid))
    except BaseException:
        log.close()
        raise
    return Recovered(accepted_epoch, current_epoch, snapshot_zxid, state, txns, log, snapshots)


def _check_history(snapshots: SnapshotStore, log: TxnLog, have_snapshot: bool, snapshot_zxid: int) -> None:
    base = log.base_zxid
    if have_snapshot:
        if log.last_zxid and base is not None and base > snapshot_zxid:
            raise MissingHistoryError(
                f"the newest valid snapshot ends at {snapshot_zxid:#x} but the txn log in "
                f"{log.directory} starts after {base:#x}; {_WIPE_ADVICE}"
            )
        return
    if log.last_zxid and base != 0:
        raise MissingHistoryError(
            f"no valid snapshot in {snapshots.directory} and the txn log in {log.directory} "
            f"does not reach back to the start of history; {_WIPE_ADVICE}"
        )
    lost = [path for zxid, path in snapshots.files() if zxid > 0]
    if not log.last_zxid and lost:
        raise MissingHistoryError(
            f"every snapshot in {snapshots.directory} is invalid ({lost[-1].name} newest) and "
            f"the txn log is empty; {_WIPE_ADVICE}"
        )


def purge(snapshots: SnapshotStore, log: TxnLog, keep: int) -> PurgeResult:
    """Keep the newest `keep` valid snapshots and the log segments they need.

    Segments whose records all precede the oldest kept snapshot are deleted;
    the segment being appended to always stays. With no valid snapshot nothing
    is deleted: the log is then the only copy of history.
    """
    return apply_purge(snapshots.plan_purge(keep), snapshots, log)


def apply_purge(plan: PurgePlan, snapshots: SnapshotStore, log: TxnLog) -> PurgeResult:
    """Delete what `plan` (SnapshotStore.plan_purge, perhaps made on another thread) names, and
    the log segments before its oldest kept snapshot. Nothing at all if that file is gone: a SNAP
    installed since the plan was made replaced the snapshots, the log is the new one's history,
    and the plan's files are no longer what it saw (the next purge plans again)."""
    if plan.oldest_kept is None or not snapshots.path_for(plan.oldest_kept).exists():
        return PurgeResult([], 0)
    snapshots.remove(plan.remove)
    return PurgeResult(plan.remove, log.purge_through(plan.oldest_kept))
