"""The floor under the 64 KB append row: what this machine does with the bytes alone, no protocol.

    python -m bench.write_floor [--folder DIR] [--seconds 5] [--size 65536] [--window 64] [--json]

Three minimal "bookies" (processes) and one client (this process) on loopback, shaped like the
E=Qw=Qa=3 append row: the client sends every entry to all three and keeps `window` entries
unacknowledged by the slowest at most; each bookie receives into one buffer, and a worker thread
writes what arrived in the journal (in place, in a segment preallocated 4 MiB at a time, as
bookie/journal.py does), fdatasyncs it, drops the synced pages from the page cache (what a bookie's
checkpoints do by deleting old journal segments), and sends one ack byte per entry. Two designs:

- double write: the batch also goes to an entry log (appended, not synced), as bookie/storage.py does
  with every add (the journal for durability, the entry log to read from after a checkpoint);
- single write: the journal only (a design that serves entries from the journal's own files).

Nothing per entry in Python: no frame header, no checksum, no digest, no index, no ledger metadata.
So the figures are the kernel's and the disk's share of the work (socket copies, page-cache copies,
writeback, fsync) on this machine: an upper bound for any implementation of that design here, not a
target. The ledger part of the suite (bench/ledger.py) runs it right after its 64 KB rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import machine

PREALLOCATE = 4 << 20  # bookie/journal.py's segment extension
WARMUP_S = 1.0


@dataclass
class FloorRun:
    design: str  # "double write" | "single write"
    size: int
    window: int
    entries_per_s: float
    busy_cores: float  # the whole machine's, over the timed window
    disk_mb_per_s: float | None = None  # what the folder's block device wrote meanwhile (/proc/diskstats)

    @property
    def mb_per_s(self) -> float:
        return self.entries_per_s * self.size / 1e6


def _bookie(folder: str, size: int, entry_log: bool, ready: multiprocessing.Queue) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ready.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    journal = os.open(os.path.join(folder, "journal"), os.O_RDWR | os.O_CREAT, 0o644)
    log = os.open(os.path.join(folder, "entrylog"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    arrived: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def commit() -> None:  # group commit: everything that arrived while the last fdatasync ran
        offset = end = dropped = 0
        while True:
            batch = [arrived.get()]
            while not arrived.empty():
                batch.append(arrived.get())
            if None in batch:
                return
            data = b"".join(batch)
            while offset + len(data) > end:
                os.posix_fallocate(journal, end, PREALLOCATE)
                end += PREALLOCATE
            os.pwrite(journal, data, offset)
            offset += len(data)
            if entry_log:
                os.write(log, data)
            os.fdatasync(journal)
            # Hand the synced pages back, as a bookie's checkpoints do by deleting the journal segments
            # before them (every 64 MiB of journal by default); without it the page cache grows by every
            # journaled byte, each write gets fresh memory, and on this VM the double write does about
            # half the throughput.
            os.posix_fadvise(journal, dropped, (offset & -4096) - dropped, os.POSIX_FADV_DONTNEED)
            dropped = offset & -4096
            conn.sendall(b"a" * (len(data) // size))

    worker = threading.Thread(target=commit, daemon=True)
    worker.start()
    buf = memoryview(bytearray(size * 64))
    have = 0
    while True:
        try:
            n = conn.recv_into(buf[have:])
        except OSError:
            n = 0
        if n == 0:
            arrived.put(None)
            worker.join()
            return
        have += n
        whole = have - have % size
        if whole:
            arrived.put(bytes(buf[:whole]))
            buf[:have - whole] = buf[whole:have]
            have -= whole


def run(folder: Path, *, entry_log: bool, seconds: float = 5.0, size: int = 65536, window: int = 64) -> FloorRun:
    """One design's run: WARMUP_S, then `seconds` counting entries acked by all three bookies."""
    ctx = multiprocessing.get_context("spawn")
    ready: multiprocessing.Queue = ctx.Queue()
    dirs = [tempfile.mkdtemp(prefix="floor-", dir=folder) for _ in range(3)]
    procs = [ctx.Process(target=_bookie, args=(d, size, entry_log, ready), daemon=True) for d in dirs]
    socks: list[socket.socket] = []
    try:
        for p in procs:
            p.start()
        for _ in procs:
            s = socket.create_connection(("127.0.0.1", ready.get(timeout=30)))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(s)
        acked = [0] * len(socks)
        changed = threading.Condition()

        def reader(i: int) -> None:
            while True:
                try:
                    data = socks[i].recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with changed:
                    acked[i] += len(data)
                    changed.notify_all()

        for i in range(len(socks)):
            threading.Thread(target=reader, args=(i,), daemon=True).start()
        payload = os.urandom(size)
        sent, clock = 0, time.perf_counter
        start, end = clock() + WARMUP_S, clock() + WARMUP_S + seconds
        base = None
        while (now := clock()) < end:
            if base is None and now >= start:
                with changed:
                    base, t0 = min(acked), now
                    cpu0, disk0 = machine.machine_jiffies(), machine.disk_bytes_written(folder)
            with changed:
                while sent - min(acked) >= window:
                    changed.wait()
            for s in socks:
                s.sendall(payload)
            sent += 1
        with changed:
            done = min(acked) - (base or 0)
        elapsed, cpu1, disk1 = clock() - t0, machine.machine_jiffies(), machine.disk_bytes_written(folder)
        busy = (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]) * (os.cpu_count() or 1)
        disk_mb = (disk1 - disk0) / elapsed / 1e6 if disk0 is not None and disk1 is not None else None
        return FloorRun("double write" if entry_log else "single write", size, window, done / elapsed, busy, disk_mb)
    finally:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_WR)  # the bookie drains, exits, and its side closes
            except OSError:
                pass
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        for s in socks:
            s.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="one JSON list of the runs on stdout")
    args = parser.parse_args()
    runs = [run(args.folder, entry_log=e, seconds=args.seconds, size=args.size, window=args.window)
            for e in (True, False)]
    if args.json:
        print(json.dumps([{**asdict(r), "mb_per_s": r.mb_per_s} for r in runs]))
        return
    for r in runs:
        print(f"{r.design:13}  {r.entries_per_s:9,.0f} entries/s  {r.mb_per_s:7,.1f} MB/s  "
              f"machine {r.busy_cores:.2f} cores busy  disk wrote {r.disk_mb_per_s or 0:,.0f} MB/s   "
              f"({r.size:,} B entries, {r.window} unacknowledged at most)")


if __name__ == "__main__":
    main()
