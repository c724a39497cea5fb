"""The txn log: Zab's write-ahead log, as append-only segment files.

A node logs every proposal before it ACKs it, and ACKs only after sync(): the
driver appends a batch of proposals, calls sync() once (group commit), then
sends the ACKs. This module is synchronous; the trio driver runs it in a thread.

Segments live in one directory, named `log.<first zxid as 16 lowercase hex>` so
that name order is zxid order. Each starts with a 28-byte header, integers
big-endian (see docs/formats.md, "Transaction log"):

    offset  size  field
    0       4     magic        b"QTXL"
    4       4     version      u32, 1
    8       8     first_zxid   u64, zxid of the segment's first record (= the name)
    16      8     prev_zxid    u64, zxid of the last record of the previous segment;
                               for the oldest segment the history that precedes it:
                               0 = history starts here, 2**64-1 = unknown
    24      4     header_crc   u32, CRC-32C of bytes 0..23

followed by records in the zab.storage.record format.

Preallocation, as ZooKeeper's preAllocSize: the newest segment is extended
with posix_fallocate PREALLOCATE_BYTES at a time and records are written in
place (pwrite) into that zero fill, then made durable with fdatasync. An
fsync after a write that grew the file also commits its new size, which on
ext4 is a filesystem-journal commit; in place, fdatasync commits the records
and only the metadata needed to read them back (POSIX). On the benchmark
machine a 150-byte record's write and sync took 195 us p50 (80 us of CPU)
appended and fsynced, 128 us (50 us) in place with fdatasync. So the newest
segment may end in zero bytes after its last record: a clean end
(zab.storage.record's `zero_fill`). A segment is cut to its last record before the
next one is created, so zero fill anywhere else is damage.

Crash rules: only the newest segment may end in a torn or corrupt tail, because
a segment is fsynced before the next one is created; such a tail held nothing
synced and is truncated on open. Damage anywhere else means acknowledged history
may be gone: open() raises LogCorruptError instead of guessing.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from crc32c import crc32c

from zab.storage.record import encode_record, offset_after, scan_records, scan_zxids, valid_record_follows
from edge.files import ensure_directory, fsync_directory
from edge.segments import FailStop, SegmentWriter, fsync_file, remove_durably, truncate_durably
from zab.storage.storage_errors import FIX_THE_DISK, WIPE_ZAB_STATE, DiskWriteFailed, LogCorruptError, RecordReason
from zab.core.txn import Txn

_log = logging.getLogger("quire.txnlog")
_T = TypeVar("_T")

MAGIC = b"QTXL"
VERSION = 1
_HEADER = struct.Struct(">4sIQQI")
SEGMENT_HEADER_BYTES = _HEADER.size  # 28
# prev_zxid of an oldest segment written after reset() without a known base.
UNKNOWN_PREV_ZXID = (1 << 64) - 1
DEFAULT_SEGMENT_MAX_BYTES = 64 * 1024 * 1024
PREALLOCATE_BYTES = 4 * 1024 * 1024
_NAME = re.compile(r"log\.([0-9a-f]{16})")

_WIPE_ADVICE = (
    "this node's txn log is damaged before its end, so acknowledged history may be "
    "lost: do not start it as is; "
    + WIPE_ZAB_STATE
)


def segment_name(first_zxid: int) -> str:
    """The file name of the segment whose first record is `first_zxid`."""
    return f"log.{first_zxid:016x}"


def encode_segment_header(first_zxid: int, prev_zxid: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, first_zxid, prev_zxid, 0)[:-4]
    return head + struct.pack(">I", crc32c(head))


def decode_segment_header(buf: bytes | memoryview) -> tuple[int, int] | None:
    """(first_zxid, prev_zxid) of a segment, or None if its header is torn or invalid."""
    if len(buf) < SEGMENT_HEADER_BYTES:
        return None
    magic, version, first_zxid, prev_zxid, crc = _HEADER.unpack_from(buf)
    if crc32c(memoryview(buf)[: SEGMENT_HEADER_BYTES - 4]) != crc:
        return None
    if magic != MAGIC or version != VERSION:
        return None
    return first_zxid, prev_zxid


@dataclass
class _Segment:
    path: Path
    first_zxid: int
    prev_zxid: int
    last_zxid: int  # of its last record; 0 only between creation and first write
    size: int  # bytes of header and whole records: where the next record goes


class TxnLog:
    """An open txn log directory. Use TxnLog.open(); one owner at a time.

    Not thread-safe: the driver serialises calls (one to_thread call at a time).
    After an OSError in a write path the log refuses further use (DiskWriteFailed):
    after a failed write or fsync the kernel's view of the file is no longer
    trustworthy, and only a restart (which rescans the disk) is safe.
    """

    def __init__(self, directory: Path, segments: list[_Segment], segment_max_bytes: int) -> None:
        """Internal: use TxnLog.open()."""
        self.directory = directory
        self._segments = segments
        self._segment_max_bytes = segment_max_bytes
        # prev_zxid (as on disk) for the first segment created while the log is empty.
        self._empty_base = 0
        self._writer: SegmentWriter | None = None  # the newest segment's, once used
        self._dir_dirty = False
        self._pending_records = 0
        self._fail_stop = FailStop(DiskWriteFailed, f"writing the txn log {directory}", FIX_THE_DISK)
        self._closed = False
        self._stats = {"records_appended": 0, "records_synced": 0, "syncs": 0, "bytes_written": 0}
        self._last_sync_seconds = 0.0

    # --- opening -----------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, *, segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES) -> TxnLog:
        """Open (creating if needed) the log in `directory`, repairing a torn tail.

        Every record found is durable when this returns (it may have been
        written, but not synced, by a process that crashed).

        Raises LogCorruptError when anything but the newest segment's tail is
        damaged, or zxids do not strictly increase across the whole log.
        """
        if segment_max_bytes <= SEGMENT_HEADER_BYTES:
            raise ValueError(f"segment_max_bytes must exceed the {SEGMENT_HEADER_BYTES}-byte header")
        directory = Path(directory)
        ensure_directory(directory)
        paths = _segment_paths(directory)
        segments: list[_Segment] = []
        for index, path in enumerate(paths):
            segment = _load_segment(path, is_last=index == len(paths) - 1)
            if segment is not None:
                _check_follows(segments[-1] if segments else None, segment)
                segments.append(segment)
        _make_durable(directory, segments)
        return cls(directory, segments, segment_max_bytes)

    # --- queries -----------------------------------------------------------------

    @property
    def last_zxid(self) -> int:
        """Zxid of the newest record (synced or not), 0 when the log is empty."""
        return self._segments[-1].last_zxid if self._segments else 0

    @property
    def first_zxid(self) -> int:
        """Zxid of the oldest record, 0 when the log is empty."""
        return self._segments[0].first_zxid if self._segments else 0

    @property
    def base_zxid(self) -> int | None:
        """The zxid history had reached just before the log's oldest record.

        0 means the log holds history from its very beginning; None means unknown
        (segments written after reset() without a base).
        """
        prev = self._segments[0].prev_zxid if self._segments else self._empty_base
        return None if prev == UNKNOWN_PREV_ZXID else prev

    def segment_paths(self) -> list[Path]:
        """The segment files, oldest first."""
        return [segment.path for segment in self._segments]

    def read_after(self, zxid: int) -> Iterator[Txn]:
        """Every record with a zxid greater than `zxid`, in order, read from disk.

        Sees appended but unsynced records. Do not mutate the log while iterating.
        Raises LogCorruptError if a segment changed on disk since it was checked.
        """
        for segment in list(self._segments):
            if segment.last_zxid <= zxid:
                continue
            yield from _read_segment_records(segment, after=zxid)

    def statistics(self) -> dict[str, float | int]:
        """Counters for metrics: records_per_sync is the mean group-commit size."""
        stats: dict[str, float | int] = dict(self._stats)
        syncs = self._stats["syncs"]
        stats["records_per_sync"] = self._stats["records_synced"] / syncs if syncs else 0.0
        stats["last_sync_seconds"] = self._last_sync_seconds
        stats["records_pending_sync"] = self._pending_records
        stats["segments"] = len(self._segments)
        return stats

    # --- appending -----------------------------------------------------------------

    def append(self, txns: Sequence[Txn]) -> None:
        """Write `txns` after the newest record. Not durable until sync().

        Raises ValueError unless zxids strictly increase from last_zxid: the
        caller's bug. Rolls to a new segment when the current one would exceed
        segment_max_bytes (a lone record larger than that gets a segment of its own).
        """
        self._check_usable()
        _check_increasing(self.last_zxid, txns)
        # Encode everything first so that a txn the codec refuses leaves no trace.
        records = [encode_record(txn) for txn in txns]
        batch: list[bytes] = []
        batch_bytes = 0
        for txn, record in zip(txns, records):
            if self._needs_roll(batch_bytes, len(record)):
                self._write_batch(batch, batch_bytes)
                batch, batch_bytes = [], 0
                self._guarded(self._roll, txn.zxid)
            batch.append(record)
            batch_bytes += len(record)
            # Kept in step with `batch`: _write_batch only adds the sizes.
            self._segments[-1].last_zxid = txn.zxid
        self._write_batch(batch, batch_bytes)

    def _needs_roll(self, batch_bytes: int, record_bytes: int) -> bool:
        if not self._segments:
            return True
        current = self._segments[-1]
        has_records = current.size + batch_bytes > SEGMENT_HEADER_BYTES
        return has_records and current.size + batch_bytes + record_bytes > self._segment_max_bytes

    def _write_batch(self, batch: list[bytes], batch_bytes: int) -> None:
        if not batch:
            return
        self._guarded(self._current().write, b"".join(batch), self._segments[-1].size)
        self._segments[-1].size += batch_bytes
        self._pending_records += len(batch)
        self._stats["records_appended"] += len(batch)
        self._stats["bytes_written"] += batch_bytes

    def _roll(self, first_zxid: int) -> None:
        """Start a new segment for `first_zxid`.

        The previous segment is fsynced first: only the newest segment may then
        hold unsynced bytes, which is what lets open() treat damage in any other
        segment as corruption rather than a torn write.
        """
        prev_zxid = self._segments[-1].last_zxid if self._segments else self._empty_base
        self._sync_and_close_current()
        path = self.directory / segment_name(first_zxid)
        header = encode_segment_header(first_zxid, prev_zxid)
        self._writer = SegmentWriter.create(path, header, preallocate_bytes=PREALLOCATE_BYTES)
        self._segments.append(_Segment(path, first_zxid, prev_zxid, 0, len(header)))
        self._dir_dirty = True  # the new name is durable only once the directory is fsynced
        self._stats["bytes_written"] += len(header)

    def _current(self) -> SegmentWriter:
        if self._writer is None:
            self._writer = SegmentWriter(self._segments[-1].path, preallocate_bytes=PREALLOCATE_BYTES)
        return self._writer

    def _sync_and_close_current(self) -> None:
        # Only the newest segment may hold unsynced bytes or end in zero fill (open() refuses
        # both anywhere else): sealed to its records, also when this run never wrote to it.
        if not self._segments:
            return
        self._current().seal(self._segments[-1].size)
        self._writer = None

    # --- durability ------------------------------------------------------------------

    def sync(self) -> None:
        """Make every record appended so far durable: the group-commit point.

        One fdatasync of the current segment (plus a fsync of the directory if a
        segment was created since the last sync). A sync with nothing pending is free and
        not counted.
        """
        self._check_usable()
        dirty = self._writer is not None and self._writer.dirty
        if not (dirty or self._dir_dirty):
            return
        started = time.perf_counter()
        if dirty:
            self._guarded(self._writer.datasync)
        if self._dir_dirty:
            self._guarded(fsync_directory, self.directory)
        self._dir_dirty = False
        self._last_sync_seconds = time.perf_counter() - started
        self._stats["syncs"] += 1
        self._stats["records_synced"] += self._pending_records
        self._pending_records = 0

    # --- removing history ---------------------------------------------------------------

    def truncate_after(self, zxid: int) -> None:
        """Durably remove every record with a zxid greater than `zxid` (Zab TRUNC).

        Any `zxid` >= base_zxid is accepted: it need not be a logged zxid; records
        <= zxid stay, and if none does the log becomes empty. When this returns,
        every remaining record is durable. Later segments go first, newest first,
        so a crash part-way leaves a prefix of the old log, never a hole.
        Raises ValueError for a zxid before base_zxid: that history lives only
        in a snapshot and cannot be undone here (the leader must send SNAP).
        """
        self._check_usable()
        base = self.base_zxid
        if base is not None and zxid < base:
            raise ValueError(f"cannot truncate to {zxid:#x}: the log starts after {base:#x}")
        if zxid >= self.last_zxid:
            return
        self._guarded(self._truncate_after, zxid)

    def _truncate_after(self, zxid: int) -> None:
        self._sync_and_close_current()
        if self._segments:
            self._empty_base = self._segments[0].prev_zxid
        while self._segments and self._segments[-1].first_zxid > zxid:
            self._unlink_newest()
        if self._segments:
            _truncate_segment_after(self._segments[-1], zxid)
        self._pending_records = 0

    def reset(self, *, base_zxid: int | None = None) -> None:
        """Durably remove every segment (after installing a snapshot from the leader).

        `base_zxid` is the zxid of that snapshot: the next segment records it as
        the history preceding the log (None: unknown). Segments go newest first.
        Call it only once the snapshot is durable, and after truncate_after(its
        zxid), so that no crash can leave log records beyond the snapshot that
        belong to a different history.
        """
        self._check_usable()
        self._guarded(self._reset, base_zxid)

    def _reset(self, base_zxid: int | None) -> None:
        self._sync_and_close_current()
        while self._segments:
            self._unlink_newest()
        self._empty_base = _prev_on_disk(base_zxid)
        self._pending_records = 0

    def _unlink_newest(self) -> None:
        segment = self._segments.pop()
        segment.path.unlink()
        # One directory fsync per unlink keeps the on-disk order of removals.
        fsync_directory(self.directory)

    def purge_through(self, zxid: int) -> int:
        """Delete whole segments whose records are all <= `zxid`; return how many.

        The newest segment (the one appended to) always stays. Oldest go first,
        each removal made durable before the next, so no crash leaves a hole.
        """
        self._check_usable()
        removed = 0
        while len(self._segments) > 1 and self._segments[0].last_zxid <= zxid:
            segment = self._segments.pop(0)
            self._guarded(segment.path.unlink)
            self._guarded(fsync_directory, self.directory)
            removed += 1
        return removed

    # --- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        """Release the file descriptor. Does not sync: unsynced records may be lost."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._closed = True

    def __enter__(self) -> TxnLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("txn log is closed")
        self._fail_stop.check()

    def _guarded(self, operation: Callable[..., _T], *args: object) -> _T:
        """Run a disk operation; after an OSError refuse further use (see class doc)."""
        return self._fail_stop.run(operation, *args)


