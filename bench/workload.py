"""Write workloads: a fixed number of writes with a fixed number outstanding, timed one by one.

Both systems get the same shape of load, through the same protocol
(ZooKeeper's client protocol): `concurrency` writes in flight at all times
until `writes` have completed, each a setData of `value_bytes` ASCII bytes to
one of the znodes /bench/k0../bench/k63 in turn (created beforehand with
that value, untimed), write i on session i mod the number of sessions, one
session per given server. A warm-up of the same shape runs first and is not
counted (connections, JIT, page cache).

Quire: the project's trio client, metastore.client.MetaClient, `concurrency`
tasks each awaiting one `set` at a time, pipelined on the sessions.
ZooKeeper: kazoo `set_async` pipelined on the sessions, bounded by a semaphore.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import trio

from metastore.client import MetaClient
from metastore.errors import NodeExists, ZooKeeperError

ROOT = "/bench"
KEYS = 64
MAX_ERROR_SAMPLES = 5


@dataclass
class Outcome:
    """What one timed phase produced: per-write latencies of the successes, errors by type."""

    elapsed_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)

    def failed(self, error: BaseException) -> None:
        self.errors[type(error).__name__] += 1
        if len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(f"{type(error).__name__}: {error}")

    @property
    def ok(self) -> int:
        return len(self.latencies_s)


def key(i: int) -> str:
    return f"k{i % KEYS}"


def path(i: int) -> str:
    """The znode write i sets."""
    return f"{ROOT}/{key(i)}"


# -- Quire -----------------------------------------------------------------------


async def quire_writes(addresses: Sequence[tuple[str, int]], *, writes: int, concurrency: int,
                       value_bytes: int, warmup: int,
                       after_warmup: Callable[[], Awaitable[None]] | None = None) -> Outcome:
    """Run `warmup` untimed writes, `after_warmup()`, then `writes` timed ones, `concurrency` in flight."""
    value = b"v" * value_bytes
    async with AsyncExitStack() as stack:
        # One session per server, as kazoo gets below: MetaClient pipelines, so the outstanding
        # writes need no connections of their own.
        clients = [await stack.enter_async_context(MetaClient([a], session_timeout_ms=10_000)) for a in addresses]
        await _create_keys(clients, value)
        await _quire_phase(clients, warmup, concurrency, value, Outcome())
        if after_warmup is not None:
            await after_warmup()
        outcome = Outcome()
        started = time.perf_counter()
        await _quire_phase(clients, writes, concurrency, value, outcome)
        outcome.elapsed_s = time.perf_counter() - started
    return outcome


async def _create_keys(clients: list[MetaClient], value: bytes) -> None:
    await clients[0].ensure_path(ROOT)
    for i in range(KEYS):
        try:
            await clients[0].create(path(i), value)
        except NodeExists:
            pass
    for client in clients[1:]:  # the znodes were created through another server
        await client.sync(ROOT)


async def _quire_phase(clients: list[MetaClient], writes: int, concurrency: int, value: bytes,
                       outcome: Outcome) -> None:
    tickets = iter(range(writes))

    async def worker() -> None:
        for i in tickets:  # shared iterator: each ticket is taken by exactly one worker
            t0 = time.perf_counter()
            try:
                await clients[i % len(clients)].set(path(i), value)
            except ZooKeeperError as e:
                outcome.failed(e)
            else:
                outcome.latencies_s.append(time.perf_counter() - t0)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


# -- ZooKeeper ---------------------------------------------------------------------


def zk_writes(hosts: Sequence[str], *, writes: int, concurrency: int, value_bytes: int, warmup: int,
              after_warmup: Callable[[], None] | None = None) -> Outcome:
    """The same workload against ZooKeeper: one kazoo session per entry of `hosts`, requests round-robin."""
    from kazoo.client import KazooClient  # optional dependency: only needed for the reference runs

    value = b"v" * value_bytes
    clients = [KazooClient(hosts=h, timeout=10.0) for h in hosts]
    try:
        for c in clients:
            c.start(timeout=30)
        clients[0].ensure_path(ROOT)
        for i in range(KEYS):
            if clients[0].exists(path(i)) is None:
                clients[0].create(path(i), value)
        _zk_phase(clients, warmup, concurrency, value, Outcome())
        if after_warmup is not None:
            after_warmup()
        outcome = Outcome()
        started = time.perf_counter()
        _zk_phase(clients, writes, concurrency, value, outcome)
        outcome.elapsed_s = time.perf_counter() - started
        return outcome
    finally:
        for c in clients:
            c.stop()
            c.close()


def _zk_phase(clients: list, writes: int, concurrency: int, value: bytes, outcome: Outcome) -> None:
    """Keep `concurrency` set_async calls in flight; completions are timed in kazoo's callback thread."""
    slots = threading.Semaphore(concurrency)
    lock = threading.Lock()

    def completed(t0: float, result) -> None:  # noqa: ANN001 - kazoo's IAsyncResult
        elapsed = time.perf_counter() - t0
        with lock:
            if result.successful():
                outcome.latencies_s.append(elapsed)
            else:
                outcome.failed(result.exception)
        slots.release()

    for i in range(writes):
        slots.acquire()
        t0 = time.perf_counter()
        result = clients[i % len(clients)].set_async(path(i), value)
        result.rawlink(lambda r, t0=t0: completed(t0, r))
    for _ in range(concurrency):  # every slot back: every write completed
        slots.acquire()
