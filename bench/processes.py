"""Stopping the server processes a benchmark started (Quire's nodes and ZooKeeper's alike)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL one process and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_all(procs: Iterable[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM every process still running, then SIGKILL whatever outlives the shared timeout."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