# --- opening helpers ----------------------------------------------------------------


def _segment_paths(directory: Path) -> list[Path]:
    names = [entry.name for entry in os.scandir(directory) if _NAME.fullmatch(entry.name)]
    return [directory / name for name in sorted(names)]


def _load_segment(path: Path, *, is_last: bool) -> _Segment | None:
    """Check one segment file; repair the newest one's tail. None: it was removed."""
    buf = path.read_bytes()
    header = decode_segment_header(buf)
    if header is None:
        return _handle_bad_header(path, buf, is_last)
    first_zxid, prev_zxid = header
    if segment_name(first_zxid) != path.name:
        raise LogCorruptError(f"{path}: header names first zxid {first_zxid:#x}; {_WIPE_ADVICE}")
    scan = scan_zxids(buf, SEGMENT_HEADER_BYTES)  # every record checked; none decoded (read_after does)
    if scan.zero_fill and not is_last:
        raise LogCorruptError(f"{path}: zero bytes from offset {scan.valid_end} where records or the file's "
                              f"end belong (only the newest segment is preallocated); {_WIPE_ADVICE}")
    if scan.stop is not None:
        _handle_bad_tail(path, buf, scan.valid_end, scan.stop, scan.detail, is_last)
    if not scan.txns:
        return _handle_empty(path, is_last)
    _check_records(path, first_zxid, scan.txns)
    return _Segment(path, first_zxid, prev_zxid, scan.txns[-1], scan.valid_end)


