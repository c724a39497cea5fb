"""The steps of bench/large_tree.py (`Bench`): for each tree and system, load, snapshot, wiped follower
and restart, with each server's peak RSS per step (the module docstring of bench/large_tree.py
describes each step)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import ledger, machine, zk
from bench.kzbench import _Worker
from bench.large_tree_clients import _close, _first_read, _kazoo, _pipelined_sets
from bench.large_tree_logs import LogTail, _resync_log, _restart_log, _roles, _tail, _zk_snapshotting, quire_ts
from bench.large_tree_memory import PeakSampler, rss
from bench.large_tree_results import ROOT, Figures, Results, Tree, _mib
from bench.large_tree_systems import SERVING_TIMEOUT_S, QuireSystem, System, ZkSystem, srvr_state
from bench.steps import recorded_step

REPO = Path(__file__).resolve().parent.parent
MARK = f"{ROOT}-mark"  # the small znode the snapshot triggers write to
MARK_VALUE = b"m" * 10
SETTLE_TIMEOUT_S = 600.0
SNAPSHOT_TIMEOUT_S = 600.0
RESYNC_TIMEOUT_S = 300.0
ZK_BURST = 1000  # setData per burst while waiting for ZooKeeper's next periodic snapshot
ZK_MAX_TRIGGER_WRITES = 150_000  # more than snapCount (100,000): a snapshot must have come by then


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
        """(the leader's committed zxid, how many more transactions it delivers before its next snapshot,
        which /status says: the count varies per node and per snapshot, zab/core/peer.py snapshot_count)."""
        status = system.status(leader)
        assert status is not None, "the leader does not answer /status"
        return status["last_committed_zxid"], status["snapshot_in_txns"]

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
                        if (synced := re.search(r"sync_s=([0-9.]+)", line)) is not None:
                            f.snapshot_sync_s = float(synced[1])
                        self._snapshot_measured(f, system.label(leader), end - t0, int(m[2]),
                                                f"snapshot at zxid {m[1]} after {f.trigger_writes:,} more setData "
                                                f"(snapshot_every_txns {system.snapshot_every:,})")
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no snapshot at or past {target:#x} on the leader after "
                                       f"{SNAPSHOT_TIMEOUT_S:g} s ({remaining} writes sent)")
                time.sleep(0.05)
        finally:
            _close(client)

    def _snapshot_measured(self, f: Figures, leader: str, seconds: float, file_bytes: int | None, how: str) -> None:
        """Either system's snapshot step, once its time is known: the figures and the progress line."""
        f.snapshot_s, f.snapshot_file_bytes = seconds, file_bytes
        f.snapshot_note = f"leader {leader}, {how}"
        self.progress(f"  snapshot on {leader}: {seconds:.2f} s, {_mib(file_bytes)}")

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
                seen += tail.take()
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
                        file = system.ensemble.data_dir(leader) / "version-2" / Path(path).name
                        self._snapshot_measured(f, system.label(leader), ms / 1000,
                                                file.stat().st_size if file.exists() else None,
                                                f"snapshot at zxid {zxid:#x} after {sent:,} more setData in bursts "
                                                f"of {ZK_BURST:,}")
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no periodic snapshot past {loaded_zxid:#x} on the leader after "
                                       f"{sent:,} writes")
                time.sleep(0.05)
                seen += tail.take()
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
