"""Write workloads: a fixed number of writes with a fixed number outstanding, timed one by one.

Both systems get the same shape of load: `concurrency` writes in flight at
all times until `writes` have completed, keys `k0..k63` in turn, values of
`value_bytes` ASCII bytes. A warm-up of the same shape runs first and is not
counted (connections, JIT, page cache).

Quire: `concurrency` connections through the project's KVClient (the server
executes one request per connection at a time, so outstanding requests need
connections), spread over the given client ports. ZooKeeper: kazoo
`set_async` pipelined on one session per server, bounded by a semaphore.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import trio

from clusterd.kvclient import KVClient, KVError

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


# -- Quire -----------------------------------------------------------------------


async def quire_writes(addresses: Sequence[tuple[str, int]], *, writes: int, concurrency: int,
                       value_bytes: int, warmup: int,
                       after_warmup: Callable[[], Awaitable[None]] | None = None) -> Outcome:
    """Run `warmup` untimed writes, `after_warmup()`, then `writes` timed ones, `concurrency` in flight."""
    value = "v" * value_bytes
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            KVClient(addresses, start=w, retry_for_s=10.0, request_timeout_s=10.0)) for w in range(concurrency)]
        await _quire_phase(clients, warmup, value, Outcome())
        if after_warmup is not None:
            await after_warmup()
        outcome = Outcome()
        started = time.perf_counter()
        await _quire_phase(clients, writes, value, outcome)
        outcome.elapsed_s = time.perf_counter() - started
    return outcome


async def _quire_phase(clients: list[KVClient], writes: int, value: str, outcome: Outcome) -> None:
    tickets = iter(range(writes))

    async def worker(client: KVClient) -> None:
        for i in tickets:  # shared iterator: each ticket is taken by exactly one worker
            t0 = time.perf_counter()
            try:
                await client.put(key(i), value)
            except KVError as e:
                outcome.failed(e)
            else:
                outcome.latencies_s.append(time.perf_counter() - t0)

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(worker, client)


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
        clients[0].ensure_path("/bench")
        for i in range(KEYS):
            if clients[0].exists(f"/bench/{key(i)}") is None:
                clients[0].create(f"/bench/{key(i)}", value)
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
        result = clients[i % len(clients)].set_async(f"/bench/{key(i)}", value)
        result.rawlink(lambda r, t0=t0: completed(t0, r))
    for _ in range(concurrency):  # every slot back: every write completed
        slots.acquire()
