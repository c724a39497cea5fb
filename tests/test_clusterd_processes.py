"""Real `clusterd` processes on loopback, driven through `clusterctl` like an operator would.

Each test runs its own cluster from a copy of cluster.toml with free ports and
data directories under tmp_path (tests/cluster_fixtures.py), so it can run beside a
developer's cluster.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from cluster_fixtures import ENV, Cluster, copy_config, run, start_cluster
from clusterd import config as cfg
from clusterd import localcluster
from clusterd.localcluster import free_ports
from replay.logs import check_logs_converged
from zab.storage.recovery import TXNLOG_DIR
from zab.storage.txnlog import TxnLog

pytestmark = pytest.mark.multiprocess

@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A copy of the shipped config (the metastore protocol), not started."""
    c = Cluster(copy_config(tmp_path))
    yield c
    c.ctl("down", "--timeout", "5")  # whatever the test did, leave no process behind


@pytest.fixture
def running(cluster: Cluster) -> Cluster:
    return start_cluster(cluster)


def test_connections_reset_on_every_port_end_only_themselves(running: Cluster) -> None:
    """A peer vanishing with a TCP reset (SO_LINGER 0), silent or mid-frame, on the client, peer,
    admin and bookie port of every node: each node keeps running and serving."""
    for node in running.config.nodes:
        for port in node.ports.values():
            for payload in (b"", b"\x00\x00\x00\x30abc", b"GET / HTTP/1.1\r\n"):
                with socket.create_connection((node.host, port)) as s:
                    s.sendall(payload)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    rows = running.status()
    assert all(row["pid"] is not None for row in rows), rows
    assert sorted(row["role"] for row in rows) == ["follower", "follower", "leader"]
    done = running.ctl("create", "/after-resets", "ok")
    assert done.returncode == 0, done.stderr


def test_up_status_down(running: Cluster) -> None:
    rows = running.status()
    assert [row["id"] for row in rows] == [1, 2, 3]
    assert all(set(row) == set(localcluster.STATUS_FIELDS) for row in rows)
    assert sorted(row["role"] for row in rows) == ["follower", "follower", "leader"]
    assert len({row["epoch"] for row in rows}) == 1
    for row, node in zip(rows, running.config.nodes):
        assert row["pid"] == localcluster.read_pid_file(node) and localcluster.is_clusterd(row["pid"])
        assert sorted(row["peers"]) == sorted({1, 2, 3} - {row["id"]})

    table = running.ctl("status").stdout
    assert table.splitlines()[0].split() == ["node", "pid", "role", "epoch", "last_zxid", "last_committed", "peers"]

    down = running.ctl("down")
    assert down.returncode == 0 and down.stdout.count("stopped") == 3, down.stdout
    assert not any(localcluster.is_clusterd(row["pid"]) for row in rows)
    assert not any(localcluster.pid_path(n).exists() for n in running.config.nodes)
    assert [(r["role"], r["pid"]) for r in running.status()] == [("down", None)] * 3


def test_znode_commands_through_clusterctl_put_is_refused_and_a_second_up_is_harmless(running: Cluster) -> None:
    created = running.ctl("create", "/color", "blue")
    assert (created.returncode, created.stdout) == (0, "/color\n"), created.stderr
    got = running.ctl("get", "/color")
    assert (got.returncode, got.stdout, got.stderr.split()[0]) == (0, "blue\n", "version=0")
    stale = running.ctl("set", "/color", "red", "--version", "7")
    assert stale.returncode == 1 and "BadVersion" in stale.stderr
    changed = running.ctl("set", "/color", "red", "--version", "0")
    assert changed.returncode == 0 and changed.stdout.startswith("version=1 "), changed.stdout + changed.stderr
    for expected in ("1\n", "2\n"):
        visits = running.ctl("cas", "/visits", "--increment")
        assert (visits.returncode, visits.stdout) == (0, expected), visits.stderr
    listed = running.ctl("ls", "/")
    assert listed.returncode == 0 and {"color", "visits"} <= set(listed.stdout.split()), listed.stdout
    put = running.ctl("put", "color", "blue")
    assert put.returncode == 2 and "create PATH DATA" in put.stderr
    removed = running.ctl("rm", "/color")
    assert (removed.returncode, removed.stdout) == (0, "deleted /color\n")
    assert running.ctl("get", "/color").returncode == 1
    again = running.ctl("up")
    assert again.returncode == 0 and again.stdout.count("already running") == 3


