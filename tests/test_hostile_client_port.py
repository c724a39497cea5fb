"""Hostile clients on the ZooKeeper client port of a real 3-node cluster (issue 17).

Each story sends what a careless or malicious client can send, then checks that
every node is still up, that each still serves an ordinary kazoo client, and that
what was acknowledged before is still there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, ConnectionLoss, MarshallingError, SessionExpiredError

from clusterd import config as cfg
from clusterd import localcluster
from metastore.wire import jute
from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.edge.edge_guard import MAX_AUTH_IDS
from metastore.wire.jute_defs import OpCode
from cluster_fixtures import Cluster, closed_by_server, copy_config
from cluster_fixtures import started_kazoo, wait_for

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("hostile"))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def kazoo(cluster: Cluster, node_id: int | None = None) -> KazooClient:
    return started_kazoo(cluster, node_id)


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
        # The refusal itself may be lost: the server closes with our later packets unread,
        # and the kernel then resets the connection. Either way it ended within the limit.
        assert len(replies) <= MAX_AUTH_IDS, f"{len(replies)} addAuth answered on one connection"
        assert all(err == 0 for err in replies[:-1]) and replies[-1] in (0, jute.Err.AUTH_FAILED)
    assert_every_node_serves(ensemble, acked)


# -- 3. byte and count limits -------------------------------------------------------------------
LIMITS = """jute_max_buffer_bytes = 65536
client_outgoing_max_bytes = 1048576
client_reply_max_bytes = 2097152
client_handshake_timeout_ms = 1500
global_outstanding_limit = 20
global_outstanding_bytes = 262144
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[Cluster]:
    """A cluster with small client-port limits, so that each is reached in a few requests."""
    path = copy_config(tmp_path_factory.mktemp("limited"))
    path.write_text(path.read_text().replace("[cluster]\n", "[cluster]\n" + LIMITS, 1))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def client_stats(node: cfg.NodeConfig) -> dict:
    with urllib.request.urlopen(f"http://{node.host}:{node.admin_port}/status", timeout=10) as r:
        return json.load(r)["clients"]


def rss_bytes(node: cfg.NodeConfig) -> int:
    status = open(f"/proc/{localcluster.running_pid(node)}/status").read()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def test_many_clients_that_never_read_are_bounded_together_by_client_reply_max_bytes(limited: Cluster):
    """client_outgoing_max_bytes (1 MiB) bounds one connection; client_reply_max_bytes (2 MiB)
    bounds all of a node's together: eight silent clients pipelining reads of a 60 kB znode
    would make it hold 8 MiB; past 2 MiB the connection whose reply does not fit is cut off
    (`reply_refusals` in /status), the bytes held never pass the bound by more than a reply per
    connection, and another client goes on."""
    node = cfg.load(limited.path).nodes[1]
    zk = kazoo(limited, node.id)
    zk.ensure_path("/big2")
    zk.set("/big2", b"y" * 60_000)
    get = jute.frame(jute.encode_request(jute.RequestHeader(1, OpCode.GET_DATA), jute.GetDataRequest("/big2", False)))
    silent = []
    try:
        for _ in range(8):
            s = open_raw(node, timeout_s=30)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            assert connect_raw(s, 0).time_out > 0
            s.setblocking(False)
            silent.append(s)
        peak = 0
        for _ in range(60):
            for s in silent:
                try:
                    s.sendall(get * 4)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
            peak = max(peak, client_stats(node)["reply_bytes"])
        assert wait_for(lambda: client_stats(node)["reply_refusals"] >= 1, timeout_s=30), client_stats(node)
        assert peak <= (2 << 20) + 8 * 70_000, peak
        assert zk.get("/big2")[0] == b"y" * 60_000
    finally:
        for s in silent:
            s.close()
        zk.stop()
        zk.close()
    assert wait_for(lambda: client_stats(node)["reply_bytes"] == 0, timeout_s=30), "closed connections gave back nothing"


