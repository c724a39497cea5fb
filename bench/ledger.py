"""The ledger part of the suite (issue 4, "Measure"): bookies and the ledger SDK against this machine's disk.

In one run, each figure beside the reference it is judged against:

1. the disk's own rates (a plain Python loop on the data dirs' filesystem): 100-byte append + fsync
   (fsyncs/s) and 1 MiB append + fsync (MB/s), before and after the cluster part;
2. one bookie's storage engine with group commit (bench/bookie_storage.py), 100-byte adds/s against the
   100-byte fsync loop run just before it;
3. a throw-away 3-node cluster (bench/quire.py; every node a voter and a bookie) and one
   client, this process, through the ledger SDK (bench/ledger_load.py): pipelined append throughput and
   latency for 100 B, 1 KB and 64 KB entries with E=Qw=Qa=3 and E=3, Qw=2, Qa=2; append latency at low load;
   append-to-delivery latency at a tailing reader in another process; catch-up read throughput of a closed
   ledger; recovery time of a 10,000-entry ledger whose writer process died without closing it;
4. where a node's CPU goes under 64 KB appends, kernel included (bench/cpu_profile.py, perf), since that
   row's target is missed and py-spy cannot see the kernel time it is mostly made of;
5. the floor under that row (bench/write_floor.py): the same bytes through three minimal bookies, no
   protocol, with each entry written twice (journal and entry log, Quire's design) and once.

    python -m bench.run --only ledger [--quick]      # writes its section into docs/benchmarks.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.steps import recorded_step
from bench import bookie_storage, cpu_profile, disk, logscan, machine, write_floor
from bench import ledger_load as workloads
from bench.ledger_load import AppendRun, LatencyRun, Quorum, ReadRun, RecoveryRun
from bench.quire import QuireCluster
from clusterd import localcluster

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
LARGE_FILE_MAX = 128 * MIB  # the 1 MiB loop starts a new file past this (the rotation is not timed)

QUORUMS = (Quorum(3, 3, 3), Quorum(3, 2, 2))
RECOVERY_QUORUM = Quorum(3, 3, 2)
PROFILE_S = 4.0  # perf sampling of a node under 64 KB appends
PROFILE_ENTRY_BYTES = 65536  # the entry size of the append row profiled (one of entry_sizes)


@dataclass(frozen=True)
class LedgerSizes:
    disk_s: float  # the 100 B disk loop (the 1 MiB one runs 2/3 of it)
    bookie_s: float  # each bookie-engine run (and the disk loop before it)
    bookie_adders: tuple[int, ...]  # concurrent adders, one run each
    warmup_s: float  # pipelined appends before each timed window
    window_s: float
    # (entry bytes, appends in flight at most, appends started together once that many are acknowledged)
    entry_sizes: tuple[tuple[int, int, int], ...]
    one_by_one: tuple[tuple[int, int], ...]  # (entry bytes, in flight) with E=Qw=Qa=3, one started per ack
    low_load: int  # appends one at a time, timed
    low_load_warmup: int
    tail: int  # entries timed at the tailing reader
    tail_warmup: int
    tail_gaps_s: tuple[float, ...]  # pause between appends; 0: back to back
    catch_up_entries: int
    catch_up_size: int
    recovery_entries: int
    recovery_window: int
    recovery_modes: tuple[str, ...]  # "kill": SIGKILL with appends in flight; "quiet": after its explicit LAC


FULL = LedgerSizes(disk_s=3.0, bookie_s=3.0, bookie_adders=(1, 64, 256), warmup_s=1.0, window_s=5.0,
                   entry_sizes=((100, 1000, 250), (1024, 1000, 250), (65536, 64, 16)),
                   one_by_one=((100, 1000),), low_load=1000, low_load_warmup=100,
                   tail=1000, tail_warmup=20, tail_gaps_s=(0.0, 0.005), catch_up_entries=20_000,
                   catch_up_size=1024, recovery_entries=10_000, recovery_window=1000,
                   recovery_modes=("kill", "quiet"))
QUICK = LedgerSizes(disk_s=0.5, bookie_s=1.0, bookie_adders=(64,), warmup_s=0.3, window_s=1.5,
                    entry_sizes=((100, 1000, 250), (1024, 1000, 250), (65536, 64, 16)),
                    one_by_one=((100, 1000),), low_load=200, low_load_warmup=20,
                    tail=200, tail_warmup=10, tail_gaps_s=(0.0,), catch_up_entries=3000, catch_up_size=1024,
                    recovery_entries=10_000, recovery_window=1000, recovery_modes=("kill",))


@dataclass
class ThroughputRate:
    name: str
    bytes: int
    elapsed_s: float  # time inside write + fsync only

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6


@dataclass
class DiskRef:
    when: str
    small: disk.FsyncRate  # 100 B append + fsync
    large: ThroughputRate  # 1 MiB append + fsync
    load_avg: float


@dataclass
class LedgerResults:
    sizes: LedgerSizes
    quick: bool
    facts: dict[str, str]
    disk: list[DiskRef] = field(default_factory=list)
    bookie: list[dict[str, Any]] = field(default_factory=list)  # bench/bookie_storage.py runs
    appends: list[AppendRun] = field(default_factory=list)
    low_load: list[LatencyRun] = field(default_factory=list)
    bookie_trips: list[LatencyRun] = field(default_factory=list)  # raw bookie ADDs, 1 outstanding
    tails: list[LatencyRun] = field(default_factory=list)
    reads: list[ReadRun] = field(default_factory=list)
    recoveries: list[RecoveryRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    scan: logscan.Scan | None = None
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    duration_s: float = 0.0
    low_load_busy: float | None = None  # share of all CPUs busy just before the latency rows
    # Where node 1's CPU went under 64 KB appends (perf), or why that was not measured.
    large_profile: cpu_profile.CpuProfile | str | None = None
    # bench/write_floor.py's runs right after the 64 KB rows, or why they failed.
    floor: list[write_floor.FloorRun] | str | None = None

    def disk_small_per_s(self) -> float | None:
        """The best 100-byte append+fsync rate of the run (neighbours only ever slow the disk down)."""
        return max((d.small.per_s for d in self.disk), default=None)

    def disk_mb_per_s(self) -> float | None:
        return max((d.large.mb_per_s for d in self.disk), default=None)

    def append(self, quorum: Quorum, size: int, *, one_by_one: bool = False) -> AppendRun | None:
        return next((a for a in self.appends if a.quorum == quorum and a.size == size and not a.error
                     and (a.refill == 1) == one_by_one), None)


def large_append_fsync(folder: Path, duration_s: float) -> ThroughputRate:
    """Append 1 MiB + os.fsync in a loop for `duration_s` (of write + fsync time)."""
    block = os.urandom(MIB)
    written, busy = 0, 0.0
    with tempfile.TemporaryDirectory(dir=folder, prefix="fsync-large-") as tmp:
        path, fd, size = Path(tmp) / "append", -1, LARGE_FILE_MAX
        try:
            while busy < duration_s:
                if size >= LARGE_FILE_MAX:
                    if fd >= 0:
                        os.close(fd)
                        path.unlink()
                    fd, size = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 0
                started = time.perf_counter()
                os.write(fd, block)
                os.fsync(fd)
                busy += time.perf_counter() - started
                written, size = written + MIB, size + MIB
        finally:
            if fd >= 0:
                os.close(fd)
    return ThroughputRate("append 1 MiB + fsync", written, busy)


async def settle() -> None:
    """Write back every dirty page before a row: a 64 KB row leaves gigabytes of entry log pages
    (not fsynced by design) that the kernel would otherwise write back during the rows after it."""
    await trio.to_thread.run_sync(os.sync)


LOW_LOAD_BUSY_MAX = 0.25  # share of all CPUs, as the suite's own wait for a quiet machine
LOW_LOAD_WAIT_S = 20.0


async def settle_to_low_load() -> tuple[bool, float]:
    """settle(), then wait (at most LOW_LOAD_WAIT_S) until the machine is mostly idle: the latency
    rows are "at low load", and the saturating rows before them leave work behind for a while."""
    await settle()
    return await trio.to_thread.run_sync(
        lambda: machine.wait_quiet(max_busy=LOW_LOAD_BUSY_MAX, timeout_s=LOW_LOAD_WAIT_S))


def git_state(repo: Path) -> str:
    """HEAD and the bookie/ledger/server files that differ from it (others edit the tree while we measure)."""
    def run(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return done.stdout.rstrip()

    dirty = run("status", "--porcelain", "--", "bookie", "ledger", "clusterd", "metastore", "zab")
    changed = ", ".join(line[3:] for line in dirty.splitlines())
    return run("rev-parse", "--short", "HEAD").strip() + (f" plus uncommitted changes to {changed}" if changed else "")


class LedgerBench:
    """Runs the ledger part in `folder`; `run()` returns the results (a failed step is recorded, not raised)."""

    def __init__(self, folder: Path, sizes: LedgerSizes, *, quick: bool,
                 progress: Callable[[str], None] = print) -> None:
        self.folder = folder
        self.sizes = sizes
        self.progress = progress
        folder.mkdir(parents=True, exist_ok=True)  # `df -T` of it goes into the facts
        facts = machine.facts(folder, REPO)
        facts["git"] = git_state(REPO)
        self.results = LedgerResults(sizes, quick, facts)
        self.cluster: QuireCluster | None = None
        self.dead: set[int] = set()  # nodes seen exited

    def run(self) -> LedgerResults:
        started = time.monotonic()
        r = self.results
        r.load_start = os.getloadavg()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._step("disk reference (before)", lambda: self._disk("before"))
        self._step("one bookie's storage engine", self._bookie)
        self._step("3-node cluster", self._cluster)
        self._step("disk reference (after)", lambda: self._disk("after"))
        r.scan = logscan.scan_quire(self.folder / "cluster", "the ledger part's cluster")
        r.load_end = os.getloadavg()
        r.duration_s = time.monotonic() - started
        return r

    def _step(self, name: str, body: Callable[[], Any]) -> Any:
        return recorded_step(name, body, progress=self.progress, failures=self.results.failures,
                             label=f"ledger: {name} (load average {os.getloadavg()[0]:.2f})")

    async def _astep(self, name: str, body: Callable[[], Awaitable[Any]]) -> Any:
        self._check_nodes(name)
        self.progress(f"[{time.strftime('%H:%M:%S')}] ledger: {name} (load average {os.getloadavg()[0]:.2f}) ...")
        try:
            return await body()
        except Exception:  # noqa: BLE001 - recorded in the report, the part goes on
            self.results.failures.append(f"{name}:\n{traceback.format_exc()}")
            self.progress(f"  FAILED: {traceback.format_exc().splitlines()[-1]}")
            return None

    def _disk(self, when: str) -> None:
        folder = self.folder / "disk"
        folder.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()[0]
        small = disk.append_fsync(folder, self.sizes.disk_s)
        large = large_append_fsync(folder, self.sizes.disk_s * 2 / 3)  # at ~900 MB/s: 1.8 GB per 3 s
        self.results.disk.append(DiskRef(when, small, large, load))
        self.progress(f"  disk: {small.per_s:,.0f} fsyncs/s (100 B), {large.mb_per_s:,.0f} MB/s (1 MiB + fsync)")

    def _bookie(self) -> None:
        folder = self.folder / "bookie"
        folder.mkdir(parents=True, exist_ok=True)
        for adders in self.sizes.bookie_adders:
            load = os.getloadavg()[0]
            (row,) = bookie_storage.measure(folder, [adders], 100, self.sizes.bookie_s)["runs"]
            row["load_avg"] = load
            self.results.bookie.append(row)
            self.progress(f"  {adders} adders: {row['adds_per_s']:,} adds/s, {row['adds_per_fsync']} per fsync; "
                          f"disk {row['disk_append_fsync_per_s']:,} fsyncs/s; {row['vs_disk']}x")

    def _cluster(self) -> None:
        with QuireCluster(self.folder / "cluster") as cluster:
            cluster.start()
            self.cluster = cluster
            try:
                trio.run(self._cluster_steps, cluster)
            finally:
                self._check_nodes("the end of the cluster part")

    def _check_nodes(self, when: str) -> None:
        """Record (once) every node that exited by itself, with the end of its log."""
        if self.cluster is None:
            return
        for nid, proc in self.cluster.procs.items():
            if proc.poll() is not None and nid not in self.dead:
                self.dead.add(nid)
                self.results.failures.append(
                    f"node {nid} exited with status {proc.returncode} (seen before {when}); its log ends:\n"
                    f"{localcluster.tail(self.cluster.log_path(nid))}")
                self.progress(f"  NODE {nid} EXITED (status {proc.returncode})")

    async def _cluster_steps(self, cluster: QuireCluster) -> None:
        s, r = self.sizes, self.results
        await cluster.wait_all_broadcast()
        hosts = cluster.client_addresses()
        log = self.folder / "clients.log"
        async with workloads.connected(hosts) as ledgers:
            await workloads.wait_bookies(ledgers, 3)
            rows = [(q, size, window, refill) for q in QUORUMS for size, window, refill in s.entry_sizes]
            rows += [(QUORUMS[0], size, window, 1) for size, window in s.one_by_one]
            for quorum, size, window, refill in rows:
                await settle()
                run = await self._astep(
                    f"appends {quorum.label}, {size} B, {window} in flight, {refill} started at once",
                    lambda q=quorum, z=size, w=window, f=refill: workloads.append_window(
                        ledgers, q, z, w, warmup_s=s.warmup_s, window_s=s.window_s, pids=cluster.pids(), refill=f,
                        data_dir=self.folder))
                if run is not None:
                    r.appends.append(run)
                    self.progress(f"  {run.entries_per_s:,.0f} entries/s, {run.mb_per_s:,.1f} MB/s, p50 "
                                  f"{run.latency_ms(50):.1f} ms, p99 {run.latency_ms(99):.1f} ms; CPU per entry: "
                                  f"client {run.cpu_us_per_entry(True) or 0:.0f} us, nodes "
                                  f"{run.cpu_us_per_entry(False) or 0:.0f} us {run.error}")
            await settle()
            r.floor = await self._astep("the floor under the 64 KB row (bench/write_floor.py)", self._floor)
            if isinstance(r.floor, list):
                for run in r.floor:
                    self.progress(f"  {run.design}: {run.mb_per_s:,.1f} MB/s, machine {run.busy_cores:.2f} cores busy")
            await settle()
            r.large_profile = await self._astep("where node 1's CPU goes under 64 KB appends (perf)",
                                                lambda: self._profile_large(ledgers, cluster))
            quiet, busy = await settle_to_low_load()
            r.low_load_busy = busy
            self.progress(f"  machine {'quiet' if quiet else 'still busy'} before the latency rows: "
                          f"{100 * busy:.0f}% of all CPUs busy")
            for bookies in ([1], [1, 2, 3]):
                run = await self._astep(f"bookie ADD round trip to {bookies}", lambda b=bookies:
                                        workloads.bookie_round_trip(ledgers, b, s.low_load, s.low_load_warmup))
                if run is not None:
                    r.bookie_trips.append(run)
                    self.progress(f"  p50 {run.latency_ms(50):.2f} ms, p99 {run.latency_ms(99):.2f} ms")
            for quorum in QUORUMS:
                run = await self._astep(f"appends {quorum.label}, 1 outstanding", lambda q=quorum:
                                        workloads.one_at_a_time(ledgers, q, 100, s.low_load, s.low_load_warmup))
                if run is not None:
                    r.low_load.append(run)
                    self.progress(f"  p50 {run.latency_ms(50):.2f} ms, p99 {run.latency_ms(99):.2f} ms {run.error}")
            await self._tail_and_reads(ledgers, hosts, log)

    def _large_row(self) -> tuple[int, int, int]:
        """(entry bytes, in flight, refill) of the 64 KB append row, the one profiled and floored."""
        return next(row for row in self.sizes.entry_sizes if row[0] == PROFILE_ENTRY_BYTES)

    async def _floor(self) -> list[write_floor.FloorRun] | str:
        """bench/write_floor.py in a process of its own (it spawns its bookies; this one runs trio), with
        the 64 KB row's entry size and window, on the data dirs' filesystem."""
        size, window, _ = self._large_row()
        args = [sys.executable, "-m", "bench.write_floor", "--folder", str(self.folder), "--seconds",
                f"{self.sizes.window_s:g}", "--size", str(size), "--window", str(window), "--json"]
        done = await trio.to_thread.run_sync(lambda: subprocess.run(args, cwd=REPO, capture_output=True, text=True,
                                                                    timeout=120))
        if done.returncode != 0:
            return f"bench/write_floor.py exited with {done.returncode}: {done.stderr.strip()[-300:]}"
        return [write_floor.FloorRun(**{k: v for k, v in row.items() if k != "mb_per_s"})
                for row in json.loads(done.stdout)]

    async def _profile_large(self, ledgers: Any, cluster: QuireCluster) -> cpu_profile.CpuProfile | str:
        """The 64 KB E=Qw=Qa=3 row again, untimed, while perf samples node 1 (a bookie like the others):
        py-spy cannot see the kernel time that this row is mostly made of."""
        why = await trio.to_thread.run_sync(cpu_profile.unavailable)
        if why is not None:
            return why
        size, window, refill = self._large_row()
        seconds = PROFILE_S
        out = self.folder / "perf-64k.data"
        recorded: list[subprocess.CompletedProcess[str]] = []

        async def sample() -> None:
            await trio.sleep(self.sizes.warmup_s)
            recorded.append(await trio.to_thread.run_sync(cpu_profile.record, cluster.pid(1), seconds, out))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            await workloads.append_window(ledgers, QUORUMS[0], size, window, warmup_s=self.sizes.warmup_s,
                                          window_s=seconds + 0.5, pids=cluster.pids(), refill=refill)
        if not recorded or recorded[0].returncode != 0:
            return f"perf record failed: {recorded[0].stderr.strip()[-300:] if recorded else 'not run'}"
        profile = await trio.to_thread.run_sync(cpu_profile.read, out, f"node 1, {QUORUMS[0].label} {size:,} B "
                                                f"appends, {window} in flight", seconds)
        out.unlink(missing_ok=True)
        return profile

    async def _tail_and_reads(self, ledgers: Any, hosts: list[tuple[str, int]], log: Path) -> None:
        s, r = self.sizes, self.results
        for gap in s.tail_gaps_s:
            run = await self._astep(f"tailing reader (gap {1000 * gap:g} ms)", lambda g=gap: workloads.tail_latency(
                ledgers, hosts, QUORUMS[0], count=s.tail, warmup=s.tail_warmup, gap_s=g, log=log))
            if run is not None:
                r.tails.append(run)
                self.progress(f"  p50 {run.latency_ms(50):.2f} ms, p99 {run.latency_ms(99):.2f} ms {run.error}")
        read = await self._astep(f"catch-up read of {s.catch_up_entries} entries", lambda: workloads.catch_up(
            ledgers, hosts, QUORUMS[0], entries=s.catch_up_entries, size=s.catch_up_size))
        if read is not None:
            r.reads.append(read)
            self.progress(f"  {read.entries_per_s:,.0f} entries/s, {read.mb_per_s:,.1f} MB/s")
        for mode in s.recovery_modes:
            rec = await self._astep(f"recovery of {s.recovery_entries} entries ({mode})", lambda m=mode:
                                    workloads.recovery(hosts, RECOVERY_QUORUM, entries=s.recovery_entries,
                                                       window=s.recovery_window, mode=m, log=log))
            if rec is not None:
                r.recoveries.append(rec)
                self.progress(f"  {1000 * rec.elapsed_s:.0f} ms; bookies' LAC {rec.bookie_lac}, writer's LAC "
                              f"{rec.writer_lac} with {rec.in_flight} in flight, closed at {rec.last_entry}")


def run(folder: Path, *, quick: bool, progress: Callable[[str], None] = print) -> LedgerResults:
    return LedgerBench(folder, QUICK if quick else FULL, quick=quick, progress=progress).run()
