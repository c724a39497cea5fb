"""A throw-away Quire cluster for one benchmark: its own cluster.toml, free ports, temp data dirs.

The shipped cluster.toml is copied into the benchmark's folder with fresh
ports; its relative data directories then resolve inside that folder. Nodes
are started with clusterd's own `localcluster.spawn` (their output goes to
`<data_dir>/clusterd.log`) and are children of this process, so a SIGKILLed
node is reaped at once. `bookies=False` runs the same nodes as voters only
(the Zab-layer benchmarks); `observers=N` adds N nodes with the observer role
only, ids 4 and up (the read-scaling benchmark, bench/observers.py).

`tls=True` adds a `[tls]` table with every switch at its default (peer, client
and bookie ports all mutual TLS) and makes the material as an operator would
(`clusterctl tls init`, then `clusterctl tls client bench` for the benchmark's
clients); `TlsFiles` hands the client certificate to kazoo, our MetaClient and
BookiePool, and the four-letter words.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bench import processes
from clusterd import config as cfg
from clusterd import localcluster
from clusterd.ctl import tls as tlsctl
from clusterd.daemon.admin import AdminUnavailable, fetch_status
from clusterd.tls_context import client_context
from clusterd.daemon.tls_streams import ClientTls

BENCH_CLIENT = "bench"  # the client certificate's name (ACL identity x509:CN=bench)

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TlsFiles:
    """A client's TLS material: the CA it trusts, its certificate and key (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        return client_context(self.ca, self.cert, self.key)

    def kazoo_options(self) -> dict[str, object]:
        """KazooClient's arguments for TLS, as docs/operations.md gives them (JSON-safe, for the workers)."""
        return {"use_ssl": True, "ca": str(self.ca), "certfile": str(self.cert), "keyfile": str(self.key),
                "verify_certs": True}

    def streams(self) -> ClientTls:
        """For our MetaClient and BookiePool (`tls=`)."""
        return ClientTls(self.context())


def write_config(folder: Path, *, tls: bool = False, bookies: bool = True, observers: int = 0,
                 metrics: bool = True) -> Path:
    """Copy the shipped cluster.toml into `folder` with fresh ports; every host stays 127.0.0.1.

    `observers`: that many more nodes with the observer role only (`localcluster.extra_node`), with
    the ids after the shipped nodes'.

    `bookies=False` takes the bookie role (and its port and journal lines) off every node: the Zab-layer
    rows measure the ensemble and its state machine, not bookies, their registrations and the auditor.

    A `client_protocol` line, if the shipped file still has one, is dropped: the key is retired (the
    client port always speaks ZooKeeper's protocol), so the copy never depends on it.
    """
    shipped_path = REPO / "cluster.toml"
    shipped = cfg.load(shipped_path)
    text = shipped_path.read_text()
    for node in shipped.nodes:
        assert node.host == "127.0.0.1", f"benchmarks listen on loopback only, not {node.host}"
    text = localcluster.with_free_ports(text)
    text = re.sub(r"(?m)^client_protocol[ \t]*=.*\n", "", text)
    if not bookies:
        text = _without_bookies(text)
    if not metrics:  # bench/metrics_cost.py's rows without them
        text = text.replace("[cluster]\n", "[cluster]\nmetrics = false\n", 1)
    first = max(n.id for n in shipped.nodes) + 1
    text += "".join(localcluster.extra_node(i, "observer") for i in range(first, first + observers))
    if tls:
        text = text.rstrip("\n") + "\n\n[tls]\n"  # every switch at its default: TLS on every port
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cluster.toml"
    path.write_text(text)
    return path


def _without_bookies(text: str) -> str:
    def roles(m: re.Match[str]) -> str:
        kept = [r for r in json.loads(m[1]) if r != cfg.BOOKIE]  # a TOML array of strings reads as JSON
        return f"roles = {json.dumps(kept)}"

    text = re.sub(r"(?m)^roles = (\[.*\])$", roles, text)
    return re.sub(rf"(?m)^(?:{cfg.BOOKIE_PORT}|{cfg.BOOKIE_JOURNAL_DIR}) = .*\n", "", text)


