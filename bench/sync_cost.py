"""`python -m bench.sync_cost [--ops N] [--rounds R] [--no-zk]`: what a `sync` costs, Quire against ZooKeeper.

Quire answers a sync only after a quorum confirmed its leadership in a round sent after the sync
arrived (zab/core/read_index.py); ZooKeeper answers it from the leader's state. This measures,
on 3 voters on loopback, through kazoo connected to a follower and to the leader:
- `get`: a plain read, the floor of one client round trip;
- `sync`: one sync at a time (latency);
- `sync+get`: a sync then a read (ZooKeeper's recipe for a read that is not stale);
- `sync x64`: 64 syncs in flight (throughput; Quire's syncs share rounds).
Quire's and ZooKeeper's rows alternate in `--rounds` windows; the table prints medians of the
windows' p50s (ms: lower is better) and of their rates (/s: higher is better). For an A/B of Quire itself run it from two checkouts
(`PYTHONPATH=<worktree> python -m bench.sync_cost --no-zk`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from kazoo.client import KazooClient

from bench import zk
from bench.quire import QuireCluster

OUTSTANDING = 64


def _timed(op: Callable[[], object], ops: int) -> list[float]:
    out = []
    for _ in range(ops):
        start = time.perf_counter()
        op()
        out.append(time.perf_counter() - start)
    return out


def _rate(client: KazooClient, ops: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < ops:
        batch = [client.sync_async("/sync-bench") for _ in range(min(OUTSTANDING, ops - done))]
        for result in batch:
            result.get(timeout=30)
        done += len(batch)
    return ops / (time.perf_counter() - start)


def measure(hosts: dict[str, str], ops: int) -> dict[str, float]:
    """p50 in ms of each lone operation through each node kind, and syncs/s with 64 in flight."""
    row: dict[str, float] = {}
    for where, host in hosts.items():
        client = KazooClient(hosts=host, timeout=10)
        client.start(timeout=30)
        try:
            if client.exists("/sync-bench") is None:
                client.create("/sync-bench", b"x")
            for name, op in (("get", lambda: client.get("/sync-bench")),
                             ("sync", lambda: client.sync("/sync-bench")),
                             ("sync+get", lambda: (client.sync("/sync-bench"), client.get("/sync-bench")))):
                _timed(op, ops // 10)  # warm-up
                row[f"{name} {where}"] = statistics.median(_timed(op, ops)) * 1000
            row[f"sync x{OUTSTANDING} {where}"] = _rate(client, ops * 4)
        finally:
            client.stop()
            client.close()
    return row


def quire_hosts(cluster: QuireCluster) -> dict[str, str]:
    leader = trio.run(cluster.leader)
    follower = next(nid for nid in cluster.nodes if nid != leader)
    return {w: "%s:%d" % cluster.client_address(nid) for w, nid in (("follower", follower), ("leader", leader))}


def zk_hosts(ensemble: zk.ZkEnsemble) -> dict[str, str]:
    leader = ensemble.wait_serving()
    follower = next(i for i in ensemble.ids if i != leader)
    return {"follower": ensemble.hosts(follower), "leader": ensemble.hosts(leader)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="lone operations per row and window")
    parser.add_argument("--rounds", type=int, default=3, help="alternated windows per system")
    parser.add_argument("--no-zk", action="store_true", help="Quire only (an A/B between two checkouts)")
    args = parser.parse_args()
    windows: dict[str, list[dict[str, float]]] = {"Quire": [], "ZooKeeper": []}
    with tempfile.TemporaryDirectory(prefix="quire-sync-") as tmp:
        with QuireCluster(Path(tmp) / "quire", bookies=False, log_level="warning") as quire:
            quire.start()
            qhosts = quire_hosts(quire)
            if args.no_zk:
                for _ in range(args.rounds):
                    windows["Quire"].append(measure(qhosts, args.ops))
            else:
                with zk.ZkEnsemble(Path(tmp) / "zk") as ensemble:
                    ensemble.start()
                    zhosts = zk_hosts(ensemble)
                    for _ in range(args.rounds):
                        windows["Quire"].append(measure(qhosts, args.ops))
                        windows["ZooKeeper"].append(measure(zhosts, args.ops))
    systems = [s for s in windows if windows[s]]
    keys = list(windows["Quire"][0])
    print("| row | " + " | ".join(systems) + (" | Quire / ZooKeeper |" if len(systems) == 2 else " |"))
    print("| --- |" + " ---: |" * (len(systems) + (len(systems) == 2)))
    for key in keys:
        values = [statistics.median(w[key] for w in windows[s]) for s in systems]
        unit = "/s" if key.startswith("sync x") else " ms p50"
        cells = [f"{v:,.0f}{unit}" if unit == "/s" else f"{v:.2f}{unit}" for v in values]
        ratio = [f"{values[0] / values[1]:.2f}x"] if len(values) == 2 else []
        print(f"| {key} | " + " | ".join(cells + ratio) + " |")


if __name__ == "__main__":
    main()
