"""Errors raised by the durable storage of a Zab node (txn log, snapshots, epoch files).

The tree is small on purpose:

    StorageError                 the disk holds something we cannot trust or use
      LogCorruptError            the txn log is damaged before its end
      SnapshotCorruptError       one snapshot file fails its checks
      EpochFileError             acceptedEpoch / currentEpoch unreadable or inconsistent
      MissingHistoryError        recovery would have to start with a hole in history
      DiskWriteFailed            a write or fsync of the log or a snapshot failed while running
      RecordError                one log record cannot be decoded (reason: TORN or CORRUPT)
        TornRecordError          not enough bytes: a write that never completed
        CorruptRecordError       checksum mismatch or an impossible length

A torn or corrupt record at the end of the newest log segment is an expected
outcome of a crash and is repaired by TxnLog itself; every other StorageError
means the node must not serve, and the message tells the operator what to do.
Programming errors (appending a zxid that does not increase, an oversized txn)
are ValueError: a bug, not a condition of the disk.
"""

from __future__ import annotations

import enum

# What the operator does about a refusal below: the node's Zab files go, the rest of its data
# directory (the bookie's storage, the persisted ensemble, the pid and log files) stays, and the
# leader brings it back by DIFF or SNAP. One node at a time: a voter with an empty log counts
# toward a quorum at once (docs/operations.md, "Replacing a dead machine").
WIPE_ZAB_STATE = (
    "wipe this node's Zab state (acceptedEpoch, currentEpoch, txnlog/ and snapshots/ in its data "
    "directory; keep the rest) and restart it while the other nodes run: it resyncs from the leader"
)


# What the operator does when the disk failed under a running node (DiskWriteFailed).
FIX_THE_DISK = (
    "the node stopped rather than acknowledge what it may not have written. Fix the disk (free "
    "space, its errors in the kernel log), then start the node again: it recovers from its log and "
    "catches up from the leader"
)


class StorageError(Exception):
    """Base class: durable state on this node cannot be trusted as it is."""


class LogCorruptError(StorageError):
    """The txn log is damaged somewhere other than its (repairable) tail."""


class SnapshotCorruptError(StorageError):
    """A snapshot file fails its header, length or checksum checks."""


class EpochFileError(StorageError):
    """An epoch file is unreadable, or the two epoch files contradict each other."""


class MissingHistoryError(StorageError):
    """Recovery found no way to rebuild history from the start without a hole."""


class DiskWriteFailed(StorageError):
    """Writing or fsyncing the txn log or a snapshot failed while the node ran (no space, an I/O
    error). The node stops (fail-stop): after a failed fsync the kernel may have dropped the pages,
    so nothing later may be acknowledged as durable. What it already acknowledged is on disk."""


class RecordReason(enum.StrEnum):
    """Why a record could not be decoded. Compares equal to "torn" / "corrupt"."""

    # Fewer bytes than the record needs (or a zero-filled header): the write
    # that would have produced it never completed.
    TORN = "torn"
    # Bytes are present but wrong: checksum mismatch or an impossible length.
    CORRUPT = "corrupt"


class RecordError(StorageError):
    """A txn log record could not be decoded; `reason` says whether torn or corrupt."""

    reason: RecordReason

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class TornRecordError(RecordError):
    """The buffer ends before the record does."""

    reason = RecordReason.TORN


class CorruptRecordError(RecordError):
    """The record's length is impossible or its checksum does not match."""

    reason = RecordReason.CORRUPT
