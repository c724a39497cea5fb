"""`python -m bench.verify_cores DIR...`: how much this machine gives a second process, for the verifier's work.

The Spark verifier's scaling target (local[2] at least 1.6x local[1]) is a ratio of
two runs on a shared 2-core VM, and the VM itself does not always give two busy
processes twice the work of one: other tenants, and the host's clocks. This is the
reference for that ratio, measured in the same run as the Spark figures, as the
disk's own fsync rate is for the bookie figures: the same replay tasks the
verifier runs (replay.spark_replay.run_task on the same logs, from their snapshots)
first one after another in one process, then split over two processes that run at
the same time. Scaling = serial seconds / parallel seconds (2.0 is perfect).
Prints one JSON line.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path

from replay.spark_replay import ReplayTask, plan_replays, run_task
from replay.spark_source import parse_dirs
from replay.verify_decode import walk_segment
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR

DEFAULT_TASKS = 8


def sample_tasks(dirs: list[str], count: int) -> list[ReplayTask]:
    """`count` replay tasks spread over the nodes' logs, each from one snapshot to the next."""
    tasks: list[ReplayTask] = []
    for n in parse_dirs(dirs):
        segments = []
        starts: dict[str, tuple[int, ...]] = {}
        for path in sorted((Path(n.path) / TXNLOG_DIR).glob("log.*")):
            layout = walk_segment(path.read_bytes())
            segments.append((layout.first_zxid, str(path)))
            starts[str(path)] = tuple(c.start for c in layout.chunks)
        snaps = sorted(int(p.name.split(".")[1], 16) for p in (Path(n.path) / SNAPSHOT_DIR).glob("snapshot.*"))
        paths = {(n.node, z): str(Path(n.path) / SNAPSHOT_DIR / f"snapshot.{z:016x}") for z in snaps}
        if len(snaps) < 2:
            continue
        # Between snapshots only: every such task replays the same number of txns.
        planned = plan_replays({n.node: segments}, {n.node: snaps}, paths, {n.node: snaps[0]},
                               {n.node: snaps[-1]}, set(snaps), starts)
        tasks += planned[len(planned) // 3:]  # from the middle of the log, not its start
    step = max(1, len(tasks) // count)
    return tasks[::step][:count]


def _run_all(tasks: list[ReplayTask]) -> float:
    started = time.perf_counter()
    for task in tasks:
        run_task(task)
    return time.perf_counter() - started


def measure(dirs: list[str], count: int = DEFAULT_TASKS) -> dict:
    tasks = sample_tasks(dirs, count)
    if len(tasks) < 2:
        raise SystemExit("verify_cores: the logs need at least 2 replay tasks between snapshots")
    tasks = tasks[:len(tasks) // 2 * 2]
    _run_all(tasks[:1])  # warm the page cache and the imports once
    serial = _run_all(tasks)
    halves = [tasks[0::2], tasks[1::2]]
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        each = pool.map(_run_all, halves)
    parallel = time.perf_counter() - started
    return {"tasks": len(tasks), "serial_s": round(serial, 2), "parallel_s": round(parallel, 2),
            "per_process_s": [round(s, 2) for s in each], "scaling": round(serial / parallel, 2)}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1:])))