def _handle_bad_header(path: Path, buf: bytes, is_last: bool) -> None:
    # A segment is created by writing its header; if that write is torn and no
    # record follows, the crash happened before the segment held anything.
    if is_last and not scan_records(buf[SEGMENT_HEADER_BYTES:]).txns:
        _log.warning("txn log %s: removing newest segment with a torn header", path)
        remove_durably(path)
        return None
    raise LogCorruptError(f"{path}: segment header is invalid; {_WIPE_ADVICE}")


def _handle_bad_tail(
    path: Path, buf: bytes, offset: int, reason: RecordReason, detail: str, is_last: bool
) -> None:
    if not is_last:
        raise LogCorruptError(f"{path}: {reason} record at offset {offset} ({detail}); {_WIPE_ADVICE}")
    if reason == RecordReason.CORRUPT and valid_record_follows(buf, offset):
        raise LogCorruptError(
            f"{path}: corrupt record at offset {offset} is followed by valid ones ({detail}); "
            + _WIPE_ADVICE
        )
    _log.warning(
        "txn log %s: truncating %s tail at offset %d (%d bytes dropped): %s",
        path, reason, offset, len(buf) - offset, detail,
    )
    truncate_durably(path, offset)


def _handle_empty(path: Path, is_last: bool) -> None:
    if not is_last:
        raise LogCorruptError(f"{path}: segment holds no record; {_WIPE_ADVICE}")
    _log.warning("txn log %s: removing newest segment, which holds no record", path)
    remove_durably(path)
    return None


