"""One kazoo client process of the large-tree benchmark: `python -m bench.tree_loader '<json spec>'`.

The same program loads Apache ZooKeeper and Quire's metastore (kazoo, unchanged,
over ZooKeeper's client protocol). bench/large_tree.py runs several at once,
because one kazoo process (one connection thread, one callback thread, one GIL)
tops out below what a server takes.

Protocol with the parent, one line each:

    worker -> parent   ready                   connected (the session is open)
    parent -> worker   go
    worker -> parent   {"ok": ..., ...}        the result as JSON, once every call completed

Operations (spec "op"):
    create  create(<parent>/c<j>, `value_bytes`) for every parent in `parents` and j < `children`,
            `window` create_async calls in flight at most (a bounded window)
    set     set(`path`, `value_bytes`) `count` times, `window` set_async calls in flight at most
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

DRAIN_TIMEOUT_S = 120.0
MAX_ERROR_SAMPLES = 3


def child_path(parent: str, j: int) -> str:
    return f"{parent}/c{j:06d}"


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kazoo.client import KazooClient

    client = KazooClient(hosts=spec["hosts"], timeout=spec.get("session_timeout_s", 30.0))
    client.start(timeout=60)
    try:
        print("ready", flush=True)
        line = sys.stdin.readline().split()
        if not line or line[0] != "go":
            return 0
        value = b"v" * spec["value_bytes"]
        if spec["op"] == "create":
            calls = ((client.create_async, (child_path(p, j), value))
                     for p in spec["parents"] for j in range(spec["children"]))
        else:
            calls = ((client.set_async, (spec["path"], value)) for _ in range(spec["count"]))
        result = pipelined(calls, spec["window"])
    finally:
        # Closed before the result goes out: the parent counts transactions, and a session left to
        # expire would commit its closeSession later, in the middle of what it measures next.
        client.stop()
        client.close()
    print(json.dumps(result), flush=True)
    return 0


def pipelined(calls: Iterator[tuple[Any, tuple[Any, ...]]], window: int) -> dict[str, Any]:
    """Every call, at most `window` in flight; the counts, errors by type and the wall time."""
    slots = threading.Semaphore(window)
    lock = threading.Lock()
    ok = 0
    errors: Counter[str] = Counter()
    samples: list[str] = []

    def completed(result: Any) -> None:
        nonlocal ok
        try:
            with lock:
                if result.successful():
                    ok += 1
                else:
                    name = type(result.exception).__name__
                    errors[name] += 1
                    if len(samples) < MAX_ERROR_SAMPLES:
                        samples.append(f"{name}: {result.exception}")
        finally:
            slots.release()

    started = time.time()
    for call, args in calls:
        slots.acquire()
        try:
            result = call(*args)
        except Exception as e:  # noqa: BLE001 - e.g. the session is closed: counted, the load goes on
            with lock:
                errors[type(e).__name__] += 1
                if len(samples) < MAX_ERROR_SAMPLES:
                    samples.append(f"{type(e).__name__}: {e}")
            slots.release()
            continue
        result.rawlink(completed)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    drained = True
    for _ in range(window):  # every slot back: every call completed
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            drained = False
            break
    ended = time.time()
    with lock:
        if not drained:
            errors["NotDrained"] += 1
            samples.append(f"calls still in flight {DRAIN_TIMEOUT_S:g} s after the last was sent")
        return {"ok": ok, "errors": dict(errors), "error_samples": samples, "started": started, "ended": ended}


if __name__ == "__main__":
    sys.exit(main())
