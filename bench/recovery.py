"""AutoRecovery benchmark (issue 6, "Measure"): re-replication after losing a bookie, next to the
disk's and loopback's own limits measured in the same run.

A throw-away 4-node cluster (bench/quire.py's config: 3 voters that are bookies, plus bookie-only
node 4), short grace periods. Ledgers with E=3, Qw=2, Qa=2 whose ensembles all include bookie 4 are
written until bookie 4 holds `--mb` MB (it holds 2 of every 3 entries); then node 4 is SIGKILLed.
Timed: kill -> first ledger marked (the registration's session timeout plus the auditor's grace),
marked -> no ledger references bookie 4 (the copying), and the bytes the workers copied (their
/status counters). Limits: 1 MiB append + fsync on the data dirs' filesystem, and one TCP stream
over loopback, both measured in this run.

    python -m bench.recovery [--mb 1024] [--entry-kb 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio

from bench import machine
from bench.ledger import large_append_fsync
from bench.quire import REPO, write_config
from bookie.client import BookiePool
from clusterd import config as cfg
from clusterd import localcluster
from ledger.client import LedgerClient
from metastore.client import MetaClient

MB = 1_000_000
SPARE = 4
LEDGER_ENTRIES = 256  # per ledger: many ledgers, so the three workers (one per ledger at a time) all copy
FACTS = ("date", "nproc", "cpu", "ram", "kernel", "python", "git")
SETTINGS = ("autorecovery_grace_ms = 1000\nautorecovery_open_ledger_grace_ms = 1000\n"
            "audit_interval_ms = 600000\nautorecovery_session_timeout_ms = 4000\n")


def four_node_config(folder: Path) -> cfg.ClusterConfig:
    path = write_config(folder)
    text = re.sub(r"(?m)^\[cluster\]\n", "[cluster]\n" + SETTINGS, path.read_text(), count=1)
    path.write_text(text + localcluster.extra_node(4, "bookie"))
    return cfg.load(path)


def loopback_mb_per_s(total: int = 512 * MB, chunk: int = 1 << 20) -> float:
    """One TCP stream over 127.0.0.1, sender and receiver in two threads of this process."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = [0]

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            while received[0] < total:
                data = conn.recv(1 << 20)
                if not data:
                    break
                received[0] += len(data)

    thread = threading.Thread(target=receive)
    thread.start()
    block = b"x" * chunk
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sender:
        for _ in range(total // chunk):
            sender.sendall(block)
    thread.join()
    elapsed = time.perf_counter() - started
    server.close()
    return received[0] / elapsed / MB


async def wait_bookies(config: cfg.ClusterConfig, timeout_s: float = 120) -> None:
    with trio.fail_after(timeout_s):
        while True:
            statuses = await localcluster.fetch_statuses(config, timeout_s=1.0)
            if all(s and s.get("bookie", {}).get("registered") for s in statuses.values()):
                return
            await trio.sleep(0.2)


async def write_ledgers(config: cfg.ClusterConfig, held_bytes: int, entry_bytes: int) -> tuple[list[int], float]:
    """Ledgers on bookie 4 until it holds `held_bytes`; their ids and the write rate (MB/s)."""
    payload = b"r" * entry_bytes
    ids, on_spare = [], 0
    started = time.perf_counter()
    async with MetaClient(config.client_addresses()) as meta, BookiePool() as pool, \
            LedgerClient(meta, pool) as client:
        while on_spare < held_bytes:
            w = await client.create(3, 2, 2)
            if SPARE not in w.metadata.last_fragment.ensemble:
                await w.close()
                await client.delete(w.ledger_id)
                continue
            count = max(3, min(LEDGER_ENTRIES, (held_bytes - on_spare) * 3 // 2 // entry_bytes + 1))
            pending = [w.start_append(payload) for _ in range(count)]
            for p in pending:
                await p.result()
            await w.close()
            ids.append(w.ledger_id)
            on_spare += count * 2 // 3 * entry_bytes
    return ids, on_spare * 3 / 2 / (time.perf_counter() - started) / MB


async def copied_bytes(config: cfg.ClusterConfig) -> int:
    statuses = await localcluster.fetch_statuses(config, timeout_s=1.0)
    return sum(s["bookie"]["autorecovery"]["worker"].get("bytes_copied", 0) for s in statuses.values() if s)


async def watch_recovery(config: cfg.ClusterConfig, ledgers: list[int], killed_at: float) -> dict[str, float]:
    marked_at = None
    async with MetaClient(config.client_addresses()) as meta, BookiePool() as pool, \
            LedgerClient(meta, pool) as client:
        while True:
            tasks = await meta.children("/quire/underreplicated") if await meta.exists(
                "/quire/underreplicated") else []
            if tasks and marked_at is None:
                marked_at = time.perf_counter()
            if marked_at is not None and not tasks:
                left = [i for i in ledgers if SPARE in (await client.manager.read(i))[0].bookies]
                if not left:
                    done = time.perf_counter()
                    return {"to_marked_s": marked_at - killed_at, "copy_s": done - marked_at,
                            "total_s": done - killed_at}
            await trio.sleep(0.05)


def run(mb: int, entry_kb: int, folder: Path) -> dict[str, Any]:
    config = four_node_config(folder)
    procs = {n.id: localcluster.spawn(config, n) for n in config.nodes}
    try:
        trio.run(wait_bookies, config)
        disk = large_append_fsync(folder, 3.0)
        loopback = loopback_mb_per_s()
        ledgers, write_mb_s = trio.run(write_ledgers, config, mb * MB, entry_kb * 1024)
        before = trio.run(copied_bytes, config)
        procs[SPARE].send_signal(signal.SIGKILL)
        procs[SPARE].wait()
        times = trio.run(watch_recovery, config, ledgers, time.perf_counter())
        copied = trio.run(copied_bytes, config) - before
        return {"mb_on_lost_bookie": mb, "entry_kb": entry_kb, "ledgers": len(ledgers), "write_mb_s": write_mb_s,
                "copied_mb": copied / MB, "rereplication_mb_s": copied / MB / times["copy_s"], **times,
                "disk_mb_s": disk.mb_per_s, "loopback_mb_s": loopback}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a benchmark's cleanup: make sure nothing is left running
                p.kill()


def report(r: dict[str, Any], command: str, facts: dict[str, str]) -> str:
    machine_line = ", ".join(f"{k}: {facts[k]}" for k in FACTS if k in facts)
    return f"""## AutoRecovery: re-replication after losing a bookie (bench/recovery.py)

Command: `{command}`. Machine: {machine_line}.

A 4-node cluster (3 voters+bookies, bookie-only node 4); {r['ledgers']} closed ledgers with E=3, Qw=2, Qa=2,
{r['entry_kb']} KiB entries, all on bookie 4, which held {r['mb_on_lost_bookie']} MB of them (written at
{r['write_mb_s']:.1f} MB/s of ledger data). Node 4 SIGKILLed; grace period 1 s.

| measure | value |
|---|---|
| kill -> first ledger marked (bookie session timeout 10 s + grace) | {r['to_marked_s']:.1f} s |
| marked -> no ledger references the lost bookie | {r['copy_s']:.1f} s |
| kill -> full replication | {r['total_s']:.1f} s |
| bytes copied by the workers | {r['copied_mb']:.0f} MB |
| re-replication throughput (copied / copy time, 3 workers) | {r['rereplication_mb_s']:.1f} MB/s |
| disk: 1 MiB append + fsync, same filesystem, same run | {r['disk_mb_s']:.0f} MB/s |
| loopback: one TCP stream, same run | {r['loopback_mb_s']:.0f} MB/s |
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of ledger data on the lost bookie (default 1024)")
    parser.add_argument("--entry-kb", type=int, default=64, help="entry size in KiB (default 64)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown section here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quire-recovery-bench-") as tmp:
        result = run(args.mb, args.entry_kb, Path(tmp))
        facts = machine.facts(Path(tmp), REPO)
    text = report(result, f"python -m bench.recovery --mb {args.mb} --entry-kb {args.entry_kb}", facts)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