def _check_records(path: Path, first_zxid: int, zxids: list[int]) -> None:
    if zxids[0] != first_zxid:
        raise LogCorruptError(f"{path}: first record {zxids[0]:#x} differs from header; {_WIPE_ADVICE}")
    for earlier, later in zip(zxids, zxids[1:]):
        if later <= earlier:
            raise LogCorruptError(f"{path}: zxid {later:#x} follows {earlier:#x}; {_WIPE_ADVICE}")


def _check_follows(previous: _Segment | None, segment: _Segment) -> None:
    """Segments must chain: each names the last zxid of the one before it."""
    if previous is None:
        if segment.prev_zxid != UNKNOWN_PREV_ZXID and segment.prev_zxid >= segment.first_zxid:
            raise LogCorruptError(f"{segment.path}: prev zxid not below first zxid; {_WIPE_ADVICE}")
        return
    if segment.prev_zxid != previous.last_zxid or segment.first_zxid <= previous.last_zxid:
        raise LogCorruptError(
            f"{segment.path}: does not continue {previous.path} (ends at {previous.last_zxid:#x}, "
            f"next segment says {segment.prev_zxid:#x}): a segment is missing or damaged; {_WIPE_ADVICE}"
        )


# --- file helpers -------------------------------------------------------------------


def _check_increasing(last_zxid: int, txns: Sequence[Txn]) -> None:
    previous = last_zxid
    for txn in txns:
        if txn.zxid <= previous:
            raise ValueError(f"zxid {txn.zxid:#x} does not follow {previous:#x}: zxids must increase")
        previous = txn.zxid


