"""The disk's own fsync rate, measured with a plain Python loop on the data dirs' filesystem.

`append_fsync` is the reference for Quire's log (append-only file, os.fsync),
as the brief asks: write 100 bytes at the end, fsync, repeat for a few seconds.
`zk_pattern_fdatasync` is ZooKeeper's log pattern, for context: the file is
grown in 64 MB steps by writing one byte at the new end (leaving a hole), then
records are written into the hole and synced with FileChannel.force(false),
i.e. fdatasync. The size rarely changes, so there is less metadata to commit.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RECORD = b"r" * 100
PREALLOCATE_BYTES = 64 << 20


@dataclass
class FsyncRate:
    name: str
    syncs: int
    elapsed_s: float

    @property
    def per_s(self) -> float:
        return self.syncs / self.elapsed_s

    @property
    def mean_ms(self) -> float:
        return 1000 * self.elapsed_s / self.syncs


def append_fsync(folder: Path, duration_s: float = 3.0) -> FsyncRate:
    """Append 100 bytes + os.fsync in a loop for `duration_s`."""
    with tempfile.TemporaryDirectory(dir=folder, prefix="fsync-") as tmp:
        fd = os.open(Path(tmp) / "append", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            return _loop("append 100 B + fsync", duration_s, lambda: (os.write(fd, RECORD), os.fsync(fd)))
        finally:
            os.close(fd)


def zk_pattern_fdatasync(folder: Path, duration_s: float = 3.0) -> FsyncRate:
    """Append 100 bytes inside a file pre-grown to 64 MB (a hole) + os.fdatasync: ZooKeeper's FileTxnLog."""
    with tempfile.TemporaryDirectory(dir=folder, prefix="fsync-") as tmp:
        fd = os.open(Path(tmp) / "prealloc", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"\0", PREALLOCATE_BYTES - 1)  # ZooKeeper's padFile: one byte at the new end
            os.fsync(fd)
            offset = 0

            def step() -> None:
                nonlocal offset
                os.pwrite(fd, RECORD, offset)
                offset += len(RECORD)
                os.fdatasync(fd)

            return _loop("write 100 B into a pre-grown 64 MB file + fdatasync (ZooKeeper's pattern)",
                         duration_s, step)
        finally:
            os.close(fd)


def _loop(name: str, duration_s: float, step) -> FsyncRate:  # noqa: ANN001 - a no-argument callable
    syncs = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < duration_s:
        step()
        syncs += 1
    return FsyncRate(name, syncs, elapsed)
