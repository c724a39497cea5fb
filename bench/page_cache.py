"""What one 64 KB file write costs in CPU, by the way it reaches the disk: the question behind the 64 KB
ledger row, where two buffered writes per entry on each bookie (journal, entry log) take most of a node's CPU.

    python -m bench.page_cache [--folder DIR] [--writes N] [--size BYTES]

Prints CPU microseconds (user + system of this process) and wall microseconds per write for:
- buffered pwrite at fresh offsets (what the journal and the entry logs do: new page-cache pages each time);
- buffered pwrite over the same 4 MiB again and again (pages already in the page cache);
- buffered pwrite + fdatasync at fresh, preallocated offsets (the journal's group commit, one entry a batch);
- the same, each synced page then dropped from the page cache (posix_fadvise DONTNEED), so that later
  writes get pages the kernel just took back (tried in the bookie journal, not kept: in a bookie under
  64 KB appends the fadvise calls cost about what the writes saved);
- O_DIRECT pwrite + fdatasync from an aligned buffer, likewise (no page cache: what BookKeeper's
  journal can do with journalAlignmentSize and direct I/O).
On a run-on-demand basis only; nothing in the tests uses it.
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REGION = 4 << 20


def _measure(path: Path, count: int, flags: int, write: Callable[[int, int], None], *,
             preallocate: int = 0) -> tuple[float, float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
    try:
        if preallocate:  # as the journal's newest segment is (zab/snapshot.write_preallocated)
            os.posix_fallocate(fd, 0, preallocate)
            os.fsync(fd)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(count):
            write(fd, i)
        return (time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6
    finally:
        os.close(fd)
        path.unlink()


def measure(folder: Path, count: int, size: int) -> dict[str, tuple[float, float]]:
    data = os.urandom(size)
    aligned = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
    aligned[:] = data
    path = folder / "page-cache-bench.dat"
    per_region = max(1, REGION // size)
    rows = {
        "buffered pwrite, fresh offsets": _measure(path, count, 0, lambda fd, i: os.pwrite(fd, data, i * size)),
        "buffered pwrite, the same 4 MiB again": _measure(
            path, count, 0, lambda fd, i: os.pwrite(fd, data, (i % per_region) * size)),
        "buffered pwrite + fdatasync, fresh offsets": _measure(
            path, count // 4, 0, lambda fd, i: (os.pwrite(fd, data, i * size), os.fdatasync(fd)),
            preallocate=count // 4 * size),
    }
    dropped = [0]

    def write_sync_drop(fd: int, i: int) -> None:
        os.pwrite(fd, data, i * size)
        os.fdatasync(fd)
        end = (i + 1) * size // 4096 * 4096
        os.posix_fadvise(fd, dropped[0], end - dropped[0], os.POSIX_FADV_DONTNEED)
        dropped[0] = end

    rows["buffered pwrite + fdatasync + DONTNEED, fresh offsets"] = _measure(
        path, count // 4, 0, write_sync_drop, preallocate=count // 4 * size)
    try:
        rows["O_DIRECT pwrite + fdatasync, fresh offsets"] = _measure(
            path, count // 4, os.O_DIRECT, lambda fd, i: (os.pwrite(fd, aligned, i * size), os.fdatasync(fd)),
            preallocate=count // 4 * size)
    except OSError as err:  # tmpfs and some filesystems refuse O_DIRECT
        print(f"O_DIRECT not possible in {folder}: {err}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", default=None, help="a folder on the filesystem to measure (default: $TMPDIR)")
    parser.add_argument("--writes", type=int, default=4000)
    parser.add_argument("--size", type=int, default=65536, help="bytes per write (a multiple of 4096)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        for name, (cpu_us, wall_us) in measure(Path(tmp), args.writes, args.size).items():
            print(f"{name:55s} CPU {cpu_us:7.1f} us   wall {wall_us:7.1f} us   per {args.size:,} B write")


if __name__ == "__main__":
    main()
