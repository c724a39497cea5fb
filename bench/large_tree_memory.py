"""Server memory for bench/large_tree.py: VmRSS now (`rss`) and each server's peak RSS per phase
(`PeakSampler`), read from /proc/<pid>/status."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

SAMPLE_S = 0.2


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
