"""Real `clusterd` processes on loopback, driven through `clusterctl` like an operator would.

Each test runs its own cluster from a copy of cluster.toml with free ports and
data directories under tmp_path, so it can run beside a developer's cluster.
Most speak the shipped client protocol (the metastore, "zookeeper"); those that
exercise the key-value demo protocol run on a copy that says client_protocol = "kv".
"""

from __future__ import annotations

import json
import os
import re
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

from clusterd import config as cfg
from clusterd import kvwire, localcluster
from clusterd.kvclient import SyncKVClient
from clusterd.localcluster import free_ports
from replay.logs import check_logs_converged
from zab.recovery import TXNLOG_DIR
from zab.txnlog import TxnLog

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PROTOCOL = cfg.load(REPO / "cluster.toml").client_protocol
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def copy_config(folder: Path, text_edit: str = "", *, client_protocol: str | None = None) -> Path:
    """The shipped cluster.toml with fresh ports; its relative data dirs land in `folder`.

    The shipped `client_protocol` line is left out, so that a caller may put its own
    [cluster] keys after `[cluster]` (test_kazoo and test_metastore_client insert
    `client_protocol = "zookeeper"` there) without a duplicate key. Pass `client_protocol`
    to set it; without it the copy speaks the loader's default, "kv".
    """
    shipped = cfg.load(REPO / "cluster.toml")
    ports = iter(free_ports(4 * len(shipped.nodes)))
    text = (REPO / "cluster.toml").read_text()
    for node in shipped.nodes:
        for key, port in node.ports.items():
            text = text.replace(f"{key} = {port}\n", f"{key} = {next(ports)}\n")
    text = re.sub(r"(?m)^client_protocol = .*\n", "", text)
    if client_protocol is not None:
        setting = f"client_protocol = {json.dumps(client_protocol)}\n"
        text, n = re.subn(r"(?m)^\[cluster\]\n", f"[cluster]\n{setting}", text, count=1)
        assert n == 1, "no [cluster] table in the shipped cluster.toml"
    path = folder / "cluster.toml"
    path.write_text(text + text_edit)
    return path


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


class Cluster:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.config = cfg.load(path)

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run("-m", "clusterd.ctl", "--config", str(self.path), *args, cwd=self.path.parent, timeout=timeout)

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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A copy of the shipped config (the metastore protocol), not started."""
    c = Cluster(copy_config(tmp_path, client_protocol=SHIPPED_PROTOCOL))
    yield c
    c.ctl("down", "--timeout", "5")  # whatever the test did, leave no process behind


@pytest.fixture
def kv_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A copy of the shipped config whose client ports speak the key-value demo protocol."""
    c = Cluster(copy_config(tmp_path, client_protocol="kv"))
    yield c
    c.ctl("down", "--timeout", "5")


@pytest.fixture
def running(cluster: Cluster) -> Cluster:
    return start_cluster(cluster)


@pytest.fixture
def running_kv(kv_cluster: Cluster) -> Cluster:
    return start_cluster(kv_cluster)


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


def test_znode_commands_through_clusterctl_and_put_is_refused(running: Cluster) -> None:
    assert running.config.client_protocol == "zookeeper"
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


def test_put_and_get_through_clusterctl_and_a_second_up_is_harmless(running_kv: Cluster) -> None:
    running = running_kv
    put = running.ctl("put", "color", "blue")
    assert put.returncode == 0 and put.stdout.startswith("ok version=1 "), put.stdout + put.stderr
    cas = running.ctl("put", "color", "red", "--version", "7")
    assert cas.returncode == 1 and "BadVersion" in cas.stderr
    got = running.ctl("get", "color")
    assert (got.returncode, got.stdout, got.stderr.split()[0]) == (0, "blue\n", "version=1")
    again = running.ctl("up")
    assert again.returncode == 0 and again.stdout.count("already running") == 3


