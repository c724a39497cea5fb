"""Real `clusterd` clusters on loopback for the multi-process tests: a copy of the shipped
cluster.toml with free ports and data directories under a test's folder (so a test can run
beside a developer's cluster), driven through `clusterctl` as an operator would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from clusterd import config as cfg
from clusterd import localcluster

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def copy_config(folder: Path, text_edit: str = "") -> Path:
    """The shipped cluster.toml with fresh ports; its relative data dirs land in `folder`.
    `text_edit` is appended (a [tls] table, say); [cluster] keys go in with
    `path.write_text(path.read_text().replace("[cluster]\\n", "[cluster]\\nkey = value\\n", 1))`."""
    text = localcluster.with_free_ports((REPO / "cluster.toml").read_text())
    path = folder / "cluster.toml"
    path.write_text(text + text_edit)
    return path


def with_quick_bookie_gc(path: Path) -> Path:
    """Garbage collection often and small entry logs in the config at `path`, so that a deleted
    ledger's space comes back within a test."""
    path.write_text(path.read_text().replace(
        "[cluster]\n", "[cluster]\nbookie_gc_interval_ms = 300\nbookie_entry_log_bytes = 65536\n", 1))
    return path


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


class Cluster:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.config = cfg.load(path)

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run("-m", "clusterd.ctl.main", "--config", str(self.path), *args, cwd=self.path.parent, timeout=timeout)

    def status(self) -> list[dict]:
        done = self.ctl("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def pids(self) -> dict[int, int | None]:
        return {n.id: localcluster.read_pid_file(n) for n in self.config.nodes}

    def assert_running(self, pids: dict[int, int | None]) -> None:
        """Every node of `pids` (from pids()) is still the same running process."""
        for node in self.config.nodes:
            assert localcluster.is_clusterd(pids[node.id]), \
                f"node {node.id} exited:\n" + localcluster.tail(localcluster.log_path(node), 40)

    def down(self) -> None:
        """Stop every node, resuming first any a test left SIGSTOPped (so none is left behind)."""
        for node in self.config.nodes:
            pid = localcluster.read_pid_file(node)
            if pid is not None and localcluster.is_clusterd(pid):
                os.kill(pid, signal.SIGCONT)
        self.ctl("down", "--timeout", "5")


def start_cluster(cluster: Cluster, *, timeout: float = 60) -> Cluster:
    up = cluster.ctl("up", timeout=timeout)
    assert up.returncode == 0, up.stdout + up.stderr
    return cluster


def four_node_config(folder: Path) -> Path:
    """The shipped 3 voter+bookie nodes, plus node 4 with the bookie role only."""
    path = copy_config(folder)
    path.write_text(path.read_text() + localcluster.extra_node(4, "bookie"))
    return path


def leader_of(cluster: Cluster) -> int:
    """The node `clusterctl status` shows leading (StopIteration if none does)."""
    return next(r["id"] for r in cluster.status() if r["role"] == "leader")


def bytes_until_closed(s: socket.socket) -> int:
    """Read until the server closes the connection (an EOF or a reset); how many bytes came."""
    got = 0
    try:
        while chunk := s.recv(1 << 20):
            got += len(chunk)
    except ConnectionResetError:
        pass
    return got


def closed_by_server(s: socket.socket) -> bool:
    """Read until the server closes the connection (an EOF or a reset); True once it has. A socket
    timeout (the server holds it open) raises instead."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def hosts(cluster: Cluster, only: int | None = None) -> str:
    nodes = cfg.load(cluster.path).nodes
    return ",".join(f"{n.host}:{n.client_port}" for n in nodes if only is None or n.id == only)


def started_kazoo(cluster: Cluster, only: int | None = None, *, timeout: float = 5, start_timeout_s: float = 20,
                  **options) -> KazooClient:
    """A kazoo client (real kazoo) of the cluster's nodes (or of node `only`), connected; the caller stops it."""
    client = KazooClient(hosts=hosts(cluster, only), timeout=timeout, **options)
    client.start(timeout=start_timeout_s)
    return client


def stop_kazoo(*clients: KazooClient) -> None:
    """Stop and close kazoo clients (their threads end; a stopped one is closed again harmlessly)."""
    for client in clients:
        client.stop()
        client.close()


@contextmanager
def kazoo_session(cluster: Cluster, only: int | None = None, **options) -> Iterator[KazooClient]:
    """started_kazoo, stopped and closed at the end of the block."""
    client = started_kazoo(cluster, only, **options)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def wait_for(predicate, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Iterator[Cluster]:
    """A module's 3-node cluster (sessions may be as short as 1 s), up for its tests."""
    folder = tmp_path_factory.mktemp("zk")
    path = copy_config(folder)
    text = path.read_text().replace("[cluster]\n", "[cluster]\nmin_session_timeout_ms = 1000\n", 1)
    path.write_text(text)
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")
