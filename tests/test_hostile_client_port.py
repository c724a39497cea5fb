"""Hostile clients on the ZooKeeper client port of a real 3-node cluster (issue 17).

Each story sends what a careless or malicious client can send, then checks that
every node is still up, that each still serves an ordinary kazoo client, and that
what was acknowledged before is still there.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, ConnectionLoss, SessionExpiredError

from clusterd import config as cfg
from clusterd import localcluster
from metastore import jute
from metastore.acl import OPEN_ACL_UNSAFE
from metastore.jute_defs import OpCode
from test_cluster_processes import Cluster, copy_config

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("hostile"), client_protocol="zookeeper")
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def kazoo(cluster: Cluster, node_id: int | None = None) -> KazooClient:
    nodes = [n for n in cfg.load(cluster.path).nodes if node_id is None or n.id == node_id]
    zk = KazooClient(hosts=",".join(f"{n.host}:{n.client_port}" for n in nodes), timeout=5)
    zk.start(timeout=20)
    return zk


def followers(cluster: Cluster) -> list[cfg.NodeConfig]:
    roles = {r["id"]: r["role"] for r in cluster.status()}
    return [n for n in cfg.load(cluster.path).nodes if roles.get(n.id) == "follower"]


def assert_every_node_serves(cluster: Cluster, acked: dict[str, bytes]) -> None:
    """Every node's process is alive, answers kazoo on its own port, and holds `acked`."""
    for node in cfg.load(cluster.path).nodes:
        assert localcluster.running_pid(node) is not None, f"node {node.id} exited"
    for node in cfg.load(cluster.path).nodes:
        zk = kazoo(cluster, node.id)
        try:
            zk.sync("/")
            for path, data in acked.items():
                assert zk.get(path)[0] == data, f"node {node.id} lost {path}"
            zk.set("/hostile-alive", str(node.id).encode())
        finally:
            zk.stop()
            zk.close()


@pytest.fixture
def acked(ensemble: Cluster) -> dict[str, bytes]:
    zk = kazoo(ensemble)
    zk.ensure_path("/hostile-alive")
    data = {}
    for i in range(3):
        path = zk.create("/hostile-acked-", f"v{i}".encode(), sequence=True)
        data[path] = f"v{i}".encode()
    zk.stop()
    zk.close()
    return data


# -- raw client helpers -----------------------------------------------------------------
def open_raw(node: cfg.NodeConfig, timeout_s: float = 20) -> socket.socket:
    return socket.create_connection((node.host, node.client_port), timeout=timeout_s)


def read_frame(s: socket.socket, reader: jute.FrameReader, pending: list[bytes]) -> bytes | None:
    """The next frame from the server, or None once it closed the connection."""
    while not pending:
        try:
            data = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return None
        if not data:
            return None
        pending.extend(reader.feed(data))
    return pending.pop(0)


def connect_raw(s: socket.socket, session_id: int, passwd: bytes = b"\0" * 16) -> jute.ConnectResponse | None:
    s.sendall(jute.frame(jute.encode_connect_request(jute.ConnectRequest(0, 0, 5000, session_id, passwd, False))))
    frame = read_frame(s, jute.FrameReader(), [])
    return None if frame is None else jute.decode_connect_response(frame)


def closed_by_server(s: socket.socket) -> bool:
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


# -- 1. session ids that are not sessions ------------------------------------------------------
BAD_SESSION_IDS = [-1, -2, -(1 << 63), -0x1234_5678, (1 << 63) - 1, 0xFF00_0000_0000_0001 - (1 << 64),
                   0x7FFF_FFFF_FFFF_0000, 1]


def test_connect_with_a_session_id_that_is_no_session_ends_no_node(ensemble: Cluster, acked):
    """ZooKeeper answers an unknown or invalid session id with an expired session
    (ConnectResponse timeout 0), then closes. Today -1 sent to a follower ends it:
    the sync it asks the leader for packs the id as an unsigned 64-bit field."""
    targets = followers(ensemble) + [n for n in cfg.load(ensemble.path).nodes if n not in followers(ensemble)]
    for node in targets:
        for session_id in BAD_SESSION_IDS:
            with open_raw(node) as s:
                resp = connect_raw(s, session_id, b"p" * 16)
                if resp is not None:
                    assert resp.time_out == 0 and resp.session_id == 0, (node.id, session_id, resp)
                assert closed_by_server(s)
    assert_every_node_serves(ensemble, acked)