def test_a_client_breaking_the_protocol_loses_only_its_own_connection(running_kv: Cluster) -> None:
    node = running_kv.config.nodes[0]
    bad_frames = [struct.pack(">I", 4) + b"nope", struct.pack(">I", 1 << 30), kvwire.encode_frame({"op": "x"})]
    for frame in bad_frames:
        with socket.create_connection((node.host, node.client_port), timeout=10) as s:
            s.sendall(frame)
            response = read_until_closed(s)
        decoder = kvwire.FrameDecoder()
        decoder.feed(response)
        assert decoder.next_message()["error"] == "BadRequest"
        assert decoder.next_message() is None and decoder.buffered == 0  # one answer, then closed
    client = SyncKVClient([(node.host, node.client_port)], retry_for_s=10)
    assert client.put("still", "serving").version == 1
    assert client.get("still").value == "serving"


def test_the_admin_port_answers_only_what_it_knows(running: Cluster) -> None:
    node = running.config.nodes[0]
    for request, status in [(b"GET /nope HTTP/1.1\r\n\r\n", b"404"), (b"POST /status HTTP/1.1\r\n\r\n", b"405"),
                            (b"garbage\r\n\r\n", b"400"), (b"GET /metrics HTTP/1.1\r\n\r\n", b"200")]:
        with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
            s.sendall(request)
            assert read_until_closed(s).split(b" ")[1] == status


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


def test_the_demo_needs_the_metastore_protocol(kv_cluster: Cluster) -> None:
    done = kv_cluster.ctl("demo")
    assert done.returncode == 2 and 'needs client_protocol = "zookeeper"' in done.stderr, done.stderr
    assert not (kv_cluster.path.parent / "data" / "demo").exists()


def test_clusterd_refuses_a_bad_config_with_exit_status_2(tmp_path: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("id = 3", "id = 2"))
    for command in (["-m", "clusterd.main", "--id", "1"], ["-m", "clusterd.ctl", "up"]):
        done = run(*command, "--config", str(path), cwd=tmp_path)
        assert done.returncode == 2
        assert str(path) in done.stderr and "duplicate id 2" in done.stderr, done.stderr


def test_clusterd_refuses_a_bookie_only_node_in_a_kv_cluster(tmp_path: Path) -> None:
    # Bookies register in the metastore, which the kv demo protocol lacks (tests/test_bookie_registration.py
    # runs a bookie-only node in a ZooKeeper-protocol cluster).
    ports = free_ports(4)
    path = copy_config(tmp_path, f"""
[[node]]
id = 4
host = "127.0.0.1"
peer_port = {ports[0]}
client_port = {ports[1]}
admin_port = {ports[2]}
bookie_port = {ports[3]}
roles = ["bookie"]
data_dir = "data/node4"
""")
    done = run("-m", "clusterd.main", "--id", "4", "--config", str(path), cwd=tmp_path)
    assert done.returncode == 2 and 'needs client_protocol = "zookeeper"' in done.stderr, done.stderr


def test_clusterd_exits_1_when_its_port_is_taken(cluster: Cluster) -> None:
    node = cluster.config.nodes[0]
    with socket.socket() as squatter:
        squatter.bind((node.host, node.admin_port))
        squatter.listen()
        done = run("-m", "clusterd.main", "--id", "1", "--config", str(cluster.path), cwd=cluster.path.parent)
    assert done.returncode == 1 and f"cannot listen for admin on {node.host}:{node.admin_port}" in done.stderr
    assert not localcluster.pid_path(node).exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_foreground_clusterd_stops_cleanly_on_sigint_and_sigterm(tmp_path: Path, signum: int) -> None:
    peer, client, admin = free_ports(3)
    path = tmp_path / "one.toml"
    path.write_text(f'[[node]]\nid = 7\nhost = "127.0.0.1"\npeer_port = {peer}\nclient_port = {client}\n'
                    f'admin_port = {admin}\nroles = ["voter"]\ndata_dir = "solo"\n')
    config = cfg.load(path)
    daemon = subprocess.Popen([sys.executable, "-m", "clusterd.main", "--id", "7", "--config", str(path)],
                              cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        trio.run(partial(localcluster.wait_settled, config, list(config.nodes), timeout_s=30))
        assert localcluster.read_pid_file(config.node(7)) == daemon.pid
        daemon.send_signal(signum)
        assert daemon.wait(timeout=30) == 0
    finally:
        daemon.kill()
    assert "stopping" in daemon.stderr.read() and not localcluster.pid_path(config.node(7)).exists()
