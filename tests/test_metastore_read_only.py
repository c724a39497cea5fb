"""Read-only mode as ZooKeeper serves it (issue 19), on three real nodes with real kazoo: a node cut
off from its quorum (the other two SIGSTOPped) keeps serving reads to sessions that asked for
read-only mode, refuses their writes with NotReadOnly, answers `isro` with `ro`, sends its
read-write sessions away, and hands the read-only clients back to read-write service once the
quorum is back."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NotReadOnlyCallError
from kazoo.protocol.states import KazooState, KeeperState

from cluster_fixtures import Cluster, copy_config, hosts, kazoo_session, leader_of, start_cluster, stop_kazoo, wait_for

pytestmark = pytest.mark.multiprocess


def isro(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"isro")
        return s.recv(16)


def test_a_node_without_quorum_serves_read_only_sessions_and_hands_them_back(tmp_path):
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("[cluster]\n", "[cluster]\nread_only_mode = true\n", 1))
    cluster = start_cluster(Cluster(path))
    pids = cluster.pids()
    try:
        with kazoo_session(cluster) as setup:
            setup.create("/ro", b"v1")
        alone = next(n for n in cluster.config.nodes if n.id != leader_of(cluster))
        others = [pids[n.id] for n in cluster.config.nodes if n.id != alone.id]
        ro = KazooClient(hosts=hosts(cluster, alone.id), timeout=10, read_only=True)
        rw = KazooClient(hosts=hosts(cluster, alone.id), timeout=10)
        ro.start(timeout=20)
        rw.start(timeout=20)
        try:
            ro.sync("/ro")
            assert ro.get("/ro")[0] == b"v1" and ro.client_state == KeeperState.CONNECTED
            assert isro(alone.client_port) == b"rw"
            for pid in others:
                os.kill(pid, signal.SIGSTOP)
            assert wait_for(lambda: ro.client_state == KeeperState.CONNECTED_RO, 30), ro.client_state
            assert ro.get("/ro")[0] == b"v1"
            assert ro.get_children("/") and ro.exists("/nothing") is None
            with pytest.raises(NotReadOnlyCallError):
                ro.set("/ro", b"v2")
            with pytest.raises(NotReadOnlyCallError):
                ro.create("/other", b"x")
            assert isro(alone.client_port) == b"ro"
            # A session that did not ask for read-only mode is not served here meanwhile.
            assert wait_for(lambda: rw.state == KazooState.SUSPENDED, 30), rw.state
            for pid in others:
                os.kill(pid, signal.SIGCONT)
            assert wait_for(lambda: ro.client_state == KeeperState.CONNECTED, 60), ro.client_state
            assert isro(alone.client_port) == b"rw"
            ro.set("/ro", b"v3")
            assert wait_for(lambda: rw.state == KazooState.CONNECTED, 60), rw.state
            rw.sync("/ro")
            assert rw.get("/ro")[0] == b"v3"
        finally:
            stop_kazoo(ro, rw)
    finally:
        for pid in pids.values():
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        cluster.down()


def test_read_only_mode_is_off_by_default_as_in_zookeeper(tmp_path):
    cluster = start_cluster(Cluster(copy_config(tmp_path)))
    pids = cluster.pids()
    try:
        alone = next(n for n in cluster.config.nodes if n.id != leader_of(cluster))
        for n in cluster.config.nodes:
            if n.id != alone.id:
                os.kill(pids[n.id], signal.SIGSTOP)
        assert wait_for(lambda: isro(alone.client_port) == b"null", 30)
        ro = KazooClient(hosts=hosts(cluster, alone.id), timeout=4, read_only=True)
        with pytest.raises(Exception):  # kazoo's timeout: nobody serves it
            ro.start(timeout=3)
        stop_kazoo(ro)
    finally:
        for pid in pids.values():
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
        cluster.down()
