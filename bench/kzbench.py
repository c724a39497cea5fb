"""The metastore benchmark: one kazoo workload against Apache ZooKeeper and against Quire's metastore.

Both systems run at once for the whole section, each as 3 nodes on loopback:
a ZooKeeper 3.8 ensemble from Debian's jars (bench/zk.py) and a clusterd
cluster (bench/quire.py), whose client ports speak ZooKeeper's protocol. Every load row
runs on ZooKeeper and then at once on Quire, so that both see about the same
machine (it is shared: the "others" column says how much CPU other jobs took).

A row is P client processes (bench/kzworker.py, kazoo unchanged) x N
outstanding requests each, warmed up, then timed over one common window. Over
that window the benchmark reads utime+stime of every server and client process
from /proc, so each row says how much server CPU one operation cost and who
used the cores (the bottleneck). The leader is found with the `srvr`
four-letter word on both systems.

Rows: synchronous writes (1 process, 1 outstanding, on the leader);
pipelined writes with 1, 16 and 128 outstanding per process, 100 B and 1 KB
values, processes spread over the three servers; reads (get); CAS increments
of one counter from 4 processes (get + set with the version, retried on
BadVersion). The synchronous and CAS rows run LATENCY_ROUNDS windows per
system, the two systems alternating, pooled into one row (`pool`). Over each window the leader's scheduler statistics (on a CPU,
or runnable and waiting for one) and, where `perf` works, every server's
system calls and context switches are counted too. Then py-spy samples the
Quire leader (and one follower) under the saturating write load, and writes
resume after SIGKILL of the leader is timed on both (`failover_once`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench import machine, profile, stats, zk
from bench.machine import CpuMeter, PerfCounter
from bench.quire import QuireCluster, TlsFiles

REPO = Path(__file__).resolve().parent.parent
KEYS = 64
READY_TIMEOUT_S = 90.0
RESULT_GRACE_S = 40.0
GO_DELAY_S = 0.3  # between "go" and the window's start: every worker has read its line
SERVING_TIMEOUT_S = 120.0
PERF_ATTACH_S = 0.3  # perf stat starts before the window, while the servers are idle
JIT_WARMUP_S = 6.0  # one untimed saturating row per system before the first timed one


# -- the two systems, behind one interface ------------------------------------------------------


class ZkSystem:
    name = "ZooKeeper"

    def __init__(self, folder: Path, *, tls: TlsFiles | None = None, server_tls: zk.ZkTls | None = None,
                 netty: bool = False) -> None:
        """Plain by default; with `server_tls` (and the clients' `tls`) the ensemble serves only TLS."""
        self.tls = tls
        self.ensemble = zk.ZkEnsemble(folder, tls=server_tls, netty=netty,
                                      context=tls.context() if tls is not None else None)
        self.ids = list(self.ensemble.ids)
        self.ports = dict(self.ensemble.client_ports)

    def start(self, node: int | None = None) -> None:
        self.ensemble.start(node)

    def stop(self) -> None:
        self.ensemble.stop()

    def kill(self, node: int) -> None:
        self.ensemble.kill(node)

    def pids(self) -> dict[str, int]:
        return self.ensemble.pids()

    def label(self, node: int) -> str:
        return f"zk{node}"

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> int:
        return self.ensemble.wait_serving(timeout_s=timeout_s)


class QuireSystem:
    name = "Quire"

    def __init__(self, folder: Path, *, tls: bool = False) -> None:
        """tls: a [tls] table (every port TLS, material from `clusterctl tls init`), clients with a certificate."""
        self.cluster = QuireCluster(folder, tls=tls)
        self.tls = self.cluster.client_tls
        self.ids = sorted(self.cluster.nodes)
        self.ports = {i: self.cluster.nodes[i].client_port for i in self.ids}

    def start(self, node: int | None = None) -> None:
        self.cluster.start(node)

    def stop(self) -> None:
        self.cluster.stop()

    def kill(self, node: int) -> None:
        self.cluster.kill(node)

    def pids(self) -> dict[str, int]:
        return self.cluster.pids()

    def label(self, node: int) -> str:
        return f"node{node}"

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> int:
        """Every node in broadcast under one leader (admin /status), and `srvr` agreeing; the leader's id."""
        trio.run(lambda: self.cluster.wait_all_broadcast(timeout_s=timeout_s))
        return _wait_srvr(self, timeout_s)


System = ZkSystem | QuireSystem


def _wait_srvr(system: System, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        modes = srvr_modes(system)
        values = list(modes.values())
        if values.count("leader") == 1 and values.count("follower") == len(values) - 1:
            return next(i for i, m in modes.items() if m == "leader")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{system.name}: not serving after {timeout_s:g} s, srvr modes {modes}")
        time.sleep(0.05)


def srvr_modes(system: System) -> dict[int, str | None]:
    context = system.tls.context() if system.tls is not None else None
    return {i: zk.mode(port, timeout_s=0.5, context=context) for i, port in system.ports.items()}


def kazoo_options(system: System) -> dict[str, object]:
    """KazooClient's TLS arguments for `system` (none for a plain one)."""
    return system.tls.kazoo_options() if system.tls is not None else {}


def hosts(system: System, node: int | None = None) -> str:
    return ",".join(f"127.0.0.1:{system.ports[i]}" for i in ([node] if node is not None else system.ids))


# -- loads -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    key: str  # stable id, e.g. "write-100-16"
    title: str
    op: str  # write | read | cas
    processes: int
    outstanding: int
    value_bytes: int = 100
    on_leader: bool = False  # every process on the leader; otherwise process i on server i % 3
    # Windows per system, ZooKeeper and Quire alternating, pooled into one row: the latency-bound rows
    # (one synchronous client, contended CAS) move by up to 2x between neighbouring single windows here.
    rounds: int = 1


LATENCY_ROUNDS = 3


def loads() -> list[Load]:
    rows = [Load("sync-100", "sync write 100 B (1 x 1, on the leader)", "write", 1, 1, 100, on_leader=True,
                 rounds=LATENCY_ROUNDS),
            Load("sync-1024", "sync write 1 KB (1 x 1, on the leader)", "write", 1, 1, 1024, on_leader=True,
                 rounds=LATENCY_ROUNDS)]
    for size in (100, 1024):
        for n in (1, 16, 128):
            rows.append(Load(f"write-{size}-{n}", f"writes {_size(size)}, 4 x {n} outstanding", "write", 4, n, size))
    rows.append(Load("read-100", "reads 100 B, 4 x 128 outstanding", "read", 4, 128, 100))
    rows.append(Load("cas", "CAS increments, 4 clients on one counter", "cas", 4, 1, 0, rounds=LATENCY_ROUNDS))
    return rows


SATURATING = "write-100-128"


def _size(n: int) -> str:
    return f"{n // 1024} KB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


@dataclass
class LoadResult:
    system: str
    load: Load
    window_s: float
    ok: int
    latencies: list[float]
    errors: Counter[str]
    error_samples: list[str]
    retries: int
    cpu: CpuMeter
    servers: list[str]
    leader: str
    bad_reads: int = 0
    total_ok: int = 0  # acknowledged in the warm-up and the window (and after it): the CAS counter check
    # The leader over the window, as shares of it (schedstat): on a CPU, runnable but waiting for one.
    # Quire: its event-loop thread (the pid's main thread); ZooKeeper: all its threads summed.
    leader_run: float | None = None
    leader_wait: float | None = None
    # perf stat over the window, per server: {"syscalls": n, "context_switches": n}, None where not counted.
    perf: dict[str, dict[str, int] | None] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ok / self.window_s if self.window_s else float("nan")

    def latency_ms(self, q: float) -> float:
        return 1000 * stats.percentile(self.latencies, q)

    def cores(self, names: list[str] | None = None, *, clients: bool = False) -> float:
        if clients:
            return sum(v for k, v in self.cpu.cores.items() if k.startswith("client"))
        return sum(self.cpu.cores.get(n, 0.0) for n in (names if names is not None else self.servers))

    @property
    def server_cpu_us_per_op(self) -> float | None:
        return 1e6 * self.cores() * self.cpu.wall_s / self.ok if self.ok else None

    @property
    def client_cpu_us_per_op(self) -> float | None:
        return 1e6 * self.cores(clients=True) * self.cpu.wall_s / self.ok if self.ok else None

    def per_op(self, what: str, names: list[str] | None = None) -> float | None:
        """System calls ("syscalls") or context switches ("context_switches") per operation, of the named
        servers (default: all three) over the window; None if perf did not count one of them."""
        counts = [self.perf.get(n) for n in (names if names is not None else self.servers)]
        if not self.ok or not counts or any(c is None for c in counts):
            return None
        return sum(c[what] for c in counts) / self.ok  # type: ignore[index]

    @property
    def leader_cores(self) -> float:
        return self.cpu.cores.get(self.leader, 0.0)

    def bottleneck(self) -> str:
        """Who held the cores, and whether the leader was starved: a short verdict from the window's CPU."""
        total = os.cpu_count() or 1
        busy = self.cpu.machine_cores
        servers, clients, others = self.cores(), self.cores(clients=True), self.cpu.others_cores
        shares = f"servers {servers:.2f}, clients {clients:.2f}, others {others:.2f} cores"
        if busy >= 0.85 * total:
            side = "servers" if servers >= 2 * clients else "clients" if clients >= servers else "servers and clients"
            verdict = f"CPU-bound, machine saturated ({busy:.2f}/{total}); {shares}: mostly {side}"
        else:
            verdict = f"not CPU-bound ({busy:.2f}/{total} cores busy; {shares}): latency, i.e. round trips and fsyncs"
        if self.leader_run is not None and self.leader_wait is not None:
            what = "event-loop thread" if self.system == "Quire" else "threads (sum)"
            verdict += (f"; leader {what} on a CPU {100 * self.leader_run:.0f}%, runnable but waiting for one "
                        f"{100 * self.leader_wait:.0f}% of the window")
        return verdict


@dataclass
class FailoverSample:
    killed: str
    new_leader: str
    resume_s: float | None  # SIGKILL -> first acknowledged write on either survivor
    both_s: float | None  # SIGKILL -> both survivors' clients acknowledged a write
    last_before_s: float | None  # last acknowledgement before the SIGKILL, before it
    errors: Counter[str] = field(default_factory=Counter)
    note: str = ""


@dataclass
class Results:
    rows: list[LoadResult] = field(default_factory=list)
    failovers: dict[str, list[FailoverSample]] = field(default_factory=dict)
    profile: profile.Run | None = None
    counter_checks: list[str] = field(default_factory=list)  # CAS: final value vs acknowledged increments
    failures: list[str] = field(default_factory=list)
    window_s: float = 0.0
    warmup_s: float = 0.0
    failover_runs: int = 0
    profile_s: float = 0.0

    def row(self, system: str, key: str) -> LoadResult | None:
        return next((r for r in self.rows if r.system == system and r.load.key == key), None)


# -- running one load --------------------------------------------------------------------------


class _Worker:
    def __init__(self, name: str, spec: dict, log: Path, *, module: str = "bench.kzworker") -> None:
        """`python -m <module> '<spec as JSON>'`: bench/kzworker.py by default (bench/tree_loader.py too)."""
        self.name = name
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.stderr = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", module, json.dumps(spec)], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
        self.lines.put("")

    def line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer in time; see {self.log}") from None
        if not line:
            self.proc.wait(timeout=5)
            tail = self.log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}:\n{tail}")
        return line

    def send(self, text: str) -> None:
        self.proc.stdin.write(text)  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def run_load(system: System, load: Load, folder: Path, *, window_s: float, warmup_s: float,
             before_window: Callable[[int], None] | None = None,
             after_window: Callable[[], None] | None = None, tls_pending_fix: bool = False) -> LoadResult:
    """P worker processes, warmed up, then one common timed window; CPU of every process over it.
    tls_pending_fix: the workers' kazoo also wakes for replies already decrypted (kzworker.pending_aware_handler)."""
    folder.mkdir(parents=True, exist_ok=True)
    leader = _wait_srvr(system, 30.0)
    order = [leader] if load.on_leader else system.ids
    workers = []
    try:
        for w in range(load.processes):
            node = order[w % len(order)]
            spec = {"hosts": hosts(system, node), "op": load.op, "outstanding": load.outstanding,
                    "value_bytes": load.value_bytes, "keys": KEYS, "warmup_s": warmup_s,
                    "kazoo": kazoo_options(system), "tls_pending_fix": tls_pending_fix}
            workers.append(_Worker(f"{system.name} {load.key} client{w + 1}", spec, folder / f"client{w + 1}.log"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        warm = [json.loads(w.line(deadline).split(" ", 1)[1]) for w in workers]
        if before_window is not None:
            before_window(leader)
        pids = {**system.pids(), **{f"client{i + 1}": w.proc.pid for i, w in enumerate(workers)}}
        t0 = time.monotonic() + GO_DELAY_S + PERF_ATTACH_S
        t1 = t0 + window_s
        for w in workers:
            w.send(f"go {t0!r} {t1!r}\n")
        leader_pid = system.pids()[system.label(leader)]
        main_only = system.name == "Quire"
        perf = PerfCounter(system.pids(), folder).start()  # the servers are idle until the window starts
        time.sleep(max(0.0, t0 - time.monotonic()))
        meter = CpuMeter(pids).start()
        sched0 = machine.sched_seconds(leader_pid, main_thread_only=main_only)
        time.sleep(max(0.0, t1 - time.monotonic()))
        sched1 = machine.sched_seconds(leader_pid, main_thread_only=main_only)
        meter.stop()
        perf_counts = perf.stop()
        if after_window is not None:
            after_window()
        deadline = time.monotonic() + RESULT_GRACE_S
        done = [json.loads(w.line(deadline)) for w in workers]
    finally:
        for w in workers:
            w.close()
    result = LoadResult(system.name, load, window_s, sum(d["ok"] for d in done),
                        [x for d in done for x in d["latencies"]],
                        sum((Counter(d["errors"]) for d in done), Counter()),
                        [s for d in done for s in d["error_samples"]][:5], sum(d["retries"] for d in done),
                        meter, list(system.pids()), system.label(leader),
                        bad_reads=sum(d["bad_reads"] for d in done),
                        total_ok=sum(d["total_ok"] for d in done) + sum(d["total_ok"] for d in warm))
    result.perf = perf_counts
    if sched0 and sched1:
        result.leader_run = (sched1[0] - sched0[0]) / meter.wall_s
        result.leader_wait = (sched1[1] - sched0[1]) / meter.wall_s
    return result


def pool(parts: list[LoadResult]) -> LoadResult:
    """Several windows of one row on one system as one: operations, latencies, errors and windows add
    up; CPU shares, perf counts and the leader's scheduling are weighted by each window's length."""
    first = parts[0]
    if len(parts) == 1:
        return first
    wall_s = sum(p.cpu.wall_s for p in parts)
    wall = wall_s or 1e-9

    def weighted(value: Callable[[LoadResult], float | None]) -> float | None:
        values = [(value(p), p.cpu.wall_s) for p in parts]
        if any(v is None for v, _ in values):
            return None
        return sum(v * w for v, w in values) / wall  # type: ignore[operator]

    cpu = CpuMeter(dict(first.cpu.pids))
    cpu.wall_s = wall_s
    names = sorted({n for p in parts for n in p.cpu.cores})
    cpu.cores = {n: sum(p.cpu.cores.get(n, 0.0) * p.cpu.wall_s for p in parts) / wall for n in names}
    cpu.machine_cores = sum(p.cpu.machine_cores * p.cpu.wall_s for p in parts) / wall
    perf: dict[str, dict[str, int] | None] = {}
    for name in first.perf:
        counts = [p.perf.get(name) for p in parts]
        perf[name] = (None if any(c is None for c in counts)
                      else {k: sum(c[k] for c in counts) for k in counts[0]})  # type: ignore[index,union-attr]
    pooled = LoadResult(first.system, first.load, sum(p.window_s for p in parts), sum(p.ok for p in parts),
                        [x for p in parts for x in p.latencies], sum((p.errors for p in parts), Counter()),
                        [e for p in parts for e in p.error_samples][:5], sum(p.retries for p in parts), cpu,
                        first.servers, first.leader, bad_reads=sum(p.bad_reads for p in parts),
                        total_ok=sum(p.total_ok for p in parts))
    pooled.perf = perf
    pooled.leader_run = weighted(lambda p: p.leader_run)
    pooled.leader_wait = weighted(lambda p: p.leader_wait)
    return pooled


# -- the section ------------------------------------------------------------------------------


class Bench:
    def __init__(self, folder: Path, *, window_s: float, warmup_s: float, failover_runs: int, profile_s: float,
                 progress: Callable[[str], None] = print, results: Results | None = None) -> None:
        self.folder = folder
        self.progress = progress
        self.results = results if results is not None else Results()
        self.results.window_s, self.results.warmup_s = window_s, warmup_s
        self.results.failover_runs, self.results.profile_s = failover_runs, profile_s
        self._rounds: dict[tuple[str, str], list[LoadResult]] = {}  # (system, row) -> its rounds so far

    def run(self, section: Callable[[str, Callable[[], object]], object]) -> Results:
        """Start both systems, run every row on each, then failover and the profile; `section` runs a
        named step and records its failure without stopping the rest."""
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # this process's failover clients reconnect noisily
        zk_sys, quire = ZkSystem(self.folder / "zk"), QuireSystem(self.folder / "quire")
        systems: list[System] = [zk_sys, quire]
        try:
            for s in systems:
                s.start()
            for s in systems:
                section(f"kazoo start and warm-up ({s.name})", lambda s=s: self._warm(s))
            for load in loads():
                for rnd in range(load.rounds):
                    tag = f", round {rnd + 1} of {load.rounds}" if load.rounds > 1 else ""
                    for s in systems:
                        section(f"kazoo {load.key} ({s.name}{tag})", lambda s=s, load=load: self._row(s, load))
                self._pool_rounds()
            section("kazoo profile (Quire leader)", lambda: self._profile(quire))
            for s in systems:
                section(f"kazoo failover ({s.name})", lambda s=s: self._failover(s))
        finally:
            for s in systems:
                s.stop()
        return self.results

    def _warm(self, system: System) -> None:
        """Create the znodes, then one untimed saturating row: the JVM's JIT, connections, page cache."""
        system.wait_serving()
        _setup(system)
        load = next(x for x in loads() if x.key == SATURATING)
        row = run_load(system, load, self.folder / system.name.lower() / "clients" / "warm-up",
                       window_s=JIT_WARMUP_S, warmup_s=self.results.warmup_s)
        self.progress(f"  {system.name} warm-up: {row.rate:,.0f} writes/s")

    def _row(self, system: System, load: Load) -> None:
        r = self.results
        before: list[int] = []
        if load.op == "read":
            _set_all(system, b"v" * load.value_bytes)
        if load.op == "cas":
            before.append(_counter(system))
        row = run_load(system, load, self.folder / system.name.lower() / "clients" / load.key,
                       window_s=r.window_s, warmup_s=r.warmup_s)
        if load.op == "cas":
            after = _counter(system)
            acked = row.total_ok
            verdict = "equal" if after - before[0] == acked else "DIFFERENT"
            r.counter_checks.append(f"{system.name}: counter went from {before[0]} to {after} (+{after - before[0]}) "
                                    f"for {acked} acknowledged increments (warm-up included): {verdict}")
        if load.rounds > 1:
            self._rounds.setdefault((system.name, load.key), []).append(row)
        else:
            r.rows.append(row)
        self._report_row(row)

    def _report_row(self, row: LoadResult, pooled: str = "") -> None:
        lat = f", p50 {row.latency_ms(50):.2f} ms, p99 {row.latency_ms(99):.2f} ms" if row.latencies else ""
        errors = sum(row.errors.values())
        self.progress(f"  {row.system:9} {row.load.key:14}{pooled} {row.rate:8,.0f}/s{lat}, server CPU "
                      f"{row.server_cpu_us_per_op or 0:,.0f} us/op, {errors} errors; {row.bottleneck()}")

    def _pool_rounds(self) -> None:
        """One row per system out of the rounds that ran (a failed round leaves the others)."""
        for (_, _), parts in sorted(self._rounds.items()):
            row = pool(parts)
            self.results.rows.append(row)
            self._report_row(row, f" ({len(parts)} rounds pooled)")
        self._rounds.clear()

    def _profile(self, quire: QuireSystem) -> None:
        """py-spy on the leader (both modes) and on one follower that serves clients (GIL holder only)."""
        load = next(x for x in loads() if x.key == SATURATING)
        folder = self.folder / "quire" / "profile"
        binary = profile.py_spy()
        state: dict = {}

        def start(leader: int) -> None:
            follower = next(i for i in quire.ids if i != leader)
            state.update(leader=leader, follower=follower,
                         pids={"leader": quire.cluster.pid(leader), "follower": quire.cluster.pid(follower)})
            state["spies"] = {"leader": profile.start_spies(binary, state["pids"]["leader"], folder),
                              "follower": profile.start_spies(binary, state["pids"]["follower"], folder,
                                                              modes=("gil",), prefix="follower")}
            time.sleep(0.5)  # py-spy attaches before the window starts
            state["cpu0"] = {k: (time.monotonic(), *profile.user_system(pid)) for k, pid in state["pids"].items()}

        def stop() -> None:
            state["cpu1"] = {k: (time.monotonic(), *profile.user_system(pid)) for k, pid in state["pids"].items()}
            state["leader_profiles"], state["logs"] = profile.stop_spies(
                state["spies"]["leader"], folder, f"node{state['leader']}")
            state["follower_profiles"], logs = profile.stop_spies(
                state["spies"]["follower"], folder, f"node{state['follower']}", prefix="follower")
            state["logs"] += logs

        def cpu(key: str) -> profile.LeaderCpu:
            (t0, u0, s0), (t1, u1, s1) = state["cpu0"][key], state["cpu1"][key]
            return profile.LeaderCpu(t1 - t0, u1 - u0, s1 - s0)

        row = run_load(quire, load, self.folder / "quire" / "clients" / "profile", window_s=self.results.profile_s,
                       warmup_s=self.results.warmup_s, before_window=start, after_window=stop)
        self.results.profile = profile.Run(state["leader_profiles"], cpu("leader"), row.rate, state["logs"],
                                           follower=state["follower_profiles"][0], follower_cpu=cpu("follower"))
        self.progress(f"  profiled node{state['leader']} (leader) and node{state['follower']} (follower): "
                      f"{row.rate:,.0f} writes/s with py-spy attached")

    def _failover(self, system: System) -> None:
        samples = self.results.failovers.setdefault(system.name, [])
        failed = 0
        for _ in range(self.results.failover_runs):
            try:
                samples.append(failover_once(system))
            except Exception as e:  # noqa: BLE001 - one bad run is a sample with a note; three end the section
                failed += 1
                samples.append(FailoverSample("?", "-", None, None, None, note=f"run failed: {e!r}"[:300]))
                if failed >= 3:
                    raise
        times = [s.resume_s for s in samples if s.resume_s is not None]
        if times:
            self.progress(f"  {system.name}: writes resumed after a leader SIGKILL in median "
                          f"{1000 * stats.median(times):.0f} ms (min {1000 * min(times):.0f}, max "
                          f"{1000 * max(times):.0f}) over {len(times)} runs")


# -- setup and checks through a kazoo client in this process ------------------------------------


def _client(system: System, node: int | None = None, **kwargs):  # noqa: ANN202 - a KazooClient
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts(system, node), timeout=10.0, **kazoo_options(system), **kwargs)
    client.start(timeout=30)
    return client


def _setup(system: System) -> None:
    client = _client(system)
    try:
        client.ensure_path("/bench")
        for i in range(KEYS):
            client.create(f"/bench/k{i}", b"v" * 100)
        client.create("/bench/counter", b"0")
    finally:
        client.stop()
        client.close()


def _set_all(system: System, value: bytes) -> None:
    client = _client(system)
    try:
        for result in [client.set_async(f"/bench/k{i}", value) for i in range(KEYS)]:
            result.get(timeout=30)
    finally:
        client.stop()
        client.close()


def _counter(system: System) -> int:
    client = _client(system)
    try:
        client.sync("/bench/counter")
        return int(client.get("/bench/counter")[0])
    finally:
        client.stop()
        client.close()


# -- failover: writes in flight, SIGKILL the leader, time until they are acknowledged again ------

PRE_KILL_ACKS = 20
RESUME_TIMEOUT_S = 30.0


class _Writer:
    """A kazoo client pinned to one server, setting one znode in a loop; acknowledgement times kept."""

    def __init__(self, system: System, node: int, path: str) -> None:
        retry = {"max_tries": -1, "delay": 0.01, "backoff": 1, "max_jitter": 0.0, "max_delay": 0.01}
        self.client = _client(system, node, connection_retry=retry)
        self.path = path
        self.acks: list[tuple[float, float]] = []  # (sent, acknowledged)
        self.errors: Counter[str] = Counter()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        i = 0
        while not self.stopping.is_set():
            issued = time.monotonic()
            try:
                self.client.set_async(self.path, str(i).encode()).get(timeout=5.0)
            except Exception as e:  # noqa: BLE001 - ConnectionLoss while the leader is gone, and so on
                self.errors[type(e).__name__] += 1
                time.sleep(0.002)
                continue
            self.acks.append((issued, time.monotonic()))
            i += 1

    def first_after(self, t: float) -> float | None:
        """The acknowledgement of the first write sent after `t` (one sent before may be acknowledged
        after a SIGKILL at `t`: it was committed by the old leader)."""
        return next((acked for issued, acked in self.acks if issued > t), None)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        self.client.stop()
        self.client.close()


def failover_once(system: System) -> FailoverSample:
    leader = system.wait_serving()
    survivors = [i for i in system.ids if i != leader]
    writers: list[_Writer] = []
    try:
        writers += [_Writer(system, i, f"/bench/k{i}") for i in survivors]
        deadline = time.monotonic() + 30.0
        while any(len(w.acks) < PRE_KILL_ACKS for w in writers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name}: writes not flowing before the kill")
            time.sleep(0.01)
        t_kill = time.monotonic()
        system.kill(leader)
        deadline = t_kill + RESUME_TIMEOUT_S
        while any(w.first_after(t_kill) is None for w in writers) and time.monotonic() < deadline:
            time.sleep(0.005)
        firsts = [w.first_after(t_kill) for w in writers]
        last_before = max(a for w in writers for _, a in w.acks if a <= t_kill)
        new = {i: m for i, m in srvr_modes(system).items() if m == "leader"}
    finally:
        for w in writers:
            w.stop()
        system.start(leader)  # a no-op if it was never killed
    got = [f for f in firsts if f is not None]
    sample = FailoverSample(system.label(leader), ",".join(system.label(i) for i in new) or "-",
                            min(got) - t_kill if got else None,
                            max(got) - t_kill if len(got) == len(firsts) else None, t_kill - last_before,
                            sum((w.errors for w in writers), Counter()))
    if not got:
        sample.note = f"no write acknowledged within {RESUME_TIMEOUT_S:g} s"
    return sample
