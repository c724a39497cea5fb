"""One kazoo client process of the metastore benchmark: `python -m bench.kzworker '<json spec>'`.

The same program drives Apache ZooKeeper and Quire's metastore: it only speaks
ZooKeeper's client protocol through kazoo, unchanged. Several of these run at
once, because one kazoo process (one connection thread, one callback thread,
one GIL) saturates long before a server does.

Protocol with the parent (bench/kzbench.py), one line each:

    worker -> parent   ready {...}             warm-up done: its acknowledged operations and errors (JSON)
    parent -> worker   go <t0> <t1>            time.monotonic() instants (system-wide on Linux)
    worker -> parent   {"ok": ..., ...}        the result as JSON, once the window closed

Only operations that complete inside [t0, t1] are counted, so the throughput of
all workers adds up over the same window the parent measures server CPU in.

Operations (spec "op"):
    write   set() of `value_bytes` to /bench/k<i % keys>, `outstanding` set_async calls in flight
            (1 outstanding: plain blocking set(), the synchronous write)
    read    get() of the same znodes, `outstanding` get_async calls in flight
    cas     increment /bench/counter: get(), then set(version=stat.version), retried on BadVersion;
            one increment at a time; latency is per acknowledged increment, retries included
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from typing import Any

ROOT = "/bench"
COUNTER = f"{ROOT}/counter"
MAX_LATENCIES = 50_000
MAX_ERROR_SAMPLES = 3
DRAIN_TIMEOUT_S = 15.0


class Tally:
    """Completions inside the window, with their latencies; errors by type."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.t0 = self.t1 = 0.0
        self.ok = 0  # inside the window
        self.total_ok = 0  # whenever (CAS: every acknowledged increment, for the final check)
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.retries = 0
        self.bad_reads = 0

    def success(self, started: float, done: float) -> None:
        with self.lock:
            self.total_ok += 1
            if self.t0 <= done <= self.t1:
                self.ok += 1
                if len(self.latencies) < MAX_LATENCIES:
                    self.latencies.append(done - started)

    def failure(self, error: BaseException, done: float) -> None:
        with self.lock:
            if self.t0 <= done <= self.t1 or not self.t0:
                name = type(error).__name__
                self.errors[name] += 1
                if len(self.error_samples) < MAX_ERROR_SAMPLES:
                    self.error_samples.append(f"{name}: {error}")

    def result(self) -> dict[str, Any]:
        return {"ok": self.ok, "total_ok": self.total_ok, "latencies": self.latencies, "errors": dict(self.errors),
                "error_samples": self.error_samples, "retries": self.retries, "bad_reads": self.bad_reads}


def main() -> int:
    spec = json.loads(sys.argv[1])
    # kazoo's warnings (dropped connections, reconnects) go to this process's stderr, a file the suite scans.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kazoo.client import KazooClient

    # spec "kazoo": TLS arguments (use_ssl, ca, certfile, keyfile, verify_certs) when the server serves TLS;
    # spec "tls_pending_fix": kazoo's connection loop also wakes for bytes already decrypted (see below).
    options = dict(spec.get("kazoo", {}))
    if spec.get("tls_pending_fix"):
        options["handler"] = pending_aware_handler()
    client = KazooClient(hosts=spec["hosts"], timeout=spec.get("session_timeout_s", 10.0), **options)
    client.start(timeout=30)
    try:
        run(client, spec)
    finally:
        client.stop()
        client.close()
    return 0


