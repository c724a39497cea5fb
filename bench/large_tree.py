"""Large state (issue 19, "Measure", first bullet): a big znode tree on Quire and on ZooKeeper, in one run.

    python -m bench.large_tree [--znodes N] [--znode-bytes B] [--big-znodes N] [--big-bytes B] [--no-big]
    python -m bench.run --only large_tree      # the same, from the suite's entry point

For each tree (by default 1,000,000 znodes of 100 B under 1000 parents, then
1000 znodes of 1,000,000 B under 10 parents, 1 GB of data) and each system (a
3-node Quire cluster of voters from a copy of cluster.toml, bench/quire.py; a
3-server ZooKeeper 3.8 ensemble from Debian's jars, bench/zk.py, with a larger
heap), on fresh data directories, one after the other on the same machine:

1. load: the parents from this process, then the children by P kazoo processes
   (bench/tree_loader.py), each `create_async` under a bounded window, spread
   over the three servers; the load rate is znodes (and bytes) per second from
   "go" to the last acknowledgement; then until every server reports the same
   zxid and node count (`srvr`).
2. snapshot write time of the full tree on the leader, at the first periodic
   snapshot after the load (both systems at their shipped snapshot settings):
   - Quire snapshots every `snapshot_every_txns` delivered transactions (50,000),
     counted per node since its start. The benchmark computes how many more the
     leader needs from its last `event=snapshot` log line and its committed zxid,
     sends all but one as setData of one small znode, then the last one; timed:
     from just before that last write is sent to the timestamp of the leader's
     `event=snapshot` line (freeze on the event loop, encoding in 1 MiB pieces,
     writing, fsync, rename, purge of old files).
   - ZooKeeper snapshots after snapCount/2 + a random roll (of snapCount/2)
     transactions (snapCount 100,000), in a background thread. The benchmark
     sends setData in bursts until the leader logs `Snapshotting: 0x<zxid>` for a
     zxid past the load; timed: ZooKeeper's own `Snapshot taken in N ms` for it
     (serialization and writes, no fsync: ZooKeeper's periodic snapshots are
     not synced).
3. wiped follower (before the restart, so that its figure does not depend on the
   restart succeeding): SIGTERM one follower, delete its data directory
   (ZooKeeper: all but `myid`; Quire: all but its log file), start it, time until
   its `srvr` zxid and node count equal the leader's (Quire: and /status says it
   follows in phase broadcast): a SNAP of the whole tree, Quire's streamed in chunks.
4. restart to serving: SIGTERM every server (the stop time is reported), start
   them all, and time from the start until a kazoo client connected to each
   server alone reads the last znode of the tree (a read of the whole tree's
   last write proves the server loaded it); "first" is the first server to
   answer, "all" the last; a server that has not served after SERVING_TIMEOUT_S
   fails the step (the report then lists every server's elections). From the
   logs: Quire's `event=recovered` (snapshot and log loaded), ZooKeeper's
   `Snapshot loaded in`, `txns loaded in` and the leader's `Snapshot taken in`
   (ZooKeeper's leader snapshots its whole tree before it serves, in loadData).
5. memory: every server process's peak RSS in each step, read from
   /proc/<pid>/status VmHWM, reset at the start of each step (`clear_refs` 5,
   root) and sampled every 0.2 s so that a process that stops in a step counts.
   The tree's size in memory is the smallest RSS growth over the load among the
   servers (VmRSS after the load minus VmRSS just before it: one copy of the
   tree, as a follower holds it), shown beside the raw bytes (data + paths) and
   the snapshot file.

Every server listens on 127.0.0.1 only; every process this module starts is
stopped in a `finally`, and its temp folder is removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench import ledger, machine, processes, zk
from bench.kzbench import _Worker
from bench.quire import QuireCluster
from bench.steps import recorded_step
from bench.tree_loader import child_path

REPO = Path(__file__).resolve().parent.parent
ROOT = "/lt"
MARK = f"{ROOT}-mark"  # the small znode the snapshot triggers write to
MARK_VALUE = b"m" * 10
ZK_HEAP = "4g"
SAMPLE_S = 0.2
SETTLE_TIMEOUT_S = 600.0
SNAPSHOT_TIMEOUT_S = 600.0
SERVING_TIMEOUT_S = 180.0
RESYNC_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
ZK_BURST = 1000  # setData per burst while waiting for ZooKeeper's next periodic snapshot
ZK_MAX_TRIGGER_WRITES = 150_000  # more than snapCount (100,000): a snapshot must have come by then
PHASES = ("load", "snapshot", "resync", "restart")


@dataclass(frozen=True)
class Tree:
    key: str
    parents: int
    children: int  # per parent
    value_bytes: int
    processes: int  # loader processes
    window: int  # create_async in flight per loader process

    @property
    def znodes(self) -> int:
        return self.parents * self.children

    @property
    def data_bytes(self) -> int:
        return self.znodes * self.value_bytes

    def parent(self, i: int) -> str:
        return f"{ROOT}/p{i:04d}"

    @property
    def last_path(self) -> str:
        return child_path(self.parent(self.parents - 1), self.children - 1)

    @property
    def raw_bytes(self) -> int:
        """Data and path bytes of the children: what the tree holds, before any per-znode overhead."""
        return self.znodes * (self.value_bytes + len(self.last_path))

    @property
    def title(self) -> str:
        return f"{self.znodes:,} znodes of {_size(self.value_bytes)} ({self.parents:,} x {self.children:,})"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / (1 << 20):,.0f} MiB"


# -- what one system did on one tree -------------------------------------------------------------


@dataclass
class Figures:
    system: str
    tree: Tree
    leader: str = ""
    load_s: float | None = None
    load_errors: dict[str, int] = field(default_factory=dict)
    load_error_samples: list[str] = field(default_factory=list)
    settle_s: float | None = None
    node_count: int | None = None  # per srvr after the load (the whole tree, system znodes included)
    rss_before: dict[str, int] = field(default_factory=dict)  # VmRSS just before the load
    rss_loaded: dict[str, int] = field(default_factory=dict)  # VmRSS once the load settled
    snapshot_s: float | None = None
    snapshot_note: str = ""
    snapshot_file_bytes: int | None = None
    trigger_writes: int = 0
    floor_write_s: float | None = None  # the snapshot file's bytes written to a new file, no fsync
    floor_fsync_s: float | None = None  # ... and fsynced
    stop_s: dict[str, float] = field(default_factory=dict)
    stop_killed: list[str] = field(default_factory=list)
    first_read_s: float | None = None
    all_read_s: float | None = None
    read_s: dict[str, float] = field(default_factory=dict)
    restart_log: list[str] = field(default_factory=list)  # what the logs say about loading
    resync_node: str = ""
    resync_s: float | None = None
    resync_log: list[str] = field(default_factory=list)
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> server -> peak RSS (bytes)
    loadavg: dict[str, float] = field(default_factory=dict)  # phase -> 1-minute load average at its start
    failures: list[str] = field(default_factory=list)

    @property
    def load_rate(self) -> float | None:
        return self.tree.znodes / self.load_s if self.load_s else None

    def growth(self, server: str) -> int | None:
        before, after = self.rss_before.get(server), self.rss_loaded.get(server)
        return after - before if before is not None and after is not None else None

    @property
    def tree_rss(self) -> int | None:
        """The tree's size in a server's memory: the smallest RSS growth over the load among the servers
        (a follower's: one copy of the tree; a Quire leader also holds its prepared view of the tree)."""
        values = [g for s in self.rss_before if (g := self.growth(s)) is not None]
        return min(values) if values else None

    def peak(self, server: str) -> int | None:
        values = [p[server] for p in self.peaks.values() if server in p]
        return max(values) if values else None

    @property
    def servers(self) -> list[str]:
        return sorted({s for p in self.peaks.values() for s in p} | set(self.rss_before))


@dataclass
class Results:
    trees: list[Tree]
    facts: dict[str, str]
    command: str
    zk_version: str = ""
    zk_heap: str = ZK_HEAP
    figures: list[Figures] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    clear_refs: bool = True  # VmHWM could be reset per step
    busy_at_start: float = 0.0  # share of all CPUs busy in the second before the part (a shared machine)
    duration_s: float = 0.0

    def get(self, system: str, tree: Tree) -> Figures | None:
        return next((f for f in self.figures if f.system == system and f.tree == tree), None)


# -- peak RSS ----------------------------------------------------------------------------------------


def _status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def rss(pid: int) -> int | None:
    return _status_kb(pid, "VmRSS")


class PeakSampler:
    """Every 0.2 s, each server's VmHWM (reset at each phase's start where the kernel lets us) or
    else VmRSS, kept as the peak of that server in the current phase."""

    def __init__(self, pids: Callable[[], dict[str, int]]) -> None:
        self.pids = pids
        self.phase: str | None = None
        self.peaks: dict[str, dict[str, int]] = {}
        self.clear_refs = True
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def begin(self, phase: str) -> None:
        for pid in self.pids().values():
            self._reset(pid)
        with self._lock:
            self.phase = phase
            self.peaks.setdefault(phase, {})

    def reset(self, pid: int) -> None:
        """A process started in this phase: nothing to reset, but keep the bookkeeping uniform."""
        self._reset(pid)

    def _reset(self, pid: int) -> None:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            self.clear_refs = False

    def sample(self) -> None:
        key = "VmHWM" if self.clear_refs else "VmRSS"
        with self._lock:
            if self.phase is None:
                return
            peaks = self.peaks[self.phase]
            for name, pid in self.pids().items():
                value = _status_kb(pid, key)
                if value is not None and value > peaks.get(name, 0):
                    peaks[name] = value

    def end(self) -> None:
        self.sample()
        with self._lock:
            self.phase = None

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()


# -- the two systems behind one interface -----------------------------------------------------------


def srvr(port: int) -> dict[str, str]:
    """`srvr` as key -> value ("Zxid", "Mode", "Node count", ...); empty while the server does not serve."""
    answer = zk.four_letter_word(port, "srvr", timeout_s=2.0) or ""
    return dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in answer.splitlines() if ":" in line))


