"""Files every edge of Quire writes the same way (the txn log, snapshots, the epoch files, the
bookie's journal, entry logs and checkpoints, the daemon's own files): private modes, directories
fsynced into their parents, writes that finish, preallocated segments, atomic replacement.

Every file and directory Quire creates under a data dir is private to the daemon's user: txns,
znode data, ledger entries and master keys are all there (issue 17).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
TMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and unlinks inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_directory(directory: Path) -> list[Path]:
    """Create `directory` (and parents) if missing, DIRECTORY_MODE, each fsynced into its parent (an
    entry not fsynced may vanish in a crash with all that was written inside). Returns the
    directories it created, outermost first."""
    if directory.is_dir():
        return []
    created = ensure_directory(directory.parent)
    directory.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
    fsync_directory(directory.parent)
    return [*created, directory]


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written (a regular file may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_preallocated(fd: int, data: bytes, offset: int, allocated: int, step: int) -> int:
    """Write `data` at `offset` of a preallocated file (the txn log's and the bookie journal's newest
    segment) whose first `allocated` bytes are allocated; when it would not fit, first extend the
    allocation with posix_fallocate by `step`, or by as much as `data` needs. Returns the new allocation."""
    end = offset + len(data)
    if end > allocated:
        grow = max(step, end - allocated)
        os.posix_fallocate(fd, allocated, grow)
        allocated += grow
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    return allocated


def write_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Replace `path` with `chunks` so that a crash leaves the old or the new file.

    tmp file, fsync, rename over `path`, fsync the directory. A leftover
    `<path>.tmp` from an earlier crash is simply overwritten.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        for chunk in chunks:
            write_all(fd, chunk)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)
