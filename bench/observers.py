"""Reads with observers: `python -m bench.observers [--window-s S] [--rounds N] [--clients P] [--outstanding N]`.

Issue 19's measure: total read throughput of 3 voters, then of 3 voters + 2 observers, in one run.
Both clusters (bench/quire.py, voters without the bookie role, the second with `observers=2`) run
for the whole benchmark on fresh ports and data directories, and their windows alternate (3
voters, 3+2, 3 voters, ...), so that both see about the same machine; an idle cluster costs
little (ticks and pings).

A window is P kazoo client processes (bench/kzworker.py, op "read": get() of 64 znodes of 100 B,
N get_async in flight each), process i connected to serving node i % nodes alone: the same
clients, spread over 3 nodes or over 5. They warm up, then count the reads completed inside one
common window. Over the window the CPU of every server and client process and of the whole
machine is read from /proc: on a small machine the clients (kazoo is pure Python) and the servers
share the cores, and the table says who had them.

Prints one markdown table (one row per setup, rounds pooled), the reads/s each serving node
answered, and the ratio of the two totals.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench import stats
from bench.kzbench import GO_DELAY_S, KEYS, READY_TIMEOUT_S, RESULT_GRACE_S, _Worker
from bench.machine import CpuMeter
from bench.quire import QuireCluster

VALUE = b"v" * 100


@dataclass
class Setup:
    """One cluster and what its windows measured, pooled."""

    label: str
    cluster: QuireCluster
    ok: int = 0
    wall_s: float = 0.0
    per_node: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    bad_reads: int = 0
    server_core_s: float = 0.0  # core-seconds of the server processes over the windows
    node_core_s: Counter[int] = field(default_factory=Counter)  # ... of each server
    client_core_s: float = 0.0
    machine_core_s: float = 0.0
    others_core_s: float = 0.0  # processes outside the benchmark: the machine is shared
    windows: list[float] = field(default_factory=list)  # reads/s of each window

    @property
    def serving(self) -> list[int]:
        return sorted(self.cluster.nodes)

    @property
    def rate(self) -> float:
        return self.ok / self.wall_s if self.wall_s else float("nan")

    def cores(self, core_s: float) -> float:
        return core_s / self.wall_s if self.wall_s else float("nan")

    @property
    def server_us_per_read(self) -> float:
        return 1e6 * self.server_core_s / self.ok if self.ok else float("nan")

    @property
    def projected(self) -> float:
        """Reads/s if every serving node had a core to itself: each node's reads per core-second it used,
        summed. A projection, not a measurement (a node's event loop is one thread: one core is its
        ceiling; the clients are not counted)."""
        return sum(self.per_node[n] / self.node_core_s[n] for n in self.serving if self.node_core_s[n])


def start(setup: Setup) -> None:
    cluster = setup.cluster
    cluster.start()
    trio.run(lambda: cluster.wait_all_broadcast(timeout_s=60))
    from kazoo.client import KazooClient

    client = KazooClient(hosts=",".join(f"{h}:{p}" for h, p in cluster.client_addresses()), timeout=10.0)
    client.start(timeout=30)
    try:
        client.ensure_path("/bench")
        for i in range(KEYS):
            client.create(f"/bench/k{i}", VALUE)
    finally:
        client.stop()
        client.close()


def window(setup: Setup, folder: Path, *, clients: int, outstanding: int, window_s: float, warmup_s: float) -> None:
    """P read clients spread over every serving node, warmed up, then one timed window; added to `setup`."""
    cluster, nodes = setup.cluster, setup.serving
    folder.mkdir(parents=True, exist_ok=True)
    workers: list[tuple[int, _Worker]] = []
    try:
        for w in range(clients):
            node = nodes[w % len(nodes)]
            host, port = cluster.client_address(node)
            spec = {"hosts": f"{host}:{port}", "op": "read", "outstanding": outstanding,
                    "value_bytes": len(VALUE), "keys": KEYS, "warmup_s": warmup_s}
            workers.append((node, _Worker(f"{setup.label} client{w + 1}", spec, folder / f"client{w + 1}.log")))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _, worker in workers:
            worker.line(deadline)  # "ready ..."
        t0 = time.monotonic() + GO_DELAY_S
        t1 = t0 + window_s
        for _, worker in workers:
            worker.send(f"go {t0!r} {t1!r}\n")
        servers = {f"node{n}": cluster.pid(n) for n in nodes}
        meter = CpuMeter({**servers, **{f"client{i + 1}": w.proc.pid for i, (_, w) in enumerate(workers)}})
        time.sleep(max(0.0, t0 - time.monotonic()))
        meter.start()
        time.sleep(max(0.0, t1 - time.monotonic()))
        meter.stop()
        deadline = time.monotonic() + RESULT_GRACE_S
        done = [(node, json.loads(worker.line(deadline))) for node, worker in workers]
    finally:
        for _, worker in workers:
            worker.close()
    ok = sum(d["ok"] for _, d in done)
    setup.ok += ok
    setup.wall_s += window_s
    setup.windows.append(ok / window_s)
    for node, d in done:
        setup.per_node[node] += d["ok"]
        setup.latencies += d["latencies"]
        setup.errors.update(d["errors"])
        setup.bad_reads += d["bad_reads"]
    setup.server_core_s += sum(meter.cores.get(name, 0.0) for name in servers) * meter.wall_s
    for n in nodes:
        setup.node_core_s[n] += meter.cores.get(f"node{n}", 0.0) * meter.wall_s
    setup.client_core_s += sum(v for k, v in meter.cores.items() if k.startswith("client")) * meter.wall_s
    setup.machine_core_s += meter.machine_cores * meter.wall_s
    setup.others_core_s += meter.others_cores * meter.wall_s


def table(setups: list[Setup], *, clients: int, outstanding: int) -> str:
    base, scaled = setups
    lines = ["| setup | serving nodes | reads/s (total) | windows (reads/s) | per serving node (reads/s) "
             "| p50 / p99 ms | server CPU (cores) | server CPU per read (us) | client CPU (cores) | machine busy (cores) "
             "| others (cores) | projected reads/s, a core per node | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in setups:
        per_node = ", ".join(f"{n}: {s.per_node[n] / s.wall_s:,.0f}" for n in s.serving)
        lat = (f"{1000 * stats.percentile(s.latencies, 50):.1f} / {1000 * stats.percentile(s.latencies, 99):.1f}"
               if s.latencies else "-")
        errors = sum(s.errors.values()) + s.bad_reads
        lines.append(f"| {s.label} | {len(s.serving)} | {s.rate:,.0f} | {', '.join(f'{w:,.0f}' for w in s.windows)} "
                     f"| {per_node} | {lat} | {s.cores(s.server_core_s):.2f} | {s.server_us_per_read:.0f} "
                     f"| {s.cores(s.client_core_s):.2f} | {s.cores(s.machine_core_s):.2f} of {os.cpu_count()} "
                     f"| {s.cores(s.others_core_s):.2f} | {s.projected:,.0f} | {errors} |")
    lines.append("")
    lines.append(f"Ratio, 3 voters + 2 observers to 3 voters: **{scaled.rate / base.rate:.2f}x** "
                 f"({clients} kazoo client processes x {outstanding} gets in flight, 100 B values, "
                 f"{len(base.windows)} windows of {base.wall_s / max(1, len(base.windows)):g} s per setup, alternating). "
                 f"Projected (each node's reads per core-second it used, summed): "
                 f"{scaled.projected / base.projected:.2f}x.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.observers", description=__doc__.split("\n\n")[1])
    p.add_argument("--window-s", type=float, default=8.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3, help="windows per setup, the setups alternating")
    p.add_argument("--clients", type=int, default=10, help="kazoo client processes per window")
    p.add_argument("--outstanding", type=int, default=32, help="gets in flight per client process")
    p.add_argument("--workdir", default=None, help="parent of the temporary folder (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the folder (node and client logs)")
    args = p.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    folder = Path(tempfile.mkdtemp(prefix="quire-observers-", dir=args.workdir))
    print(f"bench.observers: working in {folder}", file=sys.stderr)
    setups = [Setup("3 voters", QuireCluster(folder / "voters", log_level="warning", bookies=False)),
              Setup("3 voters + 2 observers",
                    QuireCluster(folder / "observers", log_level="warning", bookies=False, observers=2))]
    try:
        for s in setups:
            start(s)
        for r in range(args.rounds):
            for s in setups:
                window(s, folder / "clients" / f"{s.label.replace(' ', '-')}-{r + 1}", clients=args.clients,
                       outstanding=args.outstanding, window_s=args.window_s, warmup_s=args.warmup_s)
                print(f"  round {r + 1}, {s.label}: {s.windows[-1]:,.0f} reads/s", file=sys.stderr)
        print(table(setups, clients=args.clients, outstanding=args.outstanding))
    finally:
        for s in setups:
            s.cluster.stop()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
