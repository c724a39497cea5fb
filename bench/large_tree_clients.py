"""kazoo clients for bench/large_tree.py: connect and close, pipelined setData, and the time to a
server's first read after a restart."""

from __future__ import annotations

import time
from typing import Any

from bench.large_tree_systems import SERVING_TIMEOUT_S


def _kazoo(hosts: str, **kwargs: Any) -> Any:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=30.0, **kwargs)
    client.start(timeout=60)
    return client


def _close(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: BLE001 - a client of a server already gone
        pass


def _pipelined_sets(client: Any, path: str, value: bytes, count: int, window: int = 256) -> None:
    """`count` set_async of `path` with `window` in flight; raises the first error."""
    pending = []
    for _ in range(count):
        pending.append(client.set_async(path, value))
        if len(pending) >= window:
            pending.pop(0).get(timeout=120)
    for p in pending:
        p.get(timeout=120)


def _first_read(hosts: str, path: str, t0: float) -> float | None:
    """Seconds from `t0` until a kazoo client of `hosts` alone reads `path` (it retries connecting every
    50 ms, without backoff); None after SERVING_TIMEOUT_S."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=1, max_jitter=0.0, max_delay=0.05)
    client = KazooClient(hosts=hosts, timeout=10.0, connection_retry=retry)
    client.start_async()
    try:
        while time.monotonic() - t0 < SERVING_TIMEOUT_S:
            if client.connected:
                try:
                    client.get(path)
                    return time.monotonic() - t0
                except Exception:  # noqa: BLE001 - not serving yet, or the connection dropped: try again
                    pass
            time.sleep(0.02)
        return None
    finally:
        _close(client)
