"""The client side of the ledger part (bench/ledger.py): trio workloads against a running cluster.

Every function takes a connected LedgerClient (or the metastore's addresses, to
connect afresh) and returns one result record. The writer and the reader of
each figure are the ledger SDK (ledger/client.py) as an application uses it:
`WriteHandle.start_append` with a bounded window of appends in flight,
`append` one at a time, `ReadHandle.read`, `tail`, and `open(recover=True)`.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench import machine, stats
from bench.ledger_proc import PASSWORD, stamped
from bookie.client import BookiePool
from bookie.entry import Digester, DigestType, master_key
from bookie.registration import list_bookies
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from metastore.client import MetaClient

REPO = Path(__file__).resolve().parent.parent
Hosts = list[tuple[str, int]]


@dataclass(frozen=True)
class Quorum:
    ensemble: int
    write_quorum: int
    ack_quorum: int

    @property
    def label(self) -> str:
        if self.ensemble == self.write_quorum == self.ack_quorum:
            return f"E=Qw=Qa={self.ensemble}"
        return f"E={self.ensemble}, Qw={self.write_quorum}, Qa={self.ack_quorum}"


@dataclass
class AppendRun:
    """Pipelined appends of one entry size through one WriteHandle, counted over a timed window."""

    quorum: Quorum
    size: int
    window: int  # appends in flight at most
    window_s: float
    refill: int  # appends started together once that many are acknowledged
    acked: int = 0  # acknowledged inside the timed window
    latencies_s: list[float] = field(default_factory=list)  # start_append to acknowledgement
    cpu: machine.CpuMeter | None = None
    load_avg: float = 0.0
    error: str = ""
    disk_mb_per_s: float | None = None  # what the data dirs' block device wrote over the timed window

    @property
    def entries_per_s(self) -> float:
        return self.acked / self.window_s

    @property
    def mb_per_s(self) -> float:
        return self.acked * self.size / self.window_s / 1e6

    def latency_ms(self, pct: float) -> float:
        return 1000 * stats.percentile(self.latencies_s, pct)

    def cpu_us_per_entry(self, client: bool) -> float | None:
        """CPU microseconds per acknowledged entry: of the client process, or of the three nodes together."""
        if self.cpu is None or not self.cpu.wall_s or not self.acked:
            return None
        cores = sum(v for k, v in self.cpu.cores.items() if (k == "bench client") == client)
        return 1e6 * cores * self.cpu.wall_s / self.acked

    def cpu_bound_rate(self) -> float | None:
        """Entries/s that all of this machine's CPUs would give at the measured CPU per entry (client and
        nodes), if nothing else ran: the ceiling of a CPU-bound run."""
        client, nodes = self.cpu_us_per_entry(True), self.cpu_us_per_entry(False)
        if client is None or nodes is None or not client + nodes:
            return None
        return (os.cpu_count() or 1) * 1e6 / (client + nodes)


@dataclass
class LatencyRun:
    """Latencies of one kind of operation (append one at a time, tailing delivery), in seconds."""

    name: str
    quorum: Quorum | None  # None: bookie requests without a ledger
    latencies_s: list[float]
    load_avg: float = 0.0
    error: str = ""
    bookies: int = 0  # bare bookie ADDs: to this many bookies at once
    # Tailing rows: the writer's append latency of each entry, in the order of latencies_s.
    acks_s: list[float] = field(default_factory=list)

    def latency_ms(self, pct: float) -> float:
        return 1000 * stats.percentile(self.latencies_s, pct)


@dataclass
class ReadRun:
    quorum: Quorum
    entries: int
    size: int
    elapsed_s: float
    load_avg: float = 0.0

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.elapsed_s

    @property
    def mb_per_s(self) -> float:
        return self.entries * self.size / self.elapsed_s / 1e6


@dataclass
class RecoveryRun:
    mode: str  # "kill": SIGKILLed with appends in flight; "quiet": after its explicit LAC went out
    quorum: Quorum
    acked: int  # appends the writer saw acknowledged before it died
    writer_lac: int
    in_flight: int  # appends the writer had in flight when it died
    bookie_lac: int  # the LAC the bookies knew (read without recovery, before recovering)
    last_entry: int  # the closed ledger's last entry after recovery
    elapsed_s: float
    load_avg: float = 0.0

    @property
    def lost_acknowledged(self) -> bool:
        return self.last_entry < self.writer_lac


@asynccontextmanager
async def connected(hosts: Hosts, tls: Any = None) -> AsyncIterator[LedgerClient]:
    """A LedgerClient with its own metastore session and bookie connections (over TLS with `tls`, a
    clusterd.daemon.tls_streams.ClientTls)."""
    async with MetaClient(hosts, tls=tls) as meta, BookiePool(tls=tls) as pool, LedgerClient(meta, pool) as ledgers:
        yield ledgers


async def wait_bookies(ledgers: LedgerClient, count: int, timeout_s: float = 30.0) -> None:
    with trio.fail_after(timeout_s):
        while len([b for b in await list_bookies(ledgers.meta) if not b.read_only]) < count:
            await trio.sleep(0.05)


async def append_window(ledgers: LedgerClient, quorum: Quorum, size: int, window: int, *, warmup_s: float,
                        window_s: float, pids: dict[str, int], refill: int = 1,
                        data_dir: Path | None = None) -> AppendRun:
    """Keep up to `window` appends in flight for warmup_s + window_s, starting `refill` or more at once
    whenever that many have been acknowledged; count those acknowledged in the timed window (and, given
    `data_dir`, the bytes its block device wrote meanwhile)."""
    run = AppendRun(quorum, size, window, window_s, refill)
    w = await ledgers.create(quorum.ensemble, quorum.write_quorum, quorum.ack_quorum, password=PASSWORD)
    payload = os.urandom(size)
    in_flight: collections.deque = collections.deque()
    clock = time.perf_counter
    t0 = clock() + warmup_s
    t1 = t0 + window_s
    disk0 = None
    try:
        with trio.fail_after(warmup_s + window_s + 60):
            while True:
                now = clock()
                if run.cpu is None and now >= t0:
                    run.cpu, run.load_avg = machine.CpuMeter(pids).start(), os.getloadavg()[0]
                    disk0 = machine.disk_bytes_written(data_dir) if data_dir else None
                if now < t1 and len(in_flight) <= window - refill:
                    while len(in_flight) < window:
                        in_flight.append((w.start_append(payload), now))
                if not in_flight:
                    break
                pending, started = in_flight.popleft()
                await pending.result()
                done = clock()
                if t0 <= done < t1:
                    run.acked += 1
                    run.latencies_s.append(done - started)
                elif done >= t1 and run.cpu is not None and not run.cpu.wall_s:
                    run.cpu.stop()
                    disk1 = machine.disk_bytes_written(data_dir) if data_dir else None
                    if disk0 is not None and disk1 is not None:
                        run.disk_mb_per_s = (disk1 - disk0) / run.cpu.wall_s / 1e6
            with trio.fail_after(30):
                await w.close()
    except (LedgerError, trio.TooSlowError) as e:
        run.error = f"{type(e).__name__}: {e}"
    return run


async def one_at_a_time(ledgers: LedgerClient, quorum: Quorum, size: int, count: int, warmup: int) -> LatencyRun:
    """`append` awaited one after the other: the latency of one append at low load."""
    w = await ledgers.create(quorum.ensemble, quorum.write_quorum, quorum.ack_quorum, password=PASSWORD)
    payload = os.urandom(size)
    run = LatencyRun(f"append {size} B, 1 outstanding", quorum, [], os.getloadavg()[0])
    try:
        with trio.fail_after(60 + count * 0.05):
            for i in range(warmup + count):
                started = time.perf_counter()
                await w.append(payload)
                if i >= warmup:
                    run.latencies_s.append(time.perf_counter() - started)
            await w.close()
    except (LedgerError, trio.TooSlowError) as e:
        run.error = f"{type(e).__name__}: {e}"
    return run


async def bookie_round_trip(ledgers: LedgerClient, bookies: list[int], count: int, warmup: int) -> LatencyRun:
    """The floor under an append at low load: a 100 B ADD sent straight through the SDK's BookiePool to
    `bookies` at once (encoded once, as the writer does), awaited on all of them, one at a time; no writer.
    The entries go to a real ledger, created and closed empty first (its metadata exists, so the bookies'
    garbage collector keeps them; a made-up ledger id would be a bookie-side anomaly of its own)."""
    empty = await ledgers.create(1, 1, 1, password=PASSWORD)
    await empty.close()
    ledger_id = empty.ledger_id
    key, digester = master_key(PASSWORD), Digester(DigestType.CRC32C, PASSWORD)
    payload = os.urandom(100)
    names = ", ".join(str(b) for b in bookies)
    at_once = f"s {names} at once" if len(bookies) > 1 else f" {names}"
    run = LatencyRun(f"bare 100 B ADD to bookie{at_once}, 1 outstanding (no ledger)", None, [],
                     os.getloadavg()[0], bookies=len(bookies))
    with trio.fail_after(60 + count * 0.05):
        for entry_id in range(warmup + count):
            data = digester.package(ledger_id, entry_id, entry_id - 1, 100 * (entry_id + 1), payload)
            started = time.perf_counter()
            for pending in ledgers.pool.start_add(bookies, ledger_id, entry_id, key, data):
                await pending.result()
            if entry_id >= warmup:
                run.latencies_s.append(time.perf_counter() - started)
    return run


async def tail_latency(ledgers: LedgerClient, hosts: Hosts, quorum: Quorum, *, count: int, warmup: int,
                       gap_s: float, log: Path) -> LatencyRun:
    """Append to delivery at a tailing reader in another process (bench/ledger_proc.py tail).

    The writer appends one entry at a time (awaiting each), `gap_s` apart; each payload carries the
    perf_counter of its start_append, the reader subtracts it from the time the entry reached it."""
    name = "tail, back-to-back appends" if not gap_s else f"tail, one append every {1000 * gap_s:g} ms"
    run = LatencyRun(name, quorum, [], os.getloadavg()[0])
    w = await ledgers.create(quorum.ensemble, quorum.write_quorum, quorum.ack_quorum, password=PASSWORD)
    for _ in range(warmup):  # delivered at once when the reader starts; not counted
        await w.append(stamped(100))
    proc = _spawn_tailer(hosts, w.ledger_id, log)
    try:
        with trio.fail_after(30):
            ready = await trio.to_thread.run_sync(proc.stdout.readline)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the tailing reader did not start (said {ready!r}); its stderr ends:\n{_tail_of(log)}")
        with trio.fail_after(60 + count * (0.05 + gap_s)):
            for _ in range(count):
                started = time.perf_counter()
                await w.append(stamped(100))
                run.acks_s.append(time.perf_counter() - started)
                if gap_s:
                    await trio.sleep(gap_s)
            await w.close()
        out, _ = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
        run.latencies_s = json.loads(out.decode().strip().splitlines()[-1])[warmup:]
    except (LedgerError, trio.TooSlowError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
        run.error = f"{type(e).__name__}: {e}; the reader's stderr ends: {_tail_of(log, 3)!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return run


def _tail_of(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(nothing)"


def _spawn_tailer(hosts: Hosts, ledger_id: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "bench.ledger_proc", "tail", "--hosts", json.dumps(hosts),
                                 "--ledger", str(ledger_id)], cwd=REPO, stdout=subprocess.PIPE, stderr=err)


async def catch_up(ledgers: LedgerClient, hosts: Hosts, quorum: Quorum, *, entries: int, size: int,
                   chunk: int = 2048) -> ReadRun:
    """Fill a ledger with `entries` entries and close it, then read it from the start through a fresh client."""
    w = await ledgers.create(quorum.ensemble, quorum.write_quorum, quorum.ack_quorum, password=PASSWORD)
    payload = os.urandom(size)
    with trio.fail_after(120 + entries * 0.01):
        in_flight: collections.deque = collections.deque()
        for _ in range(entries):
            if len(in_flight) >= 1000:
                await in_flight.popleft().result()
            in_flight.append(w.start_append(payload))
        for pending in in_flight:
            await pending.result()
        await w.close()
    async with connected(hosts) as fresh:
        r = await fresh.open(w.ledger_id, PASSWORD)
        load = os.getloadavg()[0]
        read = 0
        started = time.perf_counter()
        with trio.fail_after(120 + entries * 0.01):
            for first in range(0, entries, chunk):
                got = await r.read(first, min(entries, first + chunk) - 1)
                read += len(got)
        elapsed = time.perf_counter() - started
    assert read == entries, (read, entries)
    return ReadRun(quorum, entries, size, elapsed, load)


async def recovery(hosts: Hosts, quorum: Quorum, *, entries: int, window: int, mode: str, log: Path) -> RecoveryRun:
    """A writer process appends `entries` and dies without closing (bench/ledger_proc.py writer); then
    open(recover=True) from this process, timed. The bookies' LAC is read first (no recovery), which
    also opens the connections, so the timed part is recovery itself."""
    command = [sys.executable, "-m", "bench.ledger_proc", "writer", "--hosts", json.dumps(hosts),
               "--entries", str(entries), "--window", str(window), "--mode", mode, "--ensemble",
               str(quorum.ensemble), "--write-quorum", str(quorum.write_quorum), "--ack-quorum", str(quorum.ack_quorum)]
    with log.open("ab") as err:
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=err, timeout=120, check=False))
    if done.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the writer process ended with status {done.returncode}, not SIGKILL; its stderr "
                           f"ends:\n{_tail_of(log)}")
    lines = dict(line.split(" ", 1) for line in done.stdout.decode().splitlines())
    ledger_id = int(lines["ledger"])
    acked, writer_lac, _, in_flight = lines["acked"].split()
    async with connected(hosts) as fresh:
        before = await fresh.open(ledger_id, PASSWORD)
        load = os.getloadavg()[0]
        started = time.perf_counter()
        with trio.fail_after(60):
            r = await fresh.open(ledger_id, PASSWORD, recover=True)
        elapsed = time.perf_counter() - started
    return RecoveryRun(mode, quorum, int(acked), int(writer_lac), int(in_flight), before.lac, r.last_entry,
                       elapsed, load)