class QuireCluster:
    """The clusterd processes of one config (the shipped three, plus `observers`); `stop()` (or the context
    manager) ends them all."""

    def __init__(self, folder: Path, *, log_level: str = "info", tls: bool = False, bookies: bool = True,
                 observers: int = 0, metrics: bool = True) -> None:
        self.folder = folder
        self.config = cfg.load(write_config(folder, tls=tls, bookies=bookies, observers=observers, metrics=metrics))
        assert bookies or not any(n.is_bookie for n in self.config.nodes), f"bookies left in {self.config.path}"
        self.client_tls = make_tls_material(self.config) if tls else None
        self._admin_tls = self.client_tls.streams() if self.client_tls else None  # [tls] admin is on too
        self.nodes = {n.id: n for n in self.config.nodes if n.in_ensemble}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.log_level = log_level

    def __enter__(self) -> QuireCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- processes ---------------------------------------------------------------
    def start(self, node_id: int | None = None) -> None:
        """Start one node, or every node that is not running."""
        for nid in [node_id] if node_id is not None else list(self.nodes):
            proc = self.procs.get(nid)
            if proc is None or proc.poll() is not None:
                self.procs[nid] = localcluster.spawn(self.config, self.nodes[nid], log_level=self.log_level)

    def pid(self, node_id: int) -> int:
        return self.procs[node_id].pid

    def pids(self) -> dict[str, int]:
        return {f"node{nid}": p.pid for nid, p in self.procs.items() if p.poll() is None}

    def kill(self, node_id: int) -> None:
        """SIGKILL one node and reap it."""
        processes.kill(self.procs[node_id])

    def stop(self, timeout_s: float = 10.0) -> dict[int, int | None]:
        """SIGTERM every node, SIGKILL after the timeout; returns id -> exit status."""
        processes.stop_all(self.procs.values(), timeout_s)
        return {nid: p.returncode for nid, p in self.procs.items()}

    def crashed(self) -> dict[int, int]:
        """Nodes that exited by themselves (not through kill/stop): id -> exit status."""
        return {nid: p.returncode for nid, p in self.procs.items() if p.returncode is not None}

    # -- addresses -----------------------------------------------------------------
    def client_address(self, node_id: int) -> tuple[str, int]:
        node = self.nodes[node_id]
        return node.host, node.client_port

    def client_addresses(self) -> list[tuple[str, int]]:
        return [self.client_address(nid) for nid in sorted(self.nodes)]

    def log_path(self, node_id: int) -> Path:
        return localcluster.log_path(self.nodes[node_id])

    # -- observation -----------------------------------------------------------------
    async def status(self, node_id: int, *, timeout_s: float = 1.0) -> dict[str, Any] | None:
        node = self.nodes[node_id]
        try:
            return await fetch_status(node.host, node.admin_port, timeout_s=timeout_s, tls=self._admin_tls)
        except AdminUnavailable:
            return None

    async def statuses(self, *, timeout_s: float = 1.0) -> dict[int, dict[str, Any] | None]:
        result: dict[int, dict[str, Any] | None] = {}

        async def one(nid: int) -> None:
            result[nid] = await self.status(nid, timeout_s=timeout_s)

        async with trio.open_nursery() as nursery:
            for nid in self.nodes:
                nursery.start_soon(one, nid)
        return result

    async def wait_all_broadcast(self, *, timeout_s: float = 30.0) -> dict[int, dict[str, Any]]:
        """Until every node is in phase broadcast under one leader of one epoch; returns the statuses."""
        with trio.fail_after(timeout_s):
            while True:
                self._check_alive()
                statuses = await self.statuses()
                if all_in_broadcast(statuses):
                    return statuses  # type: ignore[return-value]
                await trio.sleep(0.02)

    async def leader(self) -> int:
        statuses = await self.wait_all_broadcast()
        return next(nid for nid, s in statuses.items() if s["role"] == "leader")

    def _check_alive(self) -> None:
        for nid, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"node {nid} exited with status {proc.returncode}; "
                                   f"see {self.log_path(nid)}:\n{localcluster.tail(self.log_path(nid))}")


def all_in_broadcast(statuses: dict[int, dict[str, Any] | None]) -> bool:
    """Every node answers, is in phase broadcast, and all agree on one leader and epoch."""
    if any(s is None for s in statuses.values()):
        return False
    live = [s for s in statuses.values() if s is not None]
    leaders = [s["id"] for s in live if s["role"] == "leader"]
    return (len(leaders) == 1 and all(s.get("phase") == "broadcast" for s in live)
            and len({s.get("epoch") for s in live}) == 1
            and all(s["role"] == "leader" or s.get("leader") == leaders[0] for s in live))


def make_tls_material(config: cfg.ClusterConfig) -> TlsFiles:
    """`clusterctl tls init` and `clusterctl tls client bench` for `config` (its [tls] table); the client's files."""
    tls = config.tls
    assert tls is not None, f"{config.path} has no [tls] table"
    with contextlib.redirect_stdout(io.StringIO()):  # their messages are for an operator at a terminal
        tlsctl.init(config, tls)
        tlsctl.client(tls, BENCH_CLIENT)
    return TlsFiles(tls.ca, tls.client_cert(BENCH_CLIENT), tls.client_key(BENCH_CLIENT))