def test_connect_with_session_zero_and_a_password_gets_a_fresh_session(ensemble: Cluster, acked):
    for node in followers(ensemble):
        with open_raw(node) as s:
            resp = connect_raw(s, 0, b"\xff" * 16)
            assert resp is not None and resp.time_out > 0 and resp.session_id > 0
    assert_every_node_serves(ensemble, acked)


def test_kazoo_with_a_forged_session_id_is_told_it_expired(ensemble: Cluster, acked):
    for node in followers(ensemble):
        with open_raw(node) as s:
            assert connect_raw(s, -1) in (None, jute.ConnectResponse(0, 0, 0, b"\0" * 16, False))
    assert_every_node_serves(ensemble, acked)


# -- 2. auth ids the forwarded envelope cannot carry --------------------------------------------
def test_a_70000_byte_digest_user_then_a_write_ends_no_node(ensemble: Cluster, acked):
    """The envelope a follower forwards to the leader held each auth id behind a u16
    length: a 70,000-byte user ended the node on the next write. The id is refused
    (AUTH_FAILED, as ZooKeeper answers an auth it will not take)."""
    for node in followers(ensemble):
        zk = kazoo(ensemble, node.id)
        try:
            with pytest.raises((AuthFailedError, ConnectionLoss, SessionExpiredError)):
                zk.add_auth("digest", "u" * 70_000 + ":secret")
                zk.create("/hostile-long-user", b"x")
        finally:
            zk.stop()
            zk.close()
    assert_every_node_serves(ensemble, acked)


def auth_packet(xid: int, user: str) -> bytes:
    header = jute.RequestHeader(-4, OpCode.AUTH)
    return jute.frame(jute.encode_request(header, jute.AuthPacket(0, "digest", f"{user}:pw".encode())))


def test_more_than_65535_auth_ids_then_a_write_ends_no_node(ensemble: Cluster, acked):
    """Each addAuth with a new user adds an id to the connection; the envelope counted
    them in a u16, and each new id was compared with every one held (quadratic, on
    the shared event loop). Past the per-connection limit, addAuth fails with
    AUTH_FAILED and the connection closes."""
    node = followers(ensemble)[0]
    with open_raw(node, timeout_s=60) as s:
        assert connect_raw(s, 0).time_out > 0
        replies: list[int] = []

        def drain() -> None:  # read while we send: a client that never reads is cut off
            reader, pending = jute.FrameReader(), []
            while (frame := read_frame(s, reader, pending)) is not None:
                if jute.reply_xid(frame) == -4:  # addAuth's answer: keep its err
                    replies.append(jute.decode_reply(frame, OpCode.AUTH)[0].err)

        reader_thread = threading.Thread(target=drain, daemon=True)
        reader_thread.start()
        create = jute.encode_request(jute.RequestHeader(7, OpCode.CREATE),
                                     jute.CreateRequest("/hostile-many-ids", b"", OPEN_ACL_UNSAFE, 0))
        try:
            for start in range(0, 65_600, 4_000):  # in steps the server's reply queue can hold
                s.sendall(b"".join(auth_packet(i, f"user{i}") for i in range(start, min(start + 4_000, 65_600))))
                waited = time.monotonic() + 60
                while len(replies) < min(start + 4_000, 65_600) and reader_thread.is_alive():
                    assert time.monotonic() < waited, "the server stopped answering addAuth"
                    time.sleep(0.01)
            s.sendall(jute.frame(create))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server gave up on us first: that is the point
        reader_thread.join(timeout=120)
        assert not reader_thread.is_alive()
        assert len(replies) < 65_600, "more than 65,535 auth ids were taken"
        assert replies[-1] == jute.Err.AUTH_FAILED, "the id past the limit was not refused"
    assert_every_node_serves(ensemble, acked)
