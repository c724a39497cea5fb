"""Micro benchmark of the ledger append path: CPU per entry, end to end.

Three real bookie processes (BookieStorage + BookieService only, no Zab, no
metastore: the metadata lives in an in-memory register in the client) and one
client process appending entries pipelined through the SDK (WriteHandle ->
OpDriver -> BookiePool -> TCP -> BookieService -> group commit -> ack back).
Reports entries/s, append latency at low load (one append at a time), and the
CPU seconds the client and the bookies spent per entry (from /proc), which is
what bounds throughput on a small machine shared by all four processes.

    python -m bench.append_path --seconds 5 --payload 100 --window 2000 --ensemble 3,3,3
    python -m bench.append_path --profile-bookie 10   # py-spy the first bookie meanwhile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import trio

from bookie.client import BookiePool
from bookie.service import BookieService
from bookie.storage import BookieStorage, BookieStorageConfig
from ledger.client import LedgerClient
from ledger.errors import MetadataConflict, NoSuchLedger

TICKS = os.sysconf("SC_CLK_TCK")


class _NoRegistrations:
    async def children(self, path: str) -> list[str]:
        from metastore.errors import NoNode
        raise NoNode(path)


class _MemoryManager:
    """LedgerManager's interface over a dict (the append path never waits on metadata)."""

    def __init__(self) -> None:
        self.ledgers: dict[int, tuple] = {}

    async def create(self, metadata):
        stored = replace(metadata, ledger_id=len(self.ledgers) + 1)
        self.ledgers[stored.ledger_id] = (stored, 0)
        return stored, 0

    async def read(self, ledger_id):
        if ledger_id not in self.ledgers:
            raise NoSuchLedger(f"ledger {ledger_id}")
        return self.ledgers[ledger_id]

    async def write(self, metadata, expected_version):
        if self.ledgers[metadata.ledger_id][1] != expected_version:
            raise MetadataConflict("bad version")
        self.ledgers[metadata.ledger_id] = (metadata, expected_version + 1)
        return expected_version + 1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def serve_bookie(directory: str, bookie_id: int) -> None:
    storage = await BookieStorage.open(Path(directory), bookie_id, BookieStorageConfig())
    service = BookieService(storage, "127.0.0.1", 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        await nursery.start(service.run)
        print(json.dumps({"port": service.port}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
        print(json.dumps(service.statistics(), default=str), flush=True)
        nursery.cancel_scope.cancel()
    await storage.close(checkpoint=False)


def start_bookies(folder: Path, count: int) -> list[tuple[subprocess.Popen, int]]:
    out = []
    for b in range(1, count + 1):
        proc = subprocess.Popen([sys.executable, "-m", "bench.append_path", "--serve-bookie", str(folder / f"b{b}"),
                                 "--bookie-id", str(b)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        out.append((proc, json.loads(proc.stdout.readline())["port"]))
    return out


async def drive(ports: list[int], pids: list[int], args: argparse.Namespace) -> dict:
    e, qw, qa = args.ensemble
    payload = b"p" * args.payload
    addresses = {b: ("127.0.0.1", port) for b, port in enumerate(ports, 1)}
    async with BookiePool(addresses) as pool, LedgerClient(_NoRegistrations(), pool, _MemoryManager()) as client:
        w = await client.create(e, qw, qa, password=b"bench")
        latencies = []
        for _ in range(args.latency_appends):  # low load: one append at a time (before the CPU counts)
            started = time.perf_counter()
            await w.append(payload)
            latencies.append(time.perf_counter() - started)
        window: deque = deque()
        appended = 0
        started = time.perf_counter()
        cpu0 = time.process_time()
        bookie_cpu0 = [cpu_seconds(pid) for pid in pids]
        deadline = started + args.seconds
        while time.perf_counter() < deadline:
            while len(window) < args.window:
                window.append(w.start_append(payload))
            for _ in range(args.window // 4):
                await window.popleft().result()
                appended += 1
        while window:
            await window.popleft().result()
            appended += 1
        elapsed = time.perf_counter() - started
        client_cpu = time.process_time() - cpu0
        bookie_cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, bookie_cpu0)]
        await w.close()
    latencies.sort()
    return {"entries": appended, "elapsed_s": elapsed, "client_cpu_s": client_cpu, "bookie_cpu_s": bookie_cpu,
            "low_load_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
            "low_load_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else None}


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        bookies = start_bookies(Path(tmp), args.ensemble[0])
        try:
            spy = None
            if args.profile_bookie:
                spy = subprocess.Popen(["/tmp/venv/bin/py-spy", "record", "-o", args.profile_out, "-d",
                                        str(args.profile_bookie), "-p", str(bookies[0][0].pid), "-r", "200"])
            result = trio.run(drive, [port for _, port in bookies], [p.pid for p, _ in bookies], args)
            if spy is not None:
                spy.wait()
        finally:
            stats = []
            for proc, _ in bookies:
                proc.stdin.close()
                stats.append(json.loads(proc.stdout.readline() or "{}"))
                proc.wait(timeout=30)
    n = result["entries"]
    storage = stats[0].get("storage", {})
    return {**result, "entries_per_s": round(n / result["elapsed_s"]),
            "client_us_per_entry": round(1e6 * result["client_cpu_s"] / n, 1),
            "bookie_us_per_entry": [round(1e6 * c / n, 1) for c in result["bookie_cpu_s"]],
            "adds_per_fsync_b1": round(storage.get("adds_per_fsync", 0.0), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000, help="appends in flight")
    parser.add_argument("--ensemble", type=lambda s: tuple(int(x) for x in s.split(",")), default=(3, 3, 3))
    parser.add_argument("--latency-appends", type=int, default=300)
    parser.add_argument("--folder", default=None, help="where the bookie directories go (default: $TMPDIR)")
    parser.add_argument("--profile-bookie", type=float, default=0, help="py-spy bookie 1 for this many seconds")
    parser.add_argument("--profile-out", default="/tmp/bookie.svg")
    parser.add_argument("--serve-bookie", help=argparse.SUPPRESS)
    parser.add_argument("--bookie-id", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bookie:
        trio.run(serve_bookie, args.serve_bookie, args.bookie_id)
        return
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