def _prev_on_disk(prev_zxid: int | None) -> int:
    return UNKNOWN_PREV_ZXID if prev_zxid is None else prev_zxid


def _read_segment_records(segment: _Segment, after: int) -> list[Txn]:
    """The segment's records above zxid `after`; those up to it are passed over by their lengths."""
    with open(segment.path, "rb") as file:
        buf = file.read(segment.size)
    scan = scan_records(buf, offset_after(buf, SEGMENT_HEADER_BYTES, after)) if len(buf) == segment.size else None
    if scan is None or scan.stop is not None:
        raise LogCorruptError(f"{segment.path}: changed on disk since the log was opened; {_WIPE_ADVICE}")
    return scan.txns


def _truncate_segment_after(segment: _Segment, zxid: int) -> None:
    """Cut `segment` just after its last record <= zxid (it has at least one)."""
    scan = scan_records(segment.path.read_bytes()[: segment.size], SEGMENT_HEADER_BYTES)
    keep = [i for i, txn in enumerate(scan.txns) if txn.zxid <= zxid]
    cut = scan.offsets[keep[-1] + 1] if keep[-1] + 1 < len(scan.offsets) else segment.size
    truncate_durably(segment.path, cut)
    segment.size = cut
    segment.last_zxid = scan.txns[keep[-1]].zxid


def _make_durable(directory: Path, segments: list[_Segment]) -> None:
    """Fsync what a crashed writer may have left only in the page cache.

    A process killed between write and fsync leaves records that this process
    can read but a power loss would still erase; the node must not claim them
    (in an election, in an ACK) before they are durable. Older segments were
    fsynced before the next one was created.
    """
    if segments:
        fsync_file(segments[-1].path)
    fsync_directory(directory)
