"""A clusterd that refuses to start says why and what to do in one line, on stderr and in its
node's log, with an exit status of its own and no traceback (docs/operations.md, "Exit status").

Real nodes on loopback: a 3-node cluster is started, written to and (for most refusals) stopped;
then one node is started alone on a prepared broken state: a txn log corrupt before its end,
snapshots that fail their checks with no log to replay, another bookie's directory, a port held
by another socket, a second daemon on a running node's data directory, TLS material that is
not there, a config with two nodes of one id. A torn log tail is the contrast: it is repaired,
and the node starts.
"""

from __future__ import annotations

import errno
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from clusterd import localcluster
from clusterd.daemon.main import (EXIT_BAD_CONFIG, EXIT_BOOKIE_STORAGE, EXIT_DATA_DIR_IN_USE, EXIT_PORT_UNAVAILABLE,
                                  EXIT_TLS, EXIT_ZAB_STATE, refusal_of)
from edge.sockets import PortUnavailable
from cluster_fixtures import ENV, Cluster, copy_config, kazoo_session, run, start_cluster, wait_for
from zab.storage.record import scan_zxids
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR
from zab.storage.txnlog import SEGMENT_HEADER_BYTES

pytestmark = pytest.mark.multiprocess

ZAB_ADVICE = "wipe this node's Zab state (acceptedEpoch, currentEpoch, txnlog/ and snapshots/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """The shipped 3 nodes (voters and bookies), snapshotting every 10 txns, up, 40 znodes written."""
    path = copy_config(tmp_path_factory.mktemp("refusals"))
    path.write_text(path.read_text().replace("snapshot_every_txns = 50000", "snapshot_every_txns = 10"))
    cluster = start_cluster(Cluster(path))
    try:
        with kazoo_session(cluster) as zk:
            for i in range(40):
                zk.create(f"/refusals-{i}", b"x")
        yield cluster
    finally:
        cluster.down()


def start(cluster: Cluster, node_id: int, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`clusterd --id node_id` in the foreground, its stderr captured (not its log file)."""
    return run("-m", "clusterd.daemon.main", "--id", str(node_id), "--config", str(config or cluster.path),
               cwd=cluster.path.parent)


def assert_refused(done: subprocess.CompletedProcess[str], status: int, *phrases: str, cluster: Cluster | None = None,
                   node_id: int = 0, alone: bool = True) -> None:
    """`done` exited `status` with one line saying why (holding every phrase), no traceback, and that
    line in the node's clusterd.log. `alone`: refused before the node logged anything else; otherwise
    its own key=value records (ts=...) may come first."""
    assert "Traceback" not in done.stderr, done.stderr
    said = done.stderr.splitlines() if alone else [l for l in done.stderr.splitlines() if not l.startswith("ts=")]
    assert len(said) == 1, done.stderr
    [line] = said
    assert line.startswith("clusterd: ") and line.endswith(f"(exit {status})"), line
    for phrase in phrases:
        assert phrase in line, line
    assert done.returncode == status, done.stderr
    if cluster is not None:
        assert line in localcluster.log_path(cluster.config.node(node_id)).read_text().splitlines()


# --- while the cluster runs ---------------------------------------------------------------------

def test_a_second_daemon_on_a_running_nodes_data_directory_is_refused(cluster: Cluster) -> None:
    pid = localcluster.running_pid(cluster.config.node(1))
    done = start(cluster, 1)
    assert_refused(done, EXIT_DATA_DIR_IN_USE, f"node 1 is already running as pid {pid}", "stop it first",
                   cluster=cluster, node_id=1)
    assert localcluster.running_pid(cluster.config.node(1)) == pid  # the running node keeps its pid file


def test_another_bookies_directory_is_refused_once_the_metastore_answers(cluster: Cluster) -> None:
    node = cluster.config.node(3)
    pid = localcluster.running_pid(node)
    localcluster.stop({3: pid}, timeout_s=5)
    localcluster.remove_pid_file(node, pid)
    cookie = node.data_dir / "bookie" / "cookie"
    own = cookie.read_bytes()
    shutil.copyfile(cluster.config.node(2).data_dir / "bookie" / "cookie", cookie)  # the disks were swapped
    try:
        done = start(cluster, 3)
    finally:
        cookie.write_bytes(own)
    # The Zab peer and the client port were up (the bookie read its cookie znode through them).
    assert_refused(done, EXIT_BOOKIE_STORAGE, "bookie 3:", "belongs to bookie 2, not 3", "point each bookie at its own",
                   cluster=cluster, node_id=3, alone=False)


# --- with the cluster stopped -------------------------------------------------------------------

def stopped(cluster: Cluster) -> Cluster:
    cluster.down()
    assert not any(localcluster.running_pid(n) for n in cluster.config.nodes)
    return cluster


def test_another_bookies_directory_is_refused_without_a_quorum_to_ask(cluster: Cluster) -> None:
    """What the directory alone shows (another bookie's cookie) needs no metastore: a node started
    alone, its cluster down, refuses at once rather than wait for a quorum."""
    node = stopped(cluster).config.node(3)
    cookie = node.data_dir / "bookie" / "cookie"
    own = cookie.read_bytes()
    shutil.copyfile(cluster.config.node(2).data_dir / "bookie" / "cookie", cookie)
    try:
        done = start(cluster, 3)
    finally:
        cookie.write_bytes(own)
    assert_refused(done, EXIT_BOOKIE_STORAGE, "bookie 3:", "belongs to bookie 2, not 3", cluster=cluster, node_id=3,
                   alone=False)