def srvr_state(port: int) -> tuple[int, int, str] | None:
    """(zxid, node count, mode) per `srvr`, or None while not serving."""
    s = srvr(port)
    try:
        return int(s["Zxid"], 16), int(s["Node count"]), s.get("Mode", "")
    except (KeyError, ValueError):
        return None


class System:
    name = ""
    ids: list[int]

    def port(self, i: int) -> int: ...
    def start(self, i: int | None = None) -> None: ...
    def pids(self) -> dict[str, int]: ...

    def proc(self, i: int) -> subprocess.Popen[bytes]:
        return self._procs()[i]

    def label(self, i: int) -> str: ...
    def log_path(self, i: int) -> Path: ...
    def wipe(self, i: int) -> None: ...
    def wait_serving(self) -> int: ...

    def hosts(self, i: int | None = None) -> str:
        return ",".join(f"127.0.0.1:{self.port(j)}" for j in ([i] if i is not None else self.ids))

    def crashed(self) -> dict[int, int]:
        return {i: p.returncode for i in self.ids if (p := self._procs().get(i)) is not None
                and p.returncode is not None and p.returncode not in (0, -15, 143)}

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]: ...

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> tuple[dict[str, float], list[str]]:
        """SIGTERM every server, wait; returns how long each took to exit and those that needed SIGKILL."""
        procs = {self.label(i): p for i, p in self._procs().items() if p.poll() is None}
        t0 = time.monotonic()
        for p in procs.values():
            p.terminate()
        took, killed = {}, []
        for name, p in procs.items():
            try:
                p.wait(timeout=max(0.1, t0 + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed.append(name)
            took[name] = time.monotonic() - t0
        return took, killed

    def stop_one(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
        p = self._procs()[i]
        p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            processes.kill(p)

    def close(self) -> None:
        processes.stop_all(self._procs().values(), 15.0)


class QuireSystem(System):
    name = "Quire"

    def __init__(self, folder: Path) -> None:
        self.cluster = QuireCluster(folder, bookies=False)  # voters only: the metastore and Zab, no bookie
        self.ids = sorted(self.cluster.nodes)

    def port(self, i: int) -> int:
        return self.cluster.nodes[i].client_port

    def start(self, i: int | None = None) -> None:
        self.cluster.start(i)

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]:
        return self.cluster.procs

    def pids(self) -> dict[str, int]:
        return self.cluster.pids()

    def label(self, i: int) -> str:
        return f"node{i}"

    def log_path(self, i: int) -> Path:
        return self.cluster.log_path(i)

    def wait_serving(self) -> int:
        return trio.run(lambda: _quire_leader(self.cluster))

    def wipe(self, i: int) -> None:
        data = self.cluster.nodes[i].data_dir
        for entry in data.iterdir():
            if entry == self.log_path(i):
                continue
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    @property
    def snapshot_every(self) -> int:
        return self.cluster.config.snapshot_every_txns

    def status(self, i: int) -> dict[str, Any] | None:
        return trio.run(lambda: self.cluster.status(i, timeout_s=5.0))

    def snapshot_dir(self, i: int) -> Path:
        return self.cluster.nodes[i].data_dir / "snapshots"


async def _quire_leader(cluster: QuireCluster) -> int:
    statuses = await cluster.wait_all_broadcast(timeout_s=SERVING_TIMEOUT_S)
    return next(nid for nid, s in statuses.items() if s and s["role"] == "leader")


class ZkSystem(System):
    name = "ZooKeeper"

    def __init__(self, folder: Path, heap: str) -> None:
        options = tuple(o for o in zk.JVM_OPTIONS if not o.startswith("-Xmx")) + (f"-Xmx{heap}",)
        self.ensemble = zk.ZkEnsemble(folder, jvm_options=options)
        self.ids = list(self.ensemble.ids)

    def port(self, i: int) -> int:
        return self.ensemble.client_ports[i]

    def start(self, i: int | None = None) -> None:
        self.ensemble.start(i)

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]:
        return self.ensemble.procs

    def pids(self) -> dict[str, int]:
        return self.ensemble.pids()

    def label(self, i: int) -> str:
        return f"zk{i}"

    def log_path(self, i: int) -> Path:
        return self.ensemble.log_path(i)

    def wait_serving(self) -> int:
        return self.ensemble.wait_serving(timeout_s=SERVING_TIMEOUT_S)

    def wipe(self, i: int) -> None:
        data = self.ensemble.data_dir(i)
        for entry in data.iterdir():
            if entry.name == "myid":
                continue
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


# -- logs --------------------------------------------------------------------------------------------


class LogTail:
    """The lines a server's log gained since a point (the log files are appended across restarts)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace").splitlines()


_QUIRE_TS = re.compile(r"^ts=(\S+)Z ")
_ZK_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def quire_ts(line: str) -> float | None:
    m = _QUIRE_TS.match(line)
    if not m:
        return None
    return datetime.datetime.fromisoformat(m[1]).replace(tzinfo=datetime.timezone.utc).timestamp()


def zk_ts(line: str) -> float | None:
    """log4j's ISO8601 pattern is in local time."""
    m = _ZK_TS.match(line)
    return datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


# -- the steps -----------------------------------------------------------------------------------------


def _kazoo(hosts: str, **kwargs: Any) -> Any:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=30.0, **kwargs)
    client.start(timeout=60)
    return client


