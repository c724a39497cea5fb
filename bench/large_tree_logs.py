"""The servers' logs for bench/large_tree.py: the lines gained since a point (`LogTail`), their timestamps,
and what they say about roles, loading at a restart, a resync and ZooKeeper's snapshots."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from bench.large_tree_results import _mib
from bench.large_tree_systems import QuireSystem, System


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

    def take(self) -> list[str]:
        """The whole lines gained since the last take, and the point moved past them: a line
        written while we read is read next time, never skipped."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data.rfind(b"\n") + 1
        self.offset += whole
        return data[:whole].decode(errors="replace").splitlines()


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


def _zk_snapshotting(lines: list[str], after: int) -> tuple[int, int, str] | None:
    """The first `Snapshotting: 0x<zxid> to <file>` line past `after`: (index, zxid, file)."""
    for n, line in enumerate(lines):
        m = re.search(r"Snapshotting: 0x([0-9a-f]+) to (\S+)", line)
        if m and int(m[1], 16) > after:
            return n, int(m[1], 16), m[2]
    return None


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