def only_segment(cluster: Cluster, node_id: int) -> Path:
    [segment] = (cluster.config.node(node_id).data_dir / TXNLOG_DIR).glob("log.*")
    return segment


def test_a_txn_log_corrupt_before_its_end_is_refused(cluster: Cluster) -> None:
    segment = only_segment(stopped(cluster), 1)
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER_BYTES + 20] ^= 0xFF  # inside the first record's body: valid records follow it
    segment.write_bytes(data)
    done = start(cluster, 1)
    assert_refused(done, EXIT_ZAB_STATE, str(segment), "corrupt record at offset 28 is followed by valid ones",
                   ZAB_ADVICE, cluster=cluster, node_id=1)
    assert segment.read_bytes() == data  # refused, not repaired


def test_snapshots_failing_their_checks_with_no_log_to_replay_are_refused(cluster: Cluster) -> None:
    data_dir = stopped(cluster).config.node(2).data_dir
    snapshots = sorted((data_dir / SNAPSHOT_DIR).glob("snapshot.*"))
    assert snapshots, "40 creates with snapshot_every_txns = 10 left no snapshot"
    for snapshot in snapshots:
        data = bytearray(snapshot.read_bytes())
        data[len(data) // 2] ^= 0xFF
        snapshot.write_bytes(data)
    only_segment(cluster, 2).unlink()  # the log went with a lost disk
    done = start(cluster, 2)
    # Each invalid snapshot is logged (a warning: alone, it would be skipped) before the refusal.
    assert_refused(done, EXIT_ZAB_STATE, "every snapshot in", "and the txn log is empty", ZAB_ADVICE,
                   cluster=cluster, node_id=2, alone=False)


def test_a_torn_log_tail_is_repaired_and_the_node_starts(cluster: Cluster) -> None:
    segment = only_segment(stopped(cluster), 3)
    data = bytearray(segment.read_bytes())
    scan = scan_zxids(data, SEGMENT_HEADER_BYTES)
    *kept, last = scan.txns
    data[scan.valid_end - 1] ^= 0xFF  # the last record's final byte: a write the crash cut short
    segment.write_bytes(data)
    daemon = subprocess.Popen([sys.executable, "-m", "clusterd.daemon.main", "--id", "3", "--config", str(cluster.path)],
                              cwd=cluster.path.parent, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        def status() -> dict | None:
            return trio.run(partial(localcluster.fetch_statuses, cluster.config)).get(3)
        assert wait_for(lambda: status() is not None or daemon.poll() is not None, timeout_s=30)
        assert daemon.poll() is None, daemon.stderr.read()
        assert status()["last_zxid"] == kept[-1] < last  # serving the log up to the record before the torn one
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    finally:
        daemon.kill()
    stderr = daemon.stderr.read()
    assert "truncating corrupt tail" in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("port", ["peer_port", "client_port", "admin_port", "bookie_port"])
def test_a_port_in_use_is_refused(cluster: Cluster, port: str) -> None:
    node = stopped(cluster).config.node(3)
    number = getattr(node, port)
    with socket.socket() as squatter:
        # The stopped node's connections may linger in TIME_WAIT; a listener still holds the port.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((node.host, number))
        squatter.listen()
        done = start(cluster, 3)
    assert_refused(done, EXIT_PORT_UNAVAILABLE, "cannot listen for", f"on {node.bind_host}:{number}",
                   "another process holds it", cluster=cluster, node_id=3)


def test_tls_material_that_is_not_there_is_refused(cluster: Cluster) -> None:
    with_tls = cluster.path.with_name("tls.toml")  # same folder: the same data directories
    with_tls.write_text(cluster.path.read_text() + '\n[tls]\ndir = "no-such-tls"\n')
    done = start(stopped(cluster), 3, with_tls)
    assert_refused(done, EXIT_TLS, "cannot load", "no-such-tls", "clusterctl tls init", cluster=cluster, node_id=3)


def test_a_bad_config_is_refused_before_any_data_directory_is_made(tmp_path: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("id = 3", "id = 2"))
    done = run("-m", "clusterd.daemon.main", "--id", "1", "--config", str(path), cwd=tmp_path)
    assert_refused(done, EXIT_BAD_CONFIG, str(path), "duplicate id 2")
    assert not (tmp_path / "data").exists()


def test_only_refusals_are_refusals_a_bug_beside_one_keeps_its_traceback() -> None:
    port = PortUnavailable("admin", "127.0.0.1", 1, OSError(errno.EADDRINUSE, "Address already in use"))
    assert refusal_of(ExceptionGroup("nursery", [ExceptionGroup("inner", [port])])) == (EXIT_PORT_UNAVAILABLE, str(port))
    assert refusal_of(ExceptionGroup("nursery", [port, ValueError("a bug")])) is None
    assert refusal_of(KeyError("a bug")) is None