def test_the_admin_port_answers_only_what_it_knows(running: Cluster) -> None:
    node = running.config.nodes[0]
    for request, status in [(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
                            (b"POST /status HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
                            (b"garbage\r\n\r\n", b"400"), (b"GET /metrics HTTP/1.1\r\n\r\n", b"400"),  # no Host
                            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
                            (b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", b"413"),
                            (b"GET /api/v1/nope HTTP/1.1\r\nHost: x\r\n\r\n", b"404")]:
        with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
            s.sendall(request)
            assert read_until_closed(s).split(b" ")[1] == status
    # A head that never ends is cut off at 8 KiB: answered 431, or reset with the rest unread.
    with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
        s.sendall(b"GET /" + b"a" * 20000)
        try:
            assert read_until_closed(s).split(b" ")[1] == b"431"
        except ConnectionResetError:
            pass


def read_until_closed(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("victim", ["leader", "follower", "all"])
def test_demo_loses_no_acknowledged_write_when_nodes_are_sigkilled(cluster: Cluster, victim: str) -> None:
    # The Spark verifiers have their own tests; the demo runs them over its own files once here.
    verify = [] if victim == "leader" else ["--no-verify"]
    demo = cluster.ctl("demo", "--writes", "300", "--clients", "3", "--kill", victim, "--ledger-entries", "500",
                       *verify, timeout=400)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "verdict: OK: all" in demo.stdout
    assert "ledger verdict: OK" in demo.stdout
    if not verify:
        assert "verify zab: every check passed" in demo.stdout
        assert "verify ledgers: every check passed" in demo.stdout
    assert "SIGKILL node" in demo.stdout and "restarted node" in demo.stdout
    assert "their ephemeral nodes are gone on every node" in demo.stdout
    [demo_config] = cluster.path.parent.glob("data/demo/*/cluster.toml")
    nodes = cfg.load(demo_config).nodes
    assert not any(localcluster.running_pid(n) for n in nodes)
    # Every node's log, read back from disk after the restarts: the same bytes for
    # every zxid, no gap, and the same history on every node.
    logs = {}
    for node in nodes:
        with TxnLog.open(node.data_dir / TXNLOG_DIR) as log:
            logs[node.id] = list(log.read_after(0))
    check_logs_converged(logs)
    assert all(len(txns) > 0 for txns in logs.values())


def test_a_config_naming_the_retired_kv_protocol_is_refused_with_exit_status_2(tmp_path: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("[cluster]\n", '[cluster]\nclient_protocol = "kv"\n', 1))
    for command in (["-m", "clusterd.daemon.main", "--id", "1"], ["-m", "clusterd.ctl.main", "up"]):
        done = run(*command, "--config", str(path), cwd=tmp_path)
        assert done.returncode == 2 and "kv demo protocol was retired" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_clusterd_refuses_a_bad_config_with_exit_status_2(tmp_path: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("id = 3", "id = 2"))
    for command in (["-m", "clusterd.daemon.main", "--id", "1"], ["-m", "clusterd.ctl.main", "up"]):
        done = run(*command, "--config", str(path), cwd=tmp_path)
        assert done.returncode == 2
        assert str(path) in done.stderr and "duplicate id 2" in done.stderr, done.stderr


def test_clusterd_exits_5_when_its_port_is_taken(cluster: Cluster) -> None:
    node = cluster.config.nodes[0]
    with socket.socket() as squatter:
        squatter.bind((node.host, node.admin_port))
        squatter.listen()
        done = run("-m", "clusterd.daemon.main", "--id", "1", "--config", str(cluster.path), cwd=cluster.path.parent)
    assert done.returncode == 5 and f"cannot listen for admin on {node.host}:{node.admin_port}" in done.stderr
    assert not localcluster.pid_path(node).exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_foreground_clusterd_stops_cleanly_on_sigint_and_sigterm(tmp_path: Path, signum: int) -> None:
    peer, client, admin = free_ports(3)
    path = tmp_path / "one.toml"
    path.write_text(f'[[node]]\nid = 7\nhost = "127.0.0.1"\npeer_port = {peer}\nclient_port = {client}\n'
                    f'admin_port = {admin}\nroles = ["voter"]\ndata_dir = "solo"\n')
    config = cfg.load(path)
    daemon = subprocess.Popen([sys.executable, "-m", "clusterd.daemon.main", "--id", "7", "--config", str(path)],
                              cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        trio.run(partial(localcluster.wait_settled, config, list(config.nodes), timeout_s=30))
        assert localcluster.read_pid_file(config.node(7)) == daemon.pid
        daemon.send_signal(signum)
        assert daemon.wait(timeout=30) == 0
    finally:
        daemon.kill()
    assert "stopping" in daemon.stderr.read() and not localcluster.pid_path(config.node(7)).exists()


def test_fresh_ports_are_given_line_by_line_so_two_lines_never_share_one() -> None:
    """Two nodes' lines with one old value each get their own: a free port equal to another node's
    shipped port once made copy_config write one client port for two nodes (a CI failure)."""
    text = "[[node]]\nclient_port = 7\npeer_port = 9\n[[node]]\nclient_port = 7\npeer_port = 9\n"
    renumbered = localcluster.with_free_ports(text)
    ports = [int(line.split(" = ")[1]) for line in renumbered.splitlines() if "_port = " in line]
    assert len(ports) == 4 and len(set(ports)) == 4
    assert renumbered.count("[[node]]") == 2 and min(ports) >= 1024  # the old values are gone