def _close(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: BLE001 - a client of a server already gone
        pass


def _pipelined_sets(client: Any, path: str, value: bytes, count: int, window: int = 256) -> None:
    """`count` set_async of `path` with `window` in flight; raises the first error."""
    pending = []
    for _ in range(count):
        pending.append(client.set_async(path, value))
        if len(pending) >= window:
            pending.pop(0).get(timeout=120)
    for p in pending:
        p.get(timeout=120)


class Bench:
    def __init__(self, folder: Path, trees: list[Tree], *, with_zk: bool, zk_heap: str, command: str,
                 progress: Callable[[str], None] = print) -> None:
        self.folder = folder
        self.trees = trees
        self.with_zk = with_zk
        self.progress = progress
        facts = machine.facts(folder, REPO)
        facts["git"] = ledger.git_state(REPO)
        self.results = Results(trees, facts, command, zk_heap=zk_heap)

    def run(self) -> Results:
        started = time.monotonic()
        r = self.results
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # reconnects while servers restart are the point
        r.busy_at_start = machine.busy_fraction(1.0)
        systems: list[str] = ["Quire"]
        if self.with_zk:
            try:
                zk.classpath()
                r.zk_version = zk.version()
                systems.append("ZooKeeper")
            except zk.ZkUnavailable as e:
                r.failures.append(f"ZooKeeper: not run: {e}")
        else:
            r.failures.append("ZooKeeper: not run (--no-zk)")
        for tree in self.trees:
            for name in systems:
                figures = Figures(name, tree)
                r.figures.append(figures)
                recorded_step(f"{name}, {tree.title}", lambda: self._one(name, tree, figures),
                              progress=self.progress, failures=figures.failures)
        r.duration_s = time.monotonic() - started
        return r

    def _one(self, name: str, tree: Tree, f: Figures) -> None:
        folder = self.folder / f"{name.lower()}-{tree.key}"
        system: System = QuireSystem(folder) if name == "Quire" else ZkSystem(folder, self.results.zk_heap)
        try:
            with PeakSampler(system.pids) as sampler:
                self._steps(system, tree, f, sampler)
            f.peaks = sampler.peaks
            if not sampler.clear_refs:
                self.results.clear_refs = False
        finally:
            crashed = system.crashed()
            system.close()
            for i, status in crashed.items():
                f.failures.append(f"{system.label(i)} exited with status {status}; its log ends:\n"
                                  + _tail(system.log_path(i)))
            shutil.rmtree(folder, ignore_errors=True)  # gigabytes: the next system needs the disk

    def _step(self, f: Figures, name: str, body: Callable[[], Any]) -> Any:
        f.loadavg[name] = os.getloadavg()[0]
        return recorded_step(f"{f.system}, {f.tree.key}: {name}", body, progress=self.progress, failures=f.failures)

    def _steps(self, system: System, tree: Tree, f: Figures, sampler: PeakSampler) -> None:
        system.start()
        leader = system.wait_serving()
        f.leader = system.label(leader)
        sampler.begin("load")
        loaded = self._step(f, "load", lambda: self._load(system, tree, f))
        sampler.end()
        if not loaded:
            return
        sampler.begin("snapshot")
        self._step(f, "snapshot", lambda: self._snapshot(system, leader, f))
        sampler.end()
        # The wiped follower before the restart: its figure does not then depend on the restart succeeding.
        sampler.begin("resync")
        self._step(f, "wiped follower", lambda: self._resync(system, leader, f, sampler))
        sampler.end()
        sampler.begin("restart")
        self._step(f, "restart", lambda: self._restart(system, tree, f, sampler))
        sampler.end()

    # -- 1. load -------------------------------------------------------------------------------------------
    def _load(self, system: System, tree: Tree, f: Figures) -> bool:
        f.rss_before = {system.label(i): rss(system.proc(i).pid) or 0 for i in system.ids}
        client = _kazoo(system.hosts())
        try:
            client.create(ROOT, b"")
            client.create(MARK, MARK_VALUE)
            for i in range(tree.parents):
                client.create(tree.parent(i), b"")
        finally:
            _close(client)
        specs = [{"hosts": system.hosts(system.ids[w % len(system.ids)]), "op": "create", "window": tree.window,
                  "value_bytes": tree.value_bytes, "children": tree.children,
                  "parents": [tree.parent(i) for i in range(w, tree.parents, tree.processes)]}
                 for w in range(tree.processes)]
        f.load_s, done = self._workers(system, tree, "loader", specs)
        for d in done:
            for k, v in d["errors"].items():
                f.load_errors[k] = f.load_errors.get(k, 0) + v
            f.load_error_samples += d["error_samples"]
        self.progress(f"  loaded {sum(d['ok'] for d in done):,} znodes in {f.load_s:.1f} s "
                      f"({f.load_rate:,.0f}/s), errors {f.load_errors or 'none'}")
        t0 = time.monotonic()
        states = self._settled(system)
        f.settle_s = time.monotonic() - t0
        f.node_count = states[0][1]
        f.rss_loaded = {system.label(i): rss(system.proc(i).pid) or 0 for i in system.ids}
        return not f.load_errors

    def _workers(self, system: System, tree: Tree, name: str, specs: list[dict[str, Any]]) -> tuple[float, list[dict]]:
        """bench/tree_loader.py processes, one per spec, connected, then all told to go at once: the seconds
        from "go" to the last one's result, and their results."""
        folder = self.folder / "clients" / f"{system.name.lower()}-{tree.key}"
        folder.mkdir(parents=True, exist_ok=True)
        workers = []
        try:
            for n, spec in enumerate(specs):
                workers.append(_Worker(f"{system.name} {name} {n + 1}", spec, folder / f"{name}{n + 1}.log",
                                       module="bench.tree_loader"))
            deadline = time.monotonic() + 120
            for w in workers:
                w.line(deadline)  # "ready"
            t0 = time.monotonic()
            for w in workers:
                w.send("go\n")
            deadline = time.monotonic() + 6 * 3600
            done = [json.loads(w.line(deadline)) for w in workers]
            took = time.monotonic() - t0
            for w in workers:
                w.proc.wait(timeout=30)  # each exits by itself once its session is closed
            return took, done
        finally:
            for w in workers:
                w.close()

    def _settled(self, system: System, timeout_s: float = SETTLE_TIMEOUT_S) -> list[tuple[int, int, str]]:
        """Until every server reports the same zxid and node count (srvr); their states."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = [srvr_state(system.port(i)) for i in system.ids]
            if all(states) and len({(s[0], s[1]) for s in states}) == 1:  # type: ignore[index]
                return states  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name}: servers not converged after {timeout_s:g} s: {states}")
            time.sleep(0.1)

    # -- 2. snapshot -----------------------------------------------------------------------------------------
    def _snapshot(self, system: System, leader: int, f: Figures) -> None:
        if isinstance(system, QuireSystem):
            self._quire_snapshot(system, leader, f)
        else:
            assert isinstance(system, ZkSystem)
            self._zk_snapshot(system, leader, f)
        time.sleep(2.0)  # the followers' snapshots of the same moment, if any, end first
        self._disk_floor(system, f)

    def _disk_floor(self, system: System, f: Figures) -> None:
        """The same number of bytes as the snapshot file written in 1 MiB pieces to a new file in the same
        filesystem, without and then with an fsync: what the disk alone costs for that file."""
        if not f.snapshot_file_bytes:
            return
        path = self.folder / "disk-floor.tmp"
        piece = b"\0" * (1 << 20)
        try:
            t0 = time.monotonic()
            with open(path, "wb") as out:
                left = f.snapshot_file_bytes
                while left > 0:
                    left -= out.write(piece[:min(left, len(piece))])
                out.flush()
                f.floor_write_s = time.monotonic() - t0
                os.fsync(out.fileno())
            f.floor_fsync_s = time.monotonic() - t0
        finally:
            path.unlink(missing_ok=True)

    def _quire_remaining(self, system: QuireSystem, leader: int) -> tuple[int, int]:
        """(the leader's committed zxid, how many more transactions it delivers before its next snapshot):
        Zab counts the transactions each node delivered since its start or its last snapshot."""
        log = system.log_path(leader).read_text(errors="replace").splitlines()
        started = max((n for n, line in enumerate(log) if "node started" in line), default=0)
        snaps = [int(m[1], 16) for line in log[started:]
                 if (m := re.search(r"event=snapshot zxid=(0x[0-9a-f]+)", line))]
        status = system.status(leader)
        assert status is not None, "the leader does not answer /status"
        committed = status["last_committed_zxid"]
        epoch = committed >> 32
        last = snaps[-1] if snaps and snaps[-1] >> 32 == epoch else epoch << 32
        return committed, system.snapshot_every - (committed - last)

    def _quire_snapshot(self, system: QuireSystem, leader: int, f: Figures) -> None:
        _, remaining = self._quire_remaining(system, leader)
        bulk = remaining - 50  # the rest from this process, once the workers' sessions (txns too) are closed
        if bulk > 0:  # by 3 processes, one per server: the count is what matters, not who sends
            specs = [{"hosts": system.hosts(i), "op": "set", "path": MARK, "value_bytes": len(MARK_VALUE),
                      "window": 128, "count": bulk // 3 + (n < bulk % 3)} for n, i in enumerate(system.ids)]
            _, done = self._workers(system, f.tree, "trigger", specs)
            errors = {k: v for d in done for k, v in d["errors"].items()}
            if errors:
                raise RuntimeError(f"setData before the snapshot failed: {errors}")
        tail = LogTail(system.log_path(leader))
        client = _kazoo(system.hosts(leader))
        try:
            committed, remaining = self._quire_remaining(system, leader)
            assert remaining >= 1, f"the leader should have snapshotted already ({remaining})"
            f.trigger_writes = max(0, bulk) + remaining
            _pipelined_sets(client, MARK, MARK_VALUE, remaining - 1)
            t0 = time.time()
            client.set(MARK, MARK_VALUE)
            target = committed + remaining
            deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
            while True:
                for line in tail.lines():
                    m = re.search(r"event=snapshot zxid=(0x[0-9a-f]+) bytes=(\d+)", line)
                    if m and int(m[1], 16) >= target:
                        end = quire_ts(line)
                        assert end is not None
                        f.snapshot_s = end - t0
                        f.snapshot_file_bytes = int(m[2])
                        f.snapshot_note = (f"leader {system.label(leader)}, snapshot at zxid {m[1]} after "
                                           f"{f.trigger_writes:,} more setData (every {system.snapshot_every:,} txns)")
                        self.progress(f"  snapshot on {system.label(leader)}: {f.snapshot_s:.2f} s, "
                                      f"{_mib(f.snapshot_file_bytes)}")
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no snapshot at or past {target:#x} on the leader after "
                                       f"{SNAPSHOT_TIMEOUT_S:g} s ({remaining} writes sent)")
                time.sleep(0.05)
        finally:
            _close(client)

    def _zk_snapshot(self, system: ZkSystem, leader: int, f: Figures) -> None:
        state = srvr_state(system.port(leader))
        assert state is not None
        loaded_zxid = state[0]
        tail = LogTail(system.log_path(leader))
        client = _kazoo(system.hosts(leader))
        seen: list[str] = []
        try:
            sent = 0
            while sent < ZK_MAX_TRIGGER_WRITES:
                _pipelined_sets(client, MARK, MARK_VALUE, ZK_BURST)
                sent += ZK_BURST
                seen += tail.lines()
                tail.offset = tail.path.stat().st_size
                if _zk_snapshotting(seen, loaded_zxid) is not None:
                    break
            f.trigger_writes = sent
            deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
            while True:
                found = _zk_snapshotting(seen, loaded_zxid)
                if found is not None:
                    index, zxid, path = found
                    taken = next((line for line in seen[index:] if "Snapshot taken in" in line), None)
                    if taken is not None:
                        ms = int(re.search(r"Snapshot taken in (\d+) ms", taken)[1])  # type: ignore[index]
                        f.snapshot_s = ms / 1000
                        file = system.ensemble.data_dir(leader) / "version-2" / Path(path).name
                        f.snapshot_file_bytes = file.stat().st_size if file.exists() else None
                        f.snapshot_note = (f"leader {system.label(leader)}, snapshot at zxid {zxid:#x} after "
                                           f"{sent:,} more setData in bursts of {ZK_BURST:,}")
                        self.progress(f"  snapshot on {system.label(leader)}: {f.snapshot_s:.2f} s, "
                                      f"{_mib(f.snapshot_file_bytes)}")
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no periodic snapshot past {loaded_zxid:#x} on the leader after "
                                       f"{sent:,} writes")
                time.sleep(0.05)
                seen += tail.lines()
                tail.offset = tail.path.stat().st_size
        finally:
            _close(client)

    # -- 3. restart -----------------------------------------------------------------------------------------
    def _restart(self, system: System, tree: Tree, f: Figures, sampler: PeakSampler) -> int:
        tails = {i: LogTail(system.log_path(i)) for i in system.ids}
        for i in system.ids:
            sampler.reset(system.proc(i).pid)
        f.stop_s, f.stop_killed = system.stop_all()
        self.progress(f"  stopped: {', '.join(f'{k} {v:.2f} s' for k, v in f.stop_s.items())}"
                      + (f"; SIGKILLed {', '.join(f.stop_killed)}" if f.stop_killed else ""))
        t0_wall, t0 = time.time(), time.monotonic()
        system.start()
        for i in system.ids:
            sampler.reset(system.proc(i).pid)
        results: dict[int, float | None] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, _first_read(system.hosts(i), tree.last_path, t0)),
                                    daemon=True) for i in system.ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        f.read_s = {system.label(i): s for i, s in results.items() if s is not None}
        if len(f.read_s) < len(system.ids):
            raise RuntimeError(f"servers that never served a read in {SERVING_TIMEOUT_S:g} s: "
                               f"{[system.label(i) for i in system.ids if results.get(i) is None]}; served: "
                               f"{f.read_s}; their role changes meanwhile:\n" + _roles(system, tails))
        f.first_read_s, f.all_read_s = min(f.read_s.values()), max(f.read_s.values())
        leader = system.wait_serving()
        f.restart_log = _restart_log(system, tails, t0_wall)
        self.progress(f"  serving after restart: first {f.first_read_s:.2f} s, all {f.all_read_s:.2f} s; "
                      + "; ".join(f.restart_log))
        return leader

    # -- 4. wiped follower -----------------------------------------------------------------------------------
    def _resync(self, system: System, leader: int, f: Figures, sampler: PeakSampler) -> None:
        follower = next(i for i in system.ids if i != leader)
        f.resync_node = system.label(follower)
        target = srvr_state(system.port(leader))
        assert target is not None, "the leader does not answer srvr"
        sampler.reset(system.proc(follower).pid)
        system.stop_one(follower)
        system.wipe(follower)
        tail = LogTail(system.log_path(follower))
        leader_tail = LogTail(system.log_path(leader))
        t0_wall, t0 = time.time(), time.monotonic()
        system.start(follower)
        sampler.reset(system.proc(follower).pid)
        deadline = t0 + RESYNC_TIMEOUT_S
        while True:
            state = srvr_state(system.port(follower))
            if state is not None and state[:2] == target[:2] and _synced(system, follower):
                f.resync_s = time.monotonic() - t0
                break
            if system.proc(follower).poll() is not None:
                raise RuntimeError(f"{f.resync_node} exited with status {system.proc(follower).returncode} "
                                   f"during its resync:\n{_tail(system.log_path(follower))}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{f.resync_node} not synced after {RESYNC_TIMEOUT_S:g} s: {state} "
                                   f"against the leader's {target}")
            time.sleep(0.05)
        if isinstance(system, QuireSystem):  # the install's log line may come from the writer thread after
            deadline = time.monotonic() + 60  # the node serves: wait for it a little, untimed
            while time.monotonic() < deadline and not any("event=snap_installed" in x for x in tail.lines()):
                time.sleep(0.1)
        f.resync_log = _resync_log(system, tail.lines(), leader_tail.lines(), t0_wall)
        self.progress(f"  {f.resync_node} resynced in {f.resync_s:.2f} s; " + "; ".join(f.resync_log))


def _synced(system: System, i: int) -> bool:
    """Quire: /status says the node follows in phase broadcast (its srvr can show the leader's zxid while the
    SNAP is still being installed; it ACKs NEWLEADER only after the install, as ZooKeeper's follower serves
    only after its own snapshot). ZooKeeper: srvr answers only once the follower serves."""
    if not isinstance(system, QuireSystem):
        return True
    status = system.status(i)
    return status is not None and status.get("phase") == "broadcast" and status.get("role") == "follower"


def _zk_snapshotting(lines: list[str], after: int) -> tuple[int, int, str] | None:
    """The first `Snapshotting: 0x<zxid> to <file>` line past `after`: (index, zxid, file)."""
    for n, line in enumerate(lines):
        m = re.search(r"Snapshotting: 0x([0-9a-f]+) to (\S+)", line)
        if m and int(m[1], 16) > after:
            return n, int(m[1], 16), m[2]
    return None


def _first_read(hosts: str, path: str, t0: float) -> float | None:
    """Seconds from `t0` until a kazoo client of `hosts` alone reads `path` (it retries connecting every
    50 ms, without backoff); None after SERVING_TIMEOUT_S."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=1, max_jitter=0.0, max_delay=0.05)
    client = KazooClient(hosts=hosts, timeout=10.0, connection_retry=retry)
    client.start_async()
    try:
        while time.monotonic() - t0 < SERVING_TIMEOUT_S:
            if client.connected:
                try:
                    client.get(path)
                    return time.monotonic() - t0
                except Exception:  # noqa: BLE001 - not serving yet, or the connection dropped: try again
                    pass
            time.sleep(0.02)
        return None
    finally:
        _close(client)


def _roles(system: System, tails: dict[int, LogTail], n: int = 4) -> str:
    """Per server: how often it took each role since `tails` began, the last epoch, its last role changes."""
    keys = ("event=role", "event=recovered", "LOOKING", "LEADING", "FOLLOWING")
    out = []
    for i, tail in tails.items():
        lines = tail.lines()
        roles = [x for x in lines if any(k in x for k in keys)]
        epochs = [int(m[1]) for x in roles if (m := re.search(r"epoch=(\d+)", x))]
        counts = {r: sum(f"role={r} " in x for x in roles) for r in ("leader", "follower", "looking")}
        out.append(f"{system.label(i)}: {counts}, last epoch {max(epochs, default='?')}, "
                   f"{sum('event=disconnect' in x for x in lines)} disconnect lines; its last role lines:")
        out += [x[:200] for x in roles[-n:]]
    return "\n".join(out)


def _restart_log(system: System, tails: dict[int, LogTail], t0: float) -> list[str]:
    """What the logs say about loading the state at start, per server."""
    notes = []
    for i, tail in tails.items():
        lines = tail.lines()
        if isinstance(system, QuireSystem):
            line = next((x for x in lines if "event=recovered" in x), None)
            ts = quire_ts(line) if line else None
            if ts is not None:
                notes.append(f"{system.label(i)} recovered {ts - t0:.2f} s after the start")
        else:
            parts = []
            for pattern, what in ((r"Snapshot loaded in (\d+) ms", "snapshot loaded"),
                                  (r"(\d+) txns loaded in (\d+) ms", "txns loaded"),
                                  (r"Snapshot taken in (\d+) ms", "snapshot taken")):
                for x in lines:
                    m = re.search(pattern, x)
                    if m:
                        parts.append(f"{what} {int(m.groups()[-1]) / 1000:.2f} s" if what != "txns loaded"
                                     else f"{int(m[1]):,} txns loaded in {int(m[2]) / 1000:.2f} s")
                        break
            if parts:
                notes.append(f"{system.label(i)}: {', '.join(parts)}")
    return notes


def _resync_log(system: System, lines: list[str], leader_lines: list[str], t0: float) -> list[str]:
    notes = []
    if isinstance(system, QuireSystem):
        for x in lines:
            if "event=recovered" in x and (ts := quire_ts(x)):
                notes.append(f"recovered (empty) {ts - t0:.2f} s after the start")
            m = re.search(r"event=snap_installed zxid=(0x[0-9a-f]+) bytes=(\d+)", x)
            if m and (ts := quire_ts(x)):
                notes.append(f"SNAP of {_mib(int(m[2]))} installed {ts - t0:.2f} s after the start")
    else:
        for x in lines:
            ts = zk_ts(x)
            if ts is None:
                continue
            if "Getting a snapshot from leader" in x:
                notes.append(f"SNAP from the leader begins {ts - t0:.2f} s after the start")
            m = re.search(r"Snapshot taken in (\d+) ms", x)
            if m:
                notes.append(f"its own snapshot after the SNAP (fsynced) {int(m[1]) / 1000:.2f} s, "
                             f"done {ts - t0:.2f} s after the start")
        for x in leader_lines:
            if "Sending snapshot" in x or "Sending SNAP" in x:
                ts = zk_ts(x)
                if ts:
                    notes.append(f"leader sends SNAP {ts - t0:.2f} s after the start")
                break
    return notes


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as e:
        return f"({path}: {e})"


# -- entry points ----------------------------------------------------------------------------------------


def trees(znodes: int, znode_bytes: int, parents: int, big_znodes: int, big_bytes: int, big_parents: int,
          *, big: bool) -> list[Tree]:
    small = Tree("small", parents, max(1, znodes // parents), znode_bytes, processes=4, window=128)
    out = [small]
    if big and big_znodes:
        out.append(Tree("big", big_parents, max(1, big_znodes // big_parents), big_bytes, processes=2, window=4))
    return out


def run(folder: Path, tree_list: list[Tree], *, with_zk: bool = True, zk_heap: str = ZK_HEAP,
        command: str | None = None, progress: Callable[[str], None] = print) -> Results:
    command = command or shlex.join([Path(sys.executable).name, "-m", "bench.large_tree", *sys.argv[1:]])
    return Bench(folder, tree_list, with_zk=with_zk, zk_heap=zk_heap, command=command, progress=progress).run()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--znodes", type=int, default=1_000_000, help="znodes of the first tree (default 1,000,000)")
    p.add_argument("--znode-bytes", type=int, default=100, help="their data (default 100 B)")
    p.add_argument("--parents", type=int, default=1000, help="parents of the first tree (default 1000)")
    p.add_argument("--big-znodes", type=int, default=1000, help="znodes of the second tree (default 1000)")
    p.add_argument("--big-bytes", type=int, default=1_000_000,
                   help="their data (default 1,000,000 B: under jute.maxbuffer, 0xfffff, of both systems)")
    p.add_argument("--big-parents", type=int, default=10, help="parents of the second tree (default 10)")
    p.add_argument("--no-big", action="store_true", help="the first tree only")
    p.add_argument("--zk-heap", default=ZK_HEAP, help=f"ZooKeeper's -Xmx (default {ZK_HEAP})")


def main(argv: list[str] | None = None) -> int:
    from bench import large_tree_report

    p = argparse.ArgumentParser(prog="python -m bench.large_tree", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--no-zk", action="store_true", help="Quire only")
    p.add_argument("--workdir", default=None, help="parent of the temp dir (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (loader logs; data dirs are removed "
                                                       "after each system to free the disk)")
    p.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"),
                   help="the report whose large-tree section is rewritten (default docs/benchmarks.md); "
                        "'-' prints the section instead")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="quire-large-tree-", dir=args.workdir))
    print(f"bench.large_tree: working in {folder}")
    try:
        results = run(folder, trees_of(args), with_zk=not args.no_zk, zk_heap=args.zk_heap)
        section = large_tree_report.render(results)
        if args.output == "-":
            print(section)
        else:
            large_tree_report.splice(Path(args.output), section)
            print(f"bench.large_tree: wrote its section of {args.output}")
    finally:
        if args.keep:
            print(f"bench.large_tree: kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    failed = results.failures or any(f.failures for f in results.figures)
    return 1 if failed else 0


def trees_of(args: argparse.Namespace) -> list[Tree]:
    return trees(args.znodes, args.znode_bytes, args.parents, args.big_znodes, args.big_bytes, args.big_parents,
                 big=not args.no_big)


if __name__ == "__main__":
    sys.exit(main())
