"""One bookie's storage engine: 100-byte adds/s with group commit vs the disk's own fsync rate.

`measure()` runs, on the same filesystem and in the same run: the plain
append + fsync loop of bench/disk.py (the disk's single-record fsync rate), then
BookieStorage with N concurrent adders (each awaits its add, then sends the
next, like N pipelined connections) for a few seconds, and reports adds/s,
adds per fsync and latency. Issue 4's target: >= 2x the single-record rate.

    python -m bench.bookie_storage --folder /tmp --adders 1,16,64,256 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from bench.disk import append_fsync
from bookie.entry import Digester, DigestType, master_key
from bookie.storage import AddRequest, BookieStorage, BookieStorageConfig

KEY = master_key(b"bench")
DIGESTER = Digester(DigestType.CRC32C, b"bench")


@dataclass
class AddRate:
    adders: int
    per_call: int
    payload_bytes: int
    adds: int
    elapsed_s: float
    fsyncs: int
    latency_p50_ms: float
    latency_p99_ms: float

    @property
    def adds_per_s(self) -> float:
        return self.adds / self.elapsed_s

    @property
    def adds_per_fsync(self) -> float:
        return self.adds / self.fsyncs if self.fsyncs else 0.0


async def _adds(folder: Path, adders: int, payload_bytes: int, seconds: float, per_call: int = 1) -> AddRate:
    storage = await BookieStorage.open(folder, 1, BookieStorageConfig())
    latencies: list[float] = []
    payload = b"p" * payload_bytes
    deadline = trio.current_time() + seconds
    before = storage.statistics()

    async def adder(ledger_id: int) -> None:
        # `per_call` adds per add_batch: what the service hands over from one socket read.
        entry_id = 0
        while trio.current_time() < deadline:
            batch = [AddRequest(ledger_id, e, KEY, DIGESTER.package(ledger_id, e, e - 1, 0, payload))
                     for e in range(entry_id, entry_id + per_call)]
            started = time.perf_counter()
            outcomes = await storage.add_batch(batch)
            assert outcomes == [None] * per_call, outcomes
            latencies.append(time.perf_counter() - started)
            entry_id += per_call

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        async with trio.open_nursery() as inner:
            for ledger_id in range(adders):
                inner.start_soon(adder, ledger_id + 1)
        nursery.cancel_scope.cancel()
    elapsed = time.perf_counter() - started
    after = storage.statistics()
    await storage.close(checkpoint=False)
    latencies.sort()
    return AddRate(adders, per_call, payload_bytes, after["adds"] - before["adds"], elapsed, after["fsyncs"] - before["fsyncs"],
                   1000 * statistics.median(latencies), 1000 * latencies[int(0.99 * (len(latencies) - 1))])


def measure(folder: Path, adder_counts: list[int], payload_bytes: int = 100, seconds: float = 3.0,
            per_call: int = 1) -> dict:
    """For each adder count: the disk's append+fsync rate, then the engine's add rate, interleaved
    so that each ratio compares the two on the same disk at the same time (a shared disk's fsync
    rate drifts by 10x when neighbours are busy)."""
    runs = []
    for adders in adder_counts:
        disk = append_fsync(folder, seconds)
        with tempfile.TemporaryDirectory(dir=folder, prefix="bookie-bench-") as tmp:
            rate = trio.run(_adds, Path(tmp), adders, payload_bytes, seconds, per_call)
        runs.append(dict(asdict(rate), adds_per_s=round(rate.adds_per_s), adds_per_fsync=round(rate.adds_per_fsync, 1),
                         disk_append_fsync_per_s=round(disk.per_s), vs_disk=round(rate.adds_per_s / disk.per_s, 2)))
    return {"runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--adders", default="1,16,64,256", help="comma-separated concurrent adder counts")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--per-call", type=int, default=1, help="adds per add_batch call (one socket read's worth)")
    args = parser.parse_args(argv)
    result = measure(args.folder, [int(n) for n in args.adders.split(",")], args.payload_bytes, args.seconds,
                     args.per_call)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
