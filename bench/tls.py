"""The TLS part of the suite (issue 17, "Measure"): what TLS on every port costs, plain and TLS in one run.

    python -m bench.run --only tls [--quick]      # writes its section into docs/benchmarks.md

Each system runs twice side by side, one copy in plain text and one with TLS on
every port, both up for the whole of its rows:

- Quire: two 3-node clusters of the shipped layout (every node a voter and a
  bookie, client ports speaking ZooKeeper's protocol); the TLS one has a `[tls]` table with
  every switch at its default (mutual TLS on the peer, client and bookie ports)
  and its material from `clusterctl tls init` and `clusterctl tls client bench`.
  Rows: saturated metastore writes (kazoo, bench/kzbench.py's `write-100-128`),
  and pipelined ledger appends E=Qw=Qa=3 of 100 B and 64 KB through the ledger
  SDK in this process (bench/ledger_load.py's `append_window`, the same windows
  as bench/ledger.py's rows), all clients with a certificate of the cluster CA.
- ZooKeeper 3.8 (Debian's jars, bench/zk.py): two 3-server ensembles, both on
  Netty's connection factory so that the ratio is TLS alone; the TLS one serves
  `secureClientPort` only, with `sslQuorum=true`, PEM key stores of an EC P-256
  CA made like Quire's, client certificates required. Row: the same saturated
  kazoo writes, by the same worker processes with kazoo's `use_ssl=True`.

Every row runs `rounds` windows per copy, alternating which copy goes first
(plain, TLS, TLS, plain, ...), so a drift of the shared machine over the run
weighs on both alike; the windows of one copy are pooled. Each row's figure is
TLS/plain, set against issue 17's targets (Quire) or beside them (ZooKeeper).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.steps import recorded_step
from bench import kzbench, ledger, machine, stats, zk
from bench import ledger_load as workloads
from bench.kzbench import QuireSystem, ZkSystem
from bench.ledger_load import Quorum
from bench.quire import TlsFiles
from clusterd import localcluster
from clusterd.ctl.tls_material import issue, make_private_dir, new_authority, write_cert, write_pair, write_secret

REPO = Path(__file__).resolve().parent.parent
PLAIN, TLS = "plain", "TLS"
# The kazoo rows run a third copy: the TLS servers again, driven by kazoo's stock handler (without
# bench/kzworker.py's pending_aware_handler, which every other kazoo copy, plain included, runs).
TLS_STOCK = "TLS, stock kazoo"
QUORUM = Quorum(3, 3, 3)


@dataclass(frozen=True)
class Row:
    key: str
    system: str  # "Quire" | "ZooKeeper"
    title: str
    target: float | None  # TLS/plain at least this (issue 17); None: no target, a reference
    unit: str
    copy: str = TLS  # the copy set against the plain one


METASTORE = "metastore saturated writes (kazoo, 100 B, 4 x 128 outstanding)"
ROWS = (
    Row("metastore", "Quire", METASTORE, 0.8, "writes/s"),
    Row("append-100", "Quire", f"ledger appends 100 B, {QUORUM.label}, 1000 in flight", 0.7, "entries/s"),
    Row("append-65536", "Quire", f"ledger appends 64 KB, {QUORUM.label}, 64 in flight", 0.9, "entries/s"),
    Row("metastore", "ZooKeeper", METASTORE, None, "writes/s"),
    Row("metastore", "Quire", METASTORE + ", TLS with kazoo's stock handler", 0.8, "writes/s", TLS_STOCK),
    Row("metastore", "ZooKeeper", METASTORE + ", TLS with kazoo's stock handler", None, "writes/s", TLS_STOCK),
)
# (row key, entry bytes, appends in flight at most, appends started together): bench/ledger.py's FULL rows.
APPENDS = (("append-100", 100, 1000, 250), ("append-65536", 65536, 64, 16))


@dataclass(frozen=True)
class TlsSizes:
    kz_window_s: float  # each timed kazoo window
    kz_warmup_s: float  # untimed load in each kazoo worker before its window
    jit_warmup_s: float  # one untimed saturating kazoo row per copy before the first window (JIT, caches)
    ledger_window_s: float
    ledger_warmup_s: float
    rounds: int  # windows per row and copy


FULL = TlsSizes(kz_window_s=5.0, kz_warmup_s=1.5, jit_warmup_s=6.0, ledger_window_s=5.0, ledger_warmup_s=1.0,
                rounds=6)
QUICK = TlsSizes(kz_window_s=1.0, kz_warmup_s=0.3, jit_warmup_s=1.0, ledger_window_s=1.0, ledger_warmup_s=0.3,
                 rounds=2)


@dataclass
class Window:
    """One timed window of one row on one copy."""

    ops: int
    window_s: float
    latencies_s: list[float]
    server_cpu_us: float | None  # per operation, the three servers together
    client_cpu_us: float | None  # per operation, the client processes (ledger rows: this process)
    others_cores: float  # cores used by processes outside this copy's servers and clients
    errors: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.window_s if self.window_s else 0.0


@dataclass
class Pooled:
    windows: list[Window]

    @property
    def rate(self) -> float:
        return sum(w.ops for w in self.windows) / sum(w.window_s for w in self.windows)

    def latency_ms(self, q: float) -> float:
        return 1000 * stats.percentile([x for w in self.windows for x in w.latencies_s], q)

    def cpu_us(self, server: bool) -> float | None:
        values = [(w.server_cpu_us if server else w.client_cpu_us, w.ops) for w in self.windows]
        if not values or any(v is None for v, _ in values):
            return None
        return sum(v * n for v, n in values) / max(1, sum(n for _, n in values))  # type: ignore[operator]


@dataclass
class TlsResults:
    sizes: TlsSizes
    quick: bool
    facts: dict[str, str]
    zk_version: str = ""
    negotiated: dict[str, str] = field(default_factory=dict)  # system -> TLS version and cipher on its client port
    windows: dict[tuple[str, str, str], list[Window]] = field(default_factory=dict)  # (system, row, copy)
    failures: list[str] = field(default_factory=list)
    busy_at_start: float = 0.0
    duration_s: float = 0.0

    def pooled(self, system: str, row: str, copy: str) -> Pooled | None:
        windows = [w for w in self.windows.get((system, row, copy), []) if w.window_s and w.ops]
        return Pooled(windows) if windows else None

    def ratio(self, system: str, row: str, copy: str = TLS) -> float | None:
        plain, tls = self.pooled(system, row, PLAIN), self.pooled(system, row, copy)
        return tls.rate / plain.rate if plain and tls and plain.rate else None


def copies_in_round(rnd: int, copies: tuple[str, ...] = (PLAIN, TLS)) -> tuple[str, ...]:
    """The order of the copies in round `rnd`: as given, then reversed, and so on (ABBA), so that a
    steady drift of the machine weighs on every copy alike."""
    return copies if rnd % 2 == 0 else copies[::-1]


# -- ZooKeeper's TLS material ---------------------------------------------------------------------


def zk_material(folder: Path, ids: list[int]) -> tuple[zk.ZkTls, TlsFiles]:
    """An EC P-256 CA as `clusterctl tls init` makes, a PEM key store per server (key and certificate
    in one file, naming 127.0.0.1 for the quorum's hostname verification) and a client certificate."""
    make_private_dir(folder)
    authority = new_authority("zookeeper bench CA")
    ca = folder / "ca.pem"
    write_cert(ca, authority.cert)
    keystores = {}
    for i in ids:
        key, cert = issue(authority, f"zookeeper-{i}", hosts=("127.0.0.1", "localhost"))
        write_pair(folder / f"zk-{i}.key", folder / f"zk-{i}.pem", key, cert)
        keystores[i] = folder / f"zk-{i}.keystore.pem"
        write_secret(keystores[i], (folder / f"zk-{i}.key").read_bytes() + (folder / f"zk-{i}.pem").read_bytes())
    key, cert = issue(authority, "bench")
    write_pair(folder / "client-bench.key", folder / "client-bench.pem", key, cert)
    return zk.ZkTls(keystores, ca), TlsFiles(ca, folder / "client-bench.pem", folder / "client-bench.key")


# -- the part ----------------------------------------------------------------------------------------


class TlsBench:
    """Runs the TLS part in `folder`; `run()` returns the results (a failed step is recorded, not raised)."""

    def __init__(self, folder: Path, sizes: TlsSizes, *, quick: bool, with_zk: bool = True,
                 progress: Callable[[str], None] = print) -> None:
        self.folder = folder
        self.with_zk = with_zk
        self.sizes = sizes
        self.progress = progress
        folder.mkdir(parents=True, exist_ok=True)
        facts = machine.facts(folder, REPO)
        facts["git"] = ledger.git_state(REPO)
        self.results = TlsResults(sizes, quick, facts)

    def run(self) -> TlsResults:
        started = time.monotonic()
        r = self.results
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # the setup clients' reconnects and closes are noise here
        r.busy_at_start = machine.wait_quiet(max_busy=1.0, timeout_s=1.0)[1]  # one sample, no wait
        self._step("Quire, plain and TLS", self._quire)
        if not self.with_zk:
            r.failures.append("ZooKeeper, plain and TLS: not run (--no-zk)")
            r.duration_s = time.monotonic() - started
            return r
        try:
            zk.classpath()
            r.zk_version = zk.version()
            self._step("ZooKeeper, plain and TLS", self._zookeeper)
        except zk.ZkUnavailable as e:
            r.failures.append(f"ZooKeeper, plain and TLS: not run: {e}")
        r.duration_s = time.monotonic() - started
        return r

    def _step(self, name: str, body: Callable[[], Any]) -> Any:
        return recorded_step(name, body, progress=self.progress, failures=self.results.failures,
                             label=f"tls: {name} (load average {os.getloadavg()[0]:.2f})")

    def _quire(self) -> None:
        copies = {PLAIN: QuireSystem(self.folder / "quire-plain"),
                  TLS: QuireSystem(self.folder / "quire-tls", tls=True)}
        try:
            self._start_and_warm(copies)
            self._kazoo_rounds(copies)
            trio.run(self._append_rounds, copies)
        finally:
            for copy, system in copies.items():
                crashed = system.cluster.crashed()
                system.stop()
                for nid, status in crashed.items():
                    self.results.failures.append(
                        f"Quire ({copy}): node {nid} exited with status {status} during the part; its log ends:\n"
                        f"{localcluster.tail(system.cluster.log_path(nid))}")

    def _zookeeper(self) -> None:
        server_tls, client_tls = zk_material(self.folder / "zk-tls-material", [1, 2, 3])
        copies = {PLAIN: ZkSystem(self.folder / "zk-plain", netty=True),
                  TLS: ZkSystem(self.folder / "zk-tls", tls=client_tls, server_tls=server_tls)}
        try:
            self._start_and_warm(copies)
            self._kazoo_rounds(copies)
        finally:
            for system in copies.values():
                system.stop()

    def _start_and_warm(self, copies: dict[str, kzbench.System]) -> None:
        for system in copies.values():
            system.start()
        for copy, system in copies.items():
            self._warm(system, copy)

    def _warm(self, system: kzbench.System, copy: str) -> None:
        """Serving, the bench's znodes, then one untimed saturating row (the JVM's JIT, connections, caches)."""
        system.wait_serving()
        if system.tls is not None:
            self.results.negotiated[system.name] = negotiated(system.ports[system.ids[0]], system.tls.context())
        kzbench._setup(system)  # noqa: SLF001 - the metastore part's own setup, shared on purpose
        load = _saturating()
        row = kzbench.run_load(system, load, self.folder / f"{system.name.lower()}-{copy}" / "clients" / "warm-up",
                               window_s=self.sizes.jit_warmup_s, warmup_s=self.sizes.kz_warmup_s, tls_pending_fix=True)
        self.progress(f"  {system.name} ({copy}) warm-up: {row.rate:,.0f} writes/s")

    def _kazoo_rounds(self, copies: dict[str, kzbench.System]) -> None:
        """Plain, TLS and TLS with kazoo's stock handler (the TLS servers again), in ABBA order."""
        load, s = _saturating(), self.sizes
        for rnd in range(s.rounds):
            for copy in copies_in_round(rnd, (PLAIN, TLS, TLS_STOCK)):
                system = copies[PLAIN if copy == PLAIN else TLS]
                name = f"{system.name} ({copy}) metastore, round {rnd + 1} of {s.rounds}"

                def one(system: kzbench.System = system, copy: str = copy, rnd: int = rnd) -> Window:
                    tag = copy.replace(", ", "-").replace(" ", "-")
                    folder = self.folder / f"{system.name.lower()}-{tag}" / "clients" / f"write-{rnd + 1}"
                    row = kzbench.run_load(system, load, folder, window_s=s.kz_window_s, warmup_s=s.kz_warmup_s,
                                           tls_pending_fix=copy != TLS_STOCK)
                    errors = sum(row.errors.values())
                    return Window(row.ok, row.window_s, row.latencies, row.server_cpu_us_per_op,
                                  row.client_cpu_us_per_op, row.cpu.others_cores, errors,
                                  "; ".join(row.error_samples[:2]))

                self._record(system.name, "metastore", copy, name, one)

    def _record(self, system: str, row: str, copy: str, name: str, measure: Callable[[], Window]) -> None:
        window = self._step(name, measure)
        if window is not None:
            self.results.windows.setdefault((system, row, copy), []).append(window)
            self.progress(f"  {window.rate:,.0f}/s, p50 {1000 * stats.percentile(window.latencies_s, 50):.2f} ms, "
                          f"server CPU {window.server_cpu_us or 0:,.0f} us/op, {window.errors} errors "
                          f"{window.note}".rstrip())

    async def _append_rounds(self, copies: dict[str, QuireSystem]) -> None:
        s = self.sizes
        clusters = {copy: system.cluster for copy, system in copies.items()}
        tls = copies[TLS].tls
        assert tls is not None
        async with workloads.connected(clusters[PLAIN].client_addresses()) as plain, \
                workloads.connected(clusters[TLS].client_addresses(), tls=tls.streams()) as secure:
            ledgers = {PLAIN: plain, TLS: secure}
            for client in ledgers.values():
                await workloads.wait_bookies(client, 3)
            for key, size, in_flight, refill in APPENDS:
                for rnd in range(s.rounds):
                    for copy in copies_in_round(rnd):
                        await ledger.settle()  # the 64 KB rows leave dirty pages the next row would pay for
                        name = f"Quire ({copy}) {key}, round {rnd + 1} of {s.rounds}"
                        window = await self._append_window(ledgers[copy], clusters[copy], size, in_flight, refill)
                        self._record("Quire", key, copy, name, lambda w=window: _raise_or(w))

    async def _append_window(self, client: Any, cluster: Any, size: int, in_flight: int,
                             refill: int) -> Window | str:
        """One timed append window, or the traceback of its failure (recorded by _record)."""
        s = self.sizes
        try:
            run = await workloads.append_window(client, QUORUM, size, in_flight, warmup_s=s.ledger_warmup_s,
                                                window_s=s.ledger_window_s, pids=cluster.pids(), refill=refill)
        except Exception:  # noqa: BLE001 - recorded in the report, the part goes on
            return traceback.format_exc()
        if run.error and not run.acked:
            return f"no append acknowledged: {run.error}"
        others = run.cpu.others_cores if run.cpu is not None else 0.0
        return Window(run.acked, run.window_s, run.latencies_s, run.cpu_us_per_entry(False),
                      run.cpu_us_per_entry(True), others, 1 if run.error else 0, run.error)


def negotiated(port: int, context: ssl.SSLContext) -> str:
    """The TLS version and cipher a client of `context` gets on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                name, version, _ = tls.cipher()  # type: ignore[misc]
                return f"{version}, {name}"
    except OSError as e:
        return f"unknown ({e})"


def _raise_or(window: Window | str) -> Window:
    if isinstance(window, str):
        raise RuntimeError(window)
    return window


def _saturating() -> kzbench.Load:
    return next(x for x in kzbench.loads() if x.key == kzbench.SATURATING)


def run(folder: Path, *, quick: bool, with_zk: bool = True, progress: Callable[[str], None] = print) -> TlsResults:
    return TlsBench(folder, QUICK if quick else FULL, quick=quick, with_zk=with_zk, progress=progress).run()
