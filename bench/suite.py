"""The whole suite: which benchmarks run, in which order, with which sizes; results in one object.

A section that fails (a server that will not start, ZooKeeper missing) is
recorded with its reason and the suite goes on, so one broken part never
costs the figures of the others.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.steps import recorded_step
from bench import disk, election, kzbench, logscan, machine, profile, stats, throughput, timeline, zk
from bench.quire import QuireCluster

T = TypeVar("T")
QUIET_BUSY_MAX = 0.25  # share of all CPUs
# Bounded so that the whole suite stays near 15 minutes on a busy machine (about 10 when it is quiet).
QUIET_WAIT_FIRST_S = 120.0
QUIET_WAIT_SECTION_S = 15.0


@dataclass(frozen=True)
class Sizes:
    election_runs: int
    single_writes: int  # 1 outstanding
    many_writes: int  # `many` outstanding
    many: int
    warmup_single: int
    warmup_many: int
    fsync_loop_s: float
    profile_writes: int
    # The metastore part (bench/kzbench.py): kazoo against ZooKeeper and Quire's ZooKeeper protocol.
    kz_window_s: float  # timed window of each load row
    kz_warmup_s: float  # untimed load in each client process before the window
    kz_failovers: int  # leader SIGKILLs per system
    kz_profile_s: float  # py-spy window on the Quire leader
    poll_interval_s: float = 0.005
    value_sizes: tuple[int, ...] = (100, 1024)


FULL = Sizes(election_runs=20, single_writes=3000, many_writes=10000, many=64, warmup_single=300,
             warmup_many=1000, fsync_loop_s=3.0, profile_writes=6000,
             kz_window_s=5.0, kz_warmup_s=1.5, kz_failovers=11, kz_profile_s=8.0)
QUICK = Sizes(election_runs=5, single_writes=300, many_writes=2000, many=64, warmup_single=50,
              warmup_many=200, fsync_loop_s=1.0, profile_writes=2000,
              kz_window_s=2.0, kz_warmup_s=0.5, kz_failovers=3, kz_profile_s=3.0)
PARTS = ("zab", "metastore")


@dataclass
class Results:
    sizes: Sizes
    facts: dict[str, str]
    quiet: tuple[bool, float] = (True, 0.0)
    busy_processes: list[str] = field(default_factory=list)
    # Sections that started although the machine was still busy after waiting: (section, busy fraction).
    busy_sections: list[tuple[str, float]] = field(default_factory=list)
    zk_version: str = ""
    zk_unavailable: str = ""
    disk: list[disk.FsyncRate] = field(default_factory=list)
    elections: dict[str, list[election.Sample]] = field(default_factory=dict)
    quire_failovers: list[timeline.Failover] = field(default_factory=list)  # from the node logs
    workloads: list[throughput.Result] = field(default_factory=list)
    profile: profile.Run | None = None
    failures: list[str] = field(default_factory=list)  # section: traceback
    scans: list[logscan.Scan] = field(default_factory=list)
    metastore: kzbench.Results | None = None  # None: the metastore part did not run
    parts: tuple[str, ...] = PARTS
    duration_s: float = 0.0

    def workload(self, system: str, value_bytes: int, concurrency: int) -> throughput.Result | None:
        for r in self.workloads:
            if r.system == system and r.spec.value_bytes == value_bytes and r.spec.concurrency == concurrency:
                return r
        return None


class Suite:
    def __init__(self, workdir: Path, sizes: Sizes, *, with_zk: bool, repo: Path,
                 progress: Callable[[str], None] = print, parts: tuple[str, ...] = PARTS) -> None:
        self.workdir = workdir
        self.sizes = sizes
        self.with_zk = with_zk
        self.progress = progress
        self.wait_quiet = False
        self.results = Results(sizes, machine.facts(workdir, repo), parts=parts)

    def run(self, *, wait_quiet: bool) -> Results:
        started = time.monotonic()
        r = self.results
        self.wait_quiet = wait_quiet
        if wait_quiet:
            self.progress(f"waiting up to {QUIET_WAIT_FIRST_S:g} s for a quiet machine (below "
                          f"{100 * QUIET_BUSY_MAX:.0f}% CPU)...")
            r.quiet = machine.wait_quiet(max_busy=QUIET_BUSY_MAX, timeout_s=QUIET_WAIT_FIRST_S)
            if not r.quiet[0]:
                r.busy_processes = machine.top_processes()
        self._check_zk()
        if "zab" in r.parts:
            self._zab()
        if "metastore" in r.parts:
            if self.with_zk:
                self._section("metastore (kazoo: ZooKeeper and Quire)", self._metastore)
            else:
                r.failures.append("metastore (kazoo): not run, it needs ZooKeeper and kazoo: "
                                  f"{r.zk_unavailable}")
        r.duration_s = time.monotonic() - started
        return r

    def _zab(self) -> None:
        r = self.results
        self._section("disk fsync", self._disk)
        self._section("election (Quire)", self._election_quire)
        if self.with_zk:
            self._section("election (ZooKeeper)", self._election_zk)
        for value_bytes in self.sizes.value_sizes:
            for concurrency in (1, self.sizes.many):
                self._section(f"throughput (Quire, {value_bytes} B, {concurrency})",
                              lambda v=value_bytes, c=concurrency: self._workload("quire", v, c))
                if self.with_zk:
                    self._section(f"throughput (ZooKeeper, {value_bytes} B, {concurrency})",
                                  lambda v=value_bytes, c=concurrency: self._workload("zk", v, c))
        self._section("profile (Quire leader)", self._profile)
        r.scans.append(logscan.scan_quire(self.workdir / "quire", "quire"))
        if self.with_zk:
            r.scans.append(logscan.scan_zk(self.workdir / "zk", "zookeeper"))

    # -- sections ------------------------------------------------------------------------
    def _section(self, name: str, body: Callable[[], T]) -> T | None:
        if self.wait_quiet:
            # Other people's jobs share this machine: give them a moment to finish before each section.
            quiet, busy = machine.wait_quiet(max_busy=QUIET_BUSY_MAX, timeout_s=QUIET_WAIT_SECTION_S)
            if not quiet:
                self.results.busy_sections.append((name, busy))
        self.progress(f"[{time.strftime('%H:%M:%S')}] {name} ...")
        try:
            return body()
        except Exception:  # noqa: BLE001 - recorded in the report, the suite goes on
            self.results.failures.append(f"{name}:\n{traceback.format_exc()}")
            self.progress(f"  FAILED: {traceback.format_exc().splitlines()[-1]}")
            return None

    def _step(self, name: str, body: Callable[[], T]) -> T | None:
        """A step inside a section: failures recorded like a section's, without waiting for a quiet machine."""
        return recorded_step(name, body, progress=self.progress, failures=self.results.failures)

    def _metastore(self) -> None:
        s, r = self.sizes, self.results
        folder = self.workdir / "metastore"
        r.metastore = kzbench.Results()  # kept even if the bench fails half-way
        bench = kzbench.Bench(folder, window_s=s.kz_window_s, warmup_s=s.kz_warmup_s, failover_runs=s.kz_failovers,
                              profile_s=s.kz_profile_s, progress=self.progress, results=r.metastore)
        try:
            bench.run(self._step)
        finally:
            r.scans.append(logscan.scan_quire(folder / "quire", "Quire metastore (kazoo part)"))
            r.scans.append(logscan.scan_zk(folder / "zk", "ZooKeeper (kazoo part)"))
            r.scans.append(logscan.scan_clients(folder, "kazoo client processes (kazoo part)"))

    def _check_zk(self) -> None:
        if not self.with_zk:
            self.results.zk_unavailable = "skipped with --no-zk"
            return
        try:
            zk.classpath()
            import kazoo  # noqa: F401
        except (zk.ZkUnavailable, ImportError) as e:
            self.results.zk_unavailable = str(e) if not isinstance(e, ImportError) else \
                "kazoo is not installed: `pip install kazoo` into the benchmark's environment"
            self.with_zk = False
            return
        self.results.zk_version = zk.version()

    def _disk(self) -> None:
        folder = self.workdir / "disk"
        folder.mkdir(parents=True, exist_ok=True)
        self.results.disk = [disk.append_fsync(folder, self.sizes.fsync_loop_s),
                             disk.zk_pattern_fdatasync(folder, self.sizes.fsync_loop_s)]

    def _election_quire(self) -> None:
        with QuireCluster(self.workdir / "quire" / "election", bookies=False) as cluster:
            self.results.elections["Quire"] = election.run_quire(cluster, self.sizes.election_runs,
                                                                 self.sizes.poll_interval_s)
        self.results.quire_failovers = timeline.failovers(self.workdir / "quire" / "election" / "data")
        self._report_elections("Quire")

    def _election_zk(self) -> None:
        with zk.ZkEnsemble(self.workdir / "zk" / "election") as ensemble:
            self.results.elections["ZooKeeper"] = election.run_zk(ensemble, self.sizes.election_runs,
                                                                  self.sizes.poll_interval_s)
        self._report_elections("ZooKeeper")

    def _report_elections(self, system: str) -> None:
        times = [s.leader_s for s in self.results.elections[system] if s.leader_s is not None]
        if times:
            self.progress(f"  {system}: {len(times)} elections, median {1000 * stats.median(times):.0f} ms, "
                          f"worst {1000 * max(times):.0f} ms")

    def _spec(self, value_bytes: int, concurrency: int) -> throughput.Spec:
        s = self.sizes
        if concurrency == 1:
            return throughput.Spec(value_bytes, 1, s.single_writes, s.warmup_single)
        return throughput.Spec(value_bytes, concurrency, s.many_writes, s.warmup_many)

    def _workload(self, system: str, value_bytes: int, concurrency: int) -> None:
        spec = self._spec(value_bytes, concurrency)
        folder = self.workdir / system / f"w{value_bytes}-c{concurrency}"
        run = throughput.run_quire if system == "quire" else throughput.run_zk
        result = run(folder, spec)
        self.results.workloads.append(result)
        self.progress(f"  {result.system}: {result.outcome.ok} ok, {sum(result.outcome.errors.values())} errors, "
                      f"{result.throughput:.0f} writes/s, p50 {result.latency_ms(50):.1f} ms, "
                      f"p99 {result.latency_ms(99):.1f} ms")

    def _profile(self) -> None:
        spec = throughput.Spec(100, self.sizes.many, self.sizes.profile_writes, self.sizes.warmup_many)
        self.results.profile = profile.run(self.workdir / "quire" / "profile", spec)

