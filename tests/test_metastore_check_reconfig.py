"""The standalone check (opcode 13) and reconfig (opcode 16) on a real cluster (issue 20, item 5).

kazoo has no standalone check (its `check` is a multi's op), so the check goes over a raw socket
with metastore/wire's encoders, as any client would send it: the node's Stat in a
SetDataResponse when the version matches (or is -1), BadVersion, NoNode or NoAuth otherwise, on
the leader and on a follower, in order after the same connection's writes. ZooKeeper itself
answers UNIMPLEMENTED since 3.8.5 / 3.9.3 (docs/metastore_wire.md says why Quire serves it).

reconfig goes through kazoo's `reconfig`, as the super user: a follower is removed (the answer
and /zookeeper/config show the two voters left, the removed node serves nobody), then added back
(it follows again, and a write through it reads back everywhere); a reconfig without the super
user is NoAuth, one from a stale config version BadVersion."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from kazoo.exceptions import BadVersionError, NoAuthError
from kazoo.security import make_digest_acl

from cluster_fixtures import Cluster, copy_config, kazoo_session, start_cluster, wait_for
from metastore.wire import jute
from metastore.wire.jute_defs import Err, OpCode, Xid
from zab.core.ensemble import parse_spec

pytestmark = pytest.mark.multiprocess

SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # "super:test", as ZooKeeper's own tests
SUPER = [("digest", "super:test")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("check_reconfig"))
    path.write_text(path.read_text().replace("[cluster]\n", f'[cluster]\nsuper_digest = "{SUPER_DIGEST}"\n', 1))
    cluster = start_cluster(Cluster(path))
    try:
        yield cluster
    finally:
        cluster.down()


class RawSession:
    """A client session over a plain socket, speaking the client protocol through metastore/wire."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=20)
        self.frames = jute.FrameReader()
        self.pending: list[bytes] = []
        self.xid = 0
        self.answered: list[int] = []  # xids in the order their replies came
        self.sock.sendall(jute.frame(jute.encode_connect_request(
            jute.ConnectRequest(0, 0, 10_000, 0, bytes(jute.PASSWORD_BYTES), False))))
        assert jute.decode_connect_response(self._frame()).time_out > 0

    def _frame(self) -> bytes:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.pending += self.frames.feed(data)
        return self.pending.pop(0)

    def send(self, opcode: OpCode, body) -> int:
        """Send a request without waiting for its reply; its xid."""
        self.xid += 1
        self.sock.sendall(jute.frame(jute.encode_request(jute.RequestHeader(self.xid, opcode), body)))
        return self.xid

    def call(self, opcode: OpCode, body) -> tuple[jute.ReplyHeader, object]:
        """Send a request and read up to its reply (the replies to requests sent before it come first)."""
        xid = self.send(opcode, body)
        while True:
            payload = self._frame()
            answered = jute.reply_xid(payload)
            if answered in (Xid.NOTIFICATION, Xid.PING):
                continue
            self.answered.append(answered)
            if answered == xid:
                return jute.decode_reply(payload, opcode)

    def check(self, path: str, version: int) -> tuple[int, jute.Stat | None]:
        header, body = self.call(OpCode.CHECK, jute.CheckVersionRequest(path, version))
        assert (body is None) == (header.err != Err.OK)
        return header.err, None if body is None else body.stat

    def close(self) -> None:
        self.sock.close()


def roles(cluster: Cluster) -> dict[int, str]:
    return {r["id"]: r["role"] for r in cluster.status()}


def test_a_standalone_check_answers_the_nodes_stat_or_the_error_on_the_leader_and_a_follower(cluster):
    nodes = sorted(roles(cluster))  # the leader and both followers
    with kazoo_session(cluster) as zk:
        stats = {}
        for node_id in nodes:
            zk.create(f"/checked-{node_id}", b"v0")
            zk.set(f"/checked-{node_id}", b"v1")
            stats[node_id] = zk.set(f"/checked-{node_id}", b"v2")
        zk.create("/secret", b"", acl=[make_digest_acl("someone", "pw", all=True)])
    for node_id in nodes:
        node, path, stat = cluster.config.node(node_id), f"/checked-{node_id}", stats[node_id]
        raw = RawSession(node.host, node.client_port)
        try:
            raw.call(OpCode.SYNC, jute.SyncRequest(path))
            err, shown = raw.check(path, 2)
            assert err == Err.OK and shown.version == 2 and shown.mzxid == stat.mzxid
            assert shown.data_length == 2 and shown.czxid == stat.czxid
            assert raw.check(path, -1) == (Err.OK, shown)  # -1: any version
            assert raw.check(path, 1) == (Err.BAD_VERSION, None)
            assert raw.check("/missing", -1) == (Err.NO_NODE, None)
            assert raw.check("/secret", 0) == (Err.NO_AUTH, None)  # the version is data: READ needed

            # Sent right behind the connection's own write, unanswered yet: answered after it.
            write = raw.send(OpCode.SET_DATA, jute.SetDataRequest(path, b"mine", 2))
            err, shown = raw.check(path, 3)
            assert err == Err.OK and shown.version == 3 and shown.data_length == 4
            assert raw.answered[-2:] == [write, write + 1]
        finally:
            raw.close()


def server_line(cluster: Cluster, node_id: int) -> str:
    n = cluster.config.node(node_id)
    return f"server.{node_id}={n.host}:{n.peer_port}:{n.peer_port}:participant;{n.host}:{n.client_port}"


def test_kazoo_reconfig_removes_a_follower_and_adds_it_back(cluster):
    members = set(roles(cluster))
    with kazoo_session(cluster) as plain:
        with pytest.raises(NoAuthError):
            plain.reconfig(joining=None, leaving="3", new_members=None)
    leader = next(i for i, role in roles(cluster).items() if role == "leader")
    follower = max(members - {leader})
    # Connected to the leader: a session on the follower being removed would lose its connection.
    with kazoo_session(cluster, leader, auth_data=SUPER) as admin:
        config, stat = admin.get("/zookeeper/config")
        assert parse_spec(config).voters == members
        with pytest.raises(BadVersionError):
            admin.reconfig(joining=None, leaving="3", new_members=None, from_config=stat.mzxid + 1)

        data, stat = admin.reconfig(joining=None, leaving=str(follower), new_members=None, from_config=stat.mzxid)
        assert parse_spec(data).voters == members - {follower}
        admin.sync("/zookeeper/config")
        assert parse_spec(admin.get("/zookeeper/config")[0]).voters == members - {follower}
        assert wait_for(lambda: roles(cluster)[follower] == "looking", 20)  # removed: it serves nobody

        data, stat = admin.reconfig(joining=server_line(cluster, follower), leaving=None, new_members=None,
                                    from_config=stat.mzxid)
        assert parse_spec(data).voters == members
        assert wait_for(lambda: roles(cluster)[follower] == "follower", 30)
    with kazoo_session(cluster, follower) as back:
        back.create("/after-reconfig", b"x")
    for node_id in members:
        with kazoo_session(cluster, node_id) as zk:
            zk.sync("/")
            assert zk.get("/after-reconfig")[0] == b"x"
            assert parse_spec(zk.get("/zookeeper/config")[0]).voters == members