def pending_aware_handler() -> Any:
    """kazoo's threading handler, whose select() also reports an SSL socket holding decrypted bytes.

    kazoo 2.11's connection loop waits in select() on the raw socket before reading each reply; its
    _read() looks at SSLSocket.pending(), the loop does not. When one TLS record carries several replies
    (a server that writes replies together, as Quire does), the first recv() takes the whole record out
    of the kernel, the socket stops being readable, and the other replies wait for the next record: at
    the end of a burst, for the next ping (a third of the session timeout). ZooKeeper's Netty server
    sends most replies in records of their own, so stock kazoo suffers far less against it."""
    from kazoo.handlers.threading import SequentialThreadingHandler

    class PendingAwareHandler(SequentialThreadingHandler):
        def select(self, rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
            ready = [s for s in rlist if hasattr(s, "pending") and s.pending() > 0]
            if ready:
                return ready, [], []
            return super().select(rlist, wlist, xlist, timeout)

    return PendingAwareHandler()


def run(client: Any, spec: dict[str, Any]) -> None:
    op, outstanding = spec["op"], spec["outstanding"]
    value = b"v" * spec["value_bytes"]
    paths = [f"{ROOT}/k{i}" for i in range(spec["keys"])]
    client.sync(ROOT)  # the parent created the znodes, maybe through another server
    body = {"write": lambda t: _pipelined(client.set_async, paths, value, outstanding, t, None),
            "read": lambda t: _pipelined(client.get_async, paths, None, outstanding, t, len(value)),
            "cas": lambda t: _cas(client, t)}[op]
    if op == "write" and outstanding == 1:
        body = lambda t: _sync_writes(client, paths, value, t)  # noqa: E731

    warmup = Tally()
    warmup.t0, warmup.t1 = time.monotonic(), time.monotonic() + spec["warmup_s"]
    body(warmup)
    print("ready " + json.dumps({"total_ok": warmup.total_ok, "errors": dict(warmup.errors)}), flush=True)
    line = sys.stdin.readline().split()
    if not line or line[0] != "go":
        return
    tally = Tally()
    tally.t0, tally.t1 = float(line[1]), float(line[2])
    while (wait := tally.t0 - time.monotonic()) > 0:
        time.sleep(min(wait, 0.05))
    body(tally)
    print(json.dumps(tally.result()), flush=True)


def _sync_writes(client: Any, paths: list[str], value: bytes, tally: Tally) -> None:
    i = 0
    while (started := time.monotonic()) < tally.t1:
        try:
            client.set(paths[i % len(paths)], value)
        except Exception as e:  # noqa: BLE001 - counted by type in the report
            tally.failure(e, time.monotonic())
        else:
            tally.success(started, time.monotonic())
        i += 1


def _pipelined(call: Any, paths: list[str], value: bytes | None, outstanding: int, tally: Tally,
               expect_len: int | None) -> None:
    """Keep `outstanding` async calls in flight until the window ends, then let them drain."""
    slots = threading.Semaphore(outstanding)

    def completed(started: float, result: Any) -> None:
        done = time.monotonic()
        try:
            if result.successful():
                if expect_len is not None and len(result.value[0]) != expect_len:
                    tally.bad_reads += 1
                tally.success(started, done)
            else:
                tally.failure(result.exception, done)
        finally:
            slots.release()

    i = 0
    while True:
        slots.acquire()
        started = time.monotonic()
        if started >= tally.t1:
            slots.release()
            break
        args = (paths[i % len(paths)],) if value is None else (paths[i % len(paths)], value)
        try:
            result = call(*args)
        except Exception as e:  # noqa: BLE001 - e.g. the session is closed
            tally.failure(e, started)
            slots.release()
            time.sleep(0.01)
            continue
        result.rawlink(lambda r, s=started: completed(s, r))
        i += 1
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    for _ in range(outstanding):  # every slot back: every call completed
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            tally.failure(TimeoutError(f"calls still outstanding {DRAIN_TIMEOUT_S:g} s after the window"),
                          time.monotonic())
            break


def _cas(client: Any, tally: Tally) -> None:
    from kazoo.exceptions import BadVersionError

    while (started := time.monotonic()) < tally.t1:
        while True:
            try:
                data, stat = client.get(COUNTER)
                client.set(COUNTER, str(int(data) + 1).encode(), version=stat.version)
            except BadVersionError:
                tally.retries += 1
                continue
            except Exception as e:  # noqa: BLE001 - counted by type in the report
                tally.failure(e, time.monotonic())
                break
            tally.success(started, time.monotonic())
            break


if __name__ == "__main__":
    sys.exit(main())
