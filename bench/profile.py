"""Where the Quire leader spends its CPU under many outstanding writes: py-spy, folded into top functions.

py-spy samples the leader from outside (`py-spy record --nonblocking`, no
change to the node) while the same many-outstanding workload as the
throughput benchmark runs against a fresh cluster. Only samples where a
thread was running count (py-spy drops idle threads by default), so the
shares are shares of the leader's CPU time, not of wall time.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench import workload
from bench.quire import QuireCluster
from bench.throughput import Spec

SAMPLE_RATE_HZ = 200
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
# Areas of the code a frame can belong to, by file path fragment: first match wins.
AREAS = (("json", "json/"), ("zab codec", "zab/codec"), ("zab core", "zab/"), ("clusterd", "clusterd/"),
         ("metastore jute", "metastore/jute"), ("metastore tree", "metastore/tree"), ("metastore", "metastore/"),
         ("trio", "trio/"), ("logging", "logging/"), ("socket/selectors", "socket"),
         ("threading", "threading"), ("crc32c", "crc32c"))


class ProfilerUnavailable(Exception):
    pass


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise ProfilerUnavailable("py-spy not found: `pip install py-spy` into the benchmark's environment")
    return found


@dataclass
class Profile:
    mode: str  # "active" (every non-idle thread) or "gil" (the thread holding the GIL)
    leader: str
    samples: int
    self_counts: Counter[str] = field(default_factory=Counter)
    total_counts: Counter[str] = field(default_factory=Counter)
    area_self: Counter[str] = field(default_factory=Counter)

    def share(self, count: int) -> float:
        return 100.0 * count / self.samples if self.samples else 0.0


@dataclass
class LeaderCpu:
    """The leader's CPU while it was profiled: user (Python, libraries) and system (syscalls) time."""

    wall_s: float
    user_s: float
    system_s: float


@dataclass
class Run:
    profiles: list[Profile]
    cpu: LeaderCpu
    throughput: float
    spy_log: str
    follower: Profile | None = None  # the metastore part also samples one follower (GIL holder only)
    follower_cpu: LeaderCpu | None = None


def run(folder: Path, spec: Spec) -> Run:
    binary = py_spy()
    with QuireCluster(folder, bookies=False) as cluster:
        cluster.start()
        return trio.run(_profile, cluster, spec, binary, folder)


async def _profile(cluster: QuireCluster, spec: Spec, binary: str, folder: Path) -> Run:
    leader = await cluster.leader()
    pid = cluster.pid(leader)
    spies: dict[str, subprocess.Popen[bytes]] = {}
    cpu_before: list[tuple[float, float, float]] = []

    async def start() -> None:
        spies.update(start_spies(binary, pid, folder))
        await trio.sleep(0.5)  # py-spy attaches before the timed phase starts
        cpu_before.append((time.monotonic(), *user_system(pid)))

    outcome = await workload.quire_writes(cluster.client_addresses(), writes=spec.writes,
                                          concurrency=spec.concurrency, value_bytes=spec.value_bytes,
                                          warmup=spec.warmup, after_warmup=start)
    t1, user1, system1 = time.monotonic(), *user_system(pid)
    profiles, logs = await trio.to_thread.run_sync(stop_spies, spies, folder, f"node{leader}")
    t0, user0, system0 = cpu_before[0]
    return Run(profiles, LeaderCpu(t1 - t0, user1 - user0, system1 - system0),
               outcome.ok / outcome.elapsed_s if outcome.elapsed_s else 0.0, logs)


MODES = {"active": [], "gil": ["--gil"]}


def start_spies(binary: str, pid: int, folder: Path, *, modes: tuple[str, ...] = tuple(MODES),
                prefix: str = "leader") -> dict[str, subprocess.Popen[bytes]]:
    """py-spy samplers on `pid`, one per mode (every non-idle thread; the GIL holder), raw output in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    spies = {}
    for mode in modes:
        command = [binary, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ), "--nonblocking",
                   "--format", "raw", "--output", str(folder / f"{prefix}.{mode}.txt"), *MODES[mode]]
        with open(folder / f"py-spy.{prefix}.{mode}.log", "wb") as sink:
            spies[mode] = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    return spies


def stop_spies(spies: dict[str, subprocess.Popen[bytes]], folder: Path, node: str, *,
               prefix: str = "leader") -> tuple[list[Profile], str]:
    """SIGINT the samplers (py-spy writes its output on Ctrl-C), fold what they wrote; (profiles, their logs)."""
    for spy in spies.values():
        spy.send_signal(signal.SIGINT)
    for spy in spies.values():
        spy.wait()
    profiles = []
    for mode in spies:
        out = folder / f"{prefix}.{mode}.txt"
        profiles.append(fold(out.read_text() if out.exists() else "", node, mode))
    logs = "".join((folder / f"py-spy.{prefix}.{mode}.log").read_text(errors="replace") for mode in spies)
    return profiles, logs


def user_system(pid: int) -> tuple[float, float]:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(parts[11]) / ticks, int(parts[12]) / ticks


def fold(raw: str, leader: str, mode: str = "active") -> Profile:
    """Collapsed stacks ("f1;f2;... count" per line) -> self and inclusive counts per function."""
    profile = Profile(mode, leader, 0)
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames:
            continue
        profile.samples += count
        profile.self_counts[frames[-1]] += count
        for name in set(frames):
            profile.total_counts[name] += count
        profile.area_self[area(frames[-1])] += count
    return profile


def _function(frame: str) -> str:
    """'set (metastore/client/__init__.py:112)' -> 'set (metastore/client/__init__.py)': lines merged per function."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m['func']} ({_short(m['file'])})"


def _short(path: str) -> str:
    """A path relative to site-packages, the stdlib or the repository, whichever applies."""
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def area(function: str) -> str:
    for name, fragment in AREAS:
        if fragment in function:
            return name
    return "other"
