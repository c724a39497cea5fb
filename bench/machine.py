"""Facts about the machine a benchmark ran on, and CPU accounting of the processes involved.

CPU accounting matters on a 2-core machine running three servers and a client:
a throughput figure means little without knowing which process was saturated,
and whether something outside the benchmark was using the CPU meanwhile.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({shlex.join(command)} failed: {e})"
    return (done.stdout + done.stderr).strip()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1 << 20)
    return float("nan")


def df_t(path: Path) -> str:
    """`df -T` of the filesystem holding `path` (header and one line)."""
    return _run(["df", "-T", str(path)])


def facts(data_dir: Path, repo: Path) -> dict[str, str]:
    """What docs/benchmarks.md records about the run's environment."""
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", "bench.run", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": _run(["nproc"]),
        "cpu": cpu_model(),
        "ram": f"{mem_total_gib():.1f} GiB",
        "kernel": platform.release(),
        "python": sys.version.split()[0] + f" ({sys.executable})",
        "data_dir": str(data_dir),
        "df": df_t(data_dir),
        "git": _git_state(repo),
        "java": _run(["java", "-version"]).splitlines()[0] if _run(["which", "java"]) else "not installed",
    }


def _git_state(repo: Path) -> str:
    """HEAD, and the server files that differ from it (other people edit the tree while we measure)."""
    head = _run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", str(repo), "status", "--porcelain", "--", "zab", "clusterd", "metastore", "bookie", "ledger",
                  "replay", "cluster.toml"])
    # Split, not slice: the output arrives stripped, so the first line lost its leading status space.
    return head + (f" plus uncommitted changes to {', '.join(line.split(maxsplit=1)[1] for line in dirty.splitlines())}"
                   if dirty else "")


# -- CPU accounting --------------------------------------------------------------


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def disk_bytes_written(folder: Path) -> int | None:
    """Bytes written so far by the block device that holds `folder` (/proc/diskstats), or None if it is
    not listed there (a device-mapper or network filesystem, say)."""
    dev = os.stat(folder).st_dev
    try:
        for line in Path("/proc/diskstats").read_text().splitlines():
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (os.major(dev), os.minor(dev)):
                return int(fields[9]) * 512  # sectors of 512 bytes, whatever the device's own
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), or None if it is gone."""
    try:
        parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(parts[11]) + int(parts[12])) / _CLOCK_TICKS


def sched_seconds(pid: int, *, main_thread_only: bool = False) -> tuple[float, float] | None:
    """(on a CPU, runnable but waiting for one) seconds of a process's threads, from /proc/.../schedstat.

    With `main_thread_only`, only the thread whose id is the pid (a trio node's event loop). None if the
    process is gone. The second figure says whether a process was starved of CPU rather than idle.
    """
    tids = [str(pid)] if main_thread_only else None
    try:
        tids = tids or os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    run = wait = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        run += int(fields[0])
        wait += int(fields[1])
    return run / 1e9, wait / 1e9


def busy_fraction(interval_s: float = 1.0) -> float:
    """Share of all CPUs that was busy over the next `interval_s` (blocking)."""
    busy0, total0 = machine_jiffies()
    time.sleep(interval_s)
    busy1, total1 = machine_jiffies()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_quiet(*, max_busy: float = 0.25, timeout_s: float = 180.0) -> tuple[bool, float]:
    """Wait until the machine is mostly idle (other people's test runs share it).

    Returns (quiet, last busy fraction); gives up after `timeout_s` so a busy
    machine delays the suite but never blocks it: the report then says so.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        busy = busy_fraction(1.0)
        if busy <= max_busy or time.monotonic() > deadline:
            return busy <= max_busy, busy


@dataclass
class CpuMeter:
    """CPU used by named processes, this process and the whole machine between start() and stop()."""

    pids: dict[str, int]
    wall_s: float = 0.0
    cores: dict[str, float] = field(default_factory=dict)  # name -> average cores used
    machine_cores: float = 0.0
    _start: dict[str, float | None] = field(default_factory=dict)
    _t0: float = 0.0
    _jiffies0: tuple[int, int] = (0, 0)
    _self0: float = 0.0

    def start(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._start = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._self0 = _self_cpu()
        self._jiffies0 = machine_jiffies()
        return self

    def stop(self) -> CpuMeter:
        self.wall_s = time.monotonic() - self._t0
        wall = max(self.wall_s, 1e-9)
        for name, pid in self.pids.items():
            before, after = self._start.get(name), process_cpu_seconds(pid)
            if before is not None and after is not None:
                self.cores[name] = (after - before) / wall
        self.cores["bench client"] = (_self_cpu() - self._self0) / wall
        busy1, total1 = machine_jiffies()
        busy0, total0 = self._jiffies0
        self.machine_cores = (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)
        return self

    @property
    def others_cores(self) -> float:
        """Cores used by processes outside the benchmark (machine total minus ours), never below 0."""
        return max(0.0, self.machine_cores - sum(self.cores.values()))

    def summary(self) -> str:
        parts = [f"{name} {value:.2f}" for name, value in self.cores.items()]
        return (", ".join(parts) + f"; machine {self.machine_cores:.2f} of {os.cpu_count()} cores"
                f" (others {self.others_cores:.2f})")


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def top_processes(exclude: Iterable[int] = (), limit: int = 5) -> list[str]:
    """The busiest processes right now per `ps` (for the report when the machine was busy)."""
    out = _run(["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu", "--no-headers"])
    skip = {str(p) for p in exclude} | {str(os.getpid())}
    rows = [line for line in out.splitlines() if line.split(None, 1)[0] not in skip and " ps -eo " not in line]
    return [row[:160] for row in rows[:limit]]


# -- syscalls and context switches (perf stat, when the kernel lets us) ------------------------

PERF_EVENTS = ("raw_syscalls:sys_enter", "context-switches")


class PerfCounter:
    """`perf stat` counting system calls and context switches of some processes (all their threads).

    Counting a tracepoint costs the traced process little (no sampling, no ptrace). Without `perf`, or
    where the kernel refuses it, `counts()` returns None for that process and the report says n/a.
    """

    def __init__(self, pids: dict[str, int], folder: Path) -> None:
        self.pids = pids
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> PerfCounter:
        perf = _which("perf")
        if perf is None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            out = self.folder / f"perf.{name}.csv"
            out.unlink(missing_ok=True)
            self.procs[name] = subprocess.Popen(
                [perf, "stat", "-x,", "-o", str(out), "-e", ",".join(PERF_EVENTS), "-p", str(pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def stop(self) -> dict[str, dict[str, int] | None]:
        """name -> {"syscalls": n, "context_switches": n}, or None where perf did not count."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(2)  # SIGINT: perf stat prints its counts and exits
        result: dict[str, dict[str, int] | None] = {}
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            result[name] = _parse_perf(self.folder / f"perf.{name}.csv")
        return result


def _parse_perf(path: Path) -> dict[str, int] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    counts = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) >= 3 and parts[2] in PERF_EVENTS and parts[0].strip().isdigit():
            counts["syscalls" if parts[2].startswith("raw_syscalls") else "context_switches"] = int(parts[0])
    return counts if len(counts) == 2 else None


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)
