"""The segment-file machinery the Zab txn log (zab/storage/txnlog.py) and the bookie journal
(bookie/journal.py) share: the newest segment's writer, fail-stop after a disk error, and
the durable truncations and removals of recovery and purging.

Both logs are directories of segments written at their end, of which only the newest is
preallocated and may hold unsynced bytes: a segment is cut to its records and fsynced
before the next one is created (`SegmentWriter.seal`), so opening a log may treat zero
fill or damage in any other segment as corruption, not a torn write. Their record formats
and names are their own; the files are handled here, once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from edge.files import FILE_MODE, fsync_directory, write_all, write_preallocated

_T = TypeVar("_T")


class SegmentWriter:
    """The open newest segment of a log: its descriptor, how much of it is allocated, and
    whether it holds bytes not yet synced. The log keeps the segment's size (where its
    records end) and passes it in."""

    def __init__(self, path: Path, *, preallocate_bytes: int) -> None:
        self.path = path
        self.preallocate_bytes = preallocate_bytes
        self.dirty = False  # written since the last sync
        self._fd: int | None = None
        self._allocated = 0  # bytes the file holds (records, then zero fill); valid with _fd

    @classmethod
    def create(cls, path: Path, header: bytes, *, preallocate_bytes: int) -> SegmentWriter:
        """A new segment holding `header` (not durable: sync it, and fsync the directory for its name)."""
        writer = cls(path, preallocate_bytes=preallocate_bytes)
        writer._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        write_all(writer._fd, header)
        writer._allocated = len(header)
        writer.dirty = True
        return writer

    def _descriptor(self) -> int:
        if self._fd is None:  # a segment this run did not create: reopened on first use
            self._fd = os.open(self.path, os.O_WRONLY)
            self._allocated = os.fstat(self._fd).st_size
        return self._fd

    def write(self, data: bytes, offset: int) -> None:
        """Write `data` at `offset` (the segment's end), growing the preallocation as needed."""
        self._allocated = write_preallocated(self._descriptor(), data, offset, self._allocated,
                                             self.preallocate_bytes)
        self.dirty = True

    def datasync(self) -> bool:
        """fdatasync if anything was written since the last sync; whether it did."""
        if not self.dirty:
            return False
        os.fdatasync(self._descriptor())
        self.dirty = False
        return True

    def seal(self, size: int) -> bool:
        """Cut the segment to its records (`size`: no zero fill may remain behind the newest
        segment), fsync it if anything changed, and close it; whether it fsynced. Also for a
        segment this run never wrote: it may end in zero fill."""
        fd = self._descriptor()
        if self._allocated > size:
            os.ftruncate(fd, size)
            self._allocated = size
            self.dirty = True
        synced = self.dirty
        if synced:
            os.fsync(fd)
            self.dirty = False
        self.close()
        return synced

    def close(self) -> None:
        """Release the descriptor without syncing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FailStop:
    """After an OSError in a write path a log refuses further use: after a failed write or
    fsync the kernel's view of the file is no longer trustworthy, and only a restart (which
    rescans the disk) is safe. `error` is the log's own StorageError class."""

    def __init__(self, error: type[Exception], what: str, restart: str) -> None:
        self.error, self.what, self.restart = error, what, restart
        self.failed: str | None = None

    def check(self) -> None:
        """Raise `error` if an earlier operation failed."""
        if self.failed is not None:
            raise self.error(f"{self.what} failed earlier ({self.failed}); {self.restart} so that it rescans it")

    def run(self, operation: Callable[..., _T], *args: object) -> _T:
        """Run a disk operation; an OSError fails the log for good (raised as `error`)."""
        try:
            return operation(*args)
        except OSError as err:
            self.failed = f"{type(err).__name__}: {err}"
            raise self.error(f"{self.what}: {self.failed}; {self.restart}") from err


def truncate_durably(path: Path, size: int) -> None:
    """Cut the file at `path` to `size` bytes and fsync it (a torn tail, a TRUNC)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Fsync what a crashed writer may have left only in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_durably(path: Path) -> None:
    """Unlink `path` and fsync its directory: removals reach the disk in the order made."""
    path.unlink()
    fsync_directory(path.parent)