def test_a_client_that_never_reads_is_cut_off_and_the_node_holds_little(limited: Cluster):
    """Replies queued for one connection are counted in bytes: a client that sends reads
    and never takes the replies is disconnected past client_outgoing_max_bytes (1 MiB
    here), while another client goes on; the node's memory does not grow with what the
    silent client asked for (1,500 replies of 60 kB: 90 MB)."""
    node = cfg.load(limited.path).nodes[0]
    zk = kazoo(limited, node.id)
    zk.create("/big", b"x" * 60_000)
    before = rss_bytes(node)
    get = jute.frame(jute.encode_request(jute.RequestHeader(1, OpCode.GET_DATA), jute.GetDataRequest("/big", False)))
    s = open_raw(node, timeout_s=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    assert connect_raw(s, 0).time_out > 0
    s.setblocking(False)
    sent = 0
    try:
        for _ in range(1_500):
            s.sendall(get)
            sent += 1
    except (BlockingIOError, BrokenPipeError, ConnectionResetError):
        pass  # the server stopped reading us or cut us off
    assert wait_for(lambda: client_stats(node)["cut_off"] >= 1, timeout_s=30), "the silent client was not cut off"
    assert zk.get("/big")[0] == b"x" * 60_000  # another client is served meanwhile
    assert rss_bytes(node) - before < 48 << 20, "the node holds what the silent client did not read"
    s.setblocking(True)
    got = 0
    reader, pending = jute.FrameReader(1 << 20), []
    while read_frame(s, reader, pending) is not None:
        got += 1
    s.close()
    assert got < sent, "every reply was kept for the client that did not read"
    zk.stop()
    zk.close()


def test_connection_61_from_one_address_is_refused(ensemble: Cluster, acked):
    """maxClientCnxns: 60 connections per client address (ours and the node's own
    services on 127.0.0.1 together); the next is closed at once, nothing read."""
    node = followers(ensemble)[0]
    held = [socket.create_connection((node.host, node.client_port), timeout=10) for _ in range(80)]
    try:
        # Every connection is accepted or refused well inside the 10 s handshake timeout.
        assert wait_for(lambda: client_stats(node)["connections_refused"] >= 20, timeout_s=30)
        open_ones = []
        for s in held:
            s.setblocking(False)
            try:
                open_ones.append(s.recv(1) != b"")
            except BlockingIOError:
                open_ones.append(True)  # admitted: the server waits for our ConnectRequest
            except ConnectionResetError:
                open_ones.append(False)
        # Not "a prefix admitted, the rest refused": the node's own services on 127.0.0.1
        # reconnect now and then, so a slot can free up between two of ours.
        admitted = sum(open_ones)
        assert 48 <= admitted <= 60, f"{admitted} connections admitted from one address"
        assert len(held) - admitted >= 20, "fewer than 20 of 80 connections were refused"
        zk = kazoo(ensemble)  # the other nodes still take this address
        zk.stop()
        zk.close()
    finally:
        for s in held:
            s.close()
    assert_every_node_serves(ensemble, acked)


def test_a_connection_that_sends_nothing_is_closed_after_the_handshake_timeout(limited: Cluster):
    node = cfg.load(limited.path).nodes[1]
    for opening in (b"", struct.pack(">i", 40)):  # nothing at all; a frame length and then nothing
        with open_raw(node, timeout_s=20) as s:
            s.sendall(opening)
            try:
                assert s.recv(1) == b"", "the server sent something to a silent client"
            except ConnectionResetError:
                pass
            except socket.timeout:
                pytest.fail(f"a connection that sent {opening!r} is still open after 20 s")


def test_the_global_outstanding_limit_throttles_reading(limited: Cluster):
    """globalOutstandingLimit (20 here): a client that pipelines 300 creates gets every
    answer, in order, while the node never has more than 20 requests in flight."""
    node = cfg.load(limited.path).nodes[2]
    with open_raw(node, timeout_s=60) as s:
        assert connect_raw(s, 0).time_out > 0
        creates = b"".join(jute.frame(jute.encode_request(
            jute.RequestHeader(xid, OpCode.CREATE),
            jute.CreateRequest("/pipelined-", b"", OPEN_ACL_UNSAFE, 2))) for xid in range(1, 301))
        s.sendall(creates)
        reader, pending, xids = jute.FrameReader(1 << 20), [], []
        while len(xids) < 300:
            frame = read_frame(s, reader, pending)
            assert frame is not None, f"closed after {len(xids)} replies"
            xids.append(jute.reply_xid(frame))
    assert xids == list(range(1, 301))
    stats = client_stats(node)
    assert stats["outstanding_max"] <= 20 and stats["throttled"] >= 1, stats


def test_the_global_outstanding_bytes_throttle_reading(limited: Cluster):
    """The same limit in bytes (256 KiB here): 40 pipelined setData of 60 kB (2.4 MB) are
    all answered in order, with never more than 256 KiB of requests (plus one) in flight."""
    node = cfg.load(limited.path).nodes[1]
    zk = kazoo(limited, node.id)
    zk.ensure_path("/heavy")
    with open_raw(node, timeout_s=60) as s:
        assert connect_raw(s, 0).time_out > 0
        s.sendall(b"".join(jute.frame(jute.encode_request(jute.RequestHeader(xid, OpCode.SET_DATA),
                                                          jute.SetDataRequest("/heavy", b"h" * 60_000, -1)))
                           for xid in range(1, 41)))
        reader, pending, replies = jute.FrameReader(1 << 20), [], []
        while len(replies) < 40:
            frame = read_frame(s, reader, pending)
            assert frame is not None, f"closed after {len(replies)} replies"
            replies.append(jute.decode_reply(frame, OpCode.SET_DATA)[0])
    assert [r.xid for r in replies] == list(range(1, 41)) and all(r.err == 0 for r in replies)
    stats = client_stats(node)
    assert stats["outstanding_bytes_max"] <= 262_144 + 61_000, stats
    assert zk.get("/heavy")[1].version == 40
    zk.stop()
    zk.close()


def test_a_read_larger_than_jute_max_buffer_gets_an_error(limited: Cluster):
    """A reply a client would refuse as too long (jute.maxbuffer, 64 KiB here, plus the
    frame overhead) is not sent: the request gets MARSHALLINGERROR and the connection goes on."""
    node = cfg.load(limited.path).nodes[0]
    zk = kazoo(limited, node.id)
    zk.ensure_path("/wide")
    for i in range(150):
        zk.create(f"/wide/{i:04d}" + "n" * 1000, b"")
    with pytest.raises(MarshallingError):
        zk.get_children("/wide")
    assert zk.exists("/wide").numChildren == 150
    zk.stop()
    zk.close()


# -- 4. sessions: no shipped secret --------------------------------------------------------------
def old_default_password(session_id: int) -> bytes:
    """The password every Quire cluster gave a session before issue 17 (session_secret's
    shipped default)."""
    return hmac.new(b"quire-change-me", struct.pack(">q", session_id), hashlib.sha256).digest()[:16]


def test_a_client_that_knows_a_session_id_cannot_take_it_over(ensemble: Cluster, acked):
    """exists() tells anyone an ephemeral's owner session; with the shipped secret anyone
    could then compute its password, resume it elsewhere and close it."""
    owner = kazoo(ensemble)
    owner.create("/hostile-owned", b"", ephemeral=True)
    session_id = kazoo_session = owner.exists("/hostile-owned").ephemeralOwner
    assert kazoo_session == owner.client_id[0]
    for node in cfg.load(ensemble.path).nodes:
        with open_raw(node) as s:
            resp = connect_raw(s, session_id, old_default_password(session_id))
            assert resp is None or resp.time_out == 0, f"node {node.id} handed the session over"
            if resp is not None and resp.time_out > 0:  # taken over: close it, as an attacker would
                s.sendall(jute.frame(jute.encode_request(jute.RequestHeader(1, OpCode.CLOSE_SESSION))))
    owner.set("/hostile-alive", b"owner")  # the owner's connection was not taken away
    assert owner.exists("/hostile-owned") is not None
    owner.stop()
    owner.close()
    assert_every_node_serves(ensemble, acked)
