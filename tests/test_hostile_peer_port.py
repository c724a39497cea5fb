"""Hostile peers on the Zab peer port of a real 3-node cluster (issue 17, "Peer port is open
to anyone"; the TLS that authenticates peers is tests/test_tls.py, this is what holds
without it).

A stranger that can reach the port sends HELLOs naming a member; each story checks
that the member's own link stays up (the node's transport counts no lost link), that no
node changes role or epoch, that every node still commits, and that a real member that
restarts still reconnects at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import trio

from cluster_fixtures import Cluster, copy_config
from clusterd import config as cfg
from clusterd import localcluster
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.client.sync import SyncMetaClient
from metastore.wire.jute_defs import OpCode
from zab.wire.codec import encode_frame, encode_hello
from zab.core.messages import Ack, FollowerInfo, Notification, Ping, Request, ServerState

pytestmark = pytest.mark.multiprocess

HELLOS = 40
SETTLE_S = 30


@pytest.fixture
def ensemble(tmp_path) -> Iterator[Cluster]:
    cluster = Cluster(copy_config(tmp_path))
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def statuses(cluster: Cluster) -> dict[int, dict]:
    found = trio.run(localcluster.fetch_statuses, cluster.config)
    assert all(s is not None for s in found.values()), f"a node does not answer: {found}"
    return found


def settled(cluster: Cluster) -> dict[int, dict]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = trio.run(localcluster.fetch_statuses, cluster.config)
        if localcluster.is_settled(found) and all(len(s["peers"]) == 2 for s in found.values()):
            return found
        assert time.monotonic() < deadline, f"not settled after {SETTLE_S}s: {found}"
        time.sleep(0.1)


def roles(found: dict[int, dict]) -> dict[int, tuple]:
    return {i: (s["role"], s["epoch"], s["leader"]) for i, s in found.items()}


def hello_loop(node: cfg.NodeConfig, cluster_name: str, as_id: int, then: bytes = b"") -> None:
    """HELLOS connections to `node`'s peer port, each claiming to be member `as_id`."""
    held = []
    for _ in range(HELLOS):
        s = socket.create_connection((node.host, node.peer_port), timeout=10)
        s.sendall(encode_hello(cluster_name, as_id) + then)
        held.append(s)
        time.sleep(0.02)
        if len(held) > 4:  # keep a few open at once, close the rest
            held.pop(0).close()
    time.sleep(0.5)
    for s in held:
        s.close()


def assert_commits_everywhere(cluster: Cluster) -> None:
    for node in cluster.config.nodes:
        assert localcluster.running_pid(node) is not None, f"node {node.id} exited"
        with SyncMetaClient([(node.host, node.client_port)]) as client:
            assert client.create(f"/alive-{node.id}", b"yes") == f"/alive-{node.id}"
            assert client.exists("/evil") is None, "a forged REQUEST was committed"


def forged_create(path: str) -> bytes:
    """A well-formed request envelope creating `path` with the super identity, as a member would
    forward it: what a stranger would love the leader to propose."""
    payload = jute.encode_request(jute.RequestHeader(1, OpCode.CREATE),
                                  jute.CreateRequest(path, b"x", (jute.ACL(31, jute.Id("world", "anyone")),), 0))
    return E.encode_envelope(E.Envelope(E.CLIENT, 1, 0, (("super", ""),), payload))


def test_a_hello_loop_claiming_the_leader_does_not_displace_its_links(ensemble: Cluster) -> None:
    before = settled(ensemble)
    leader = next(i for i, s in before.items() if s["role"] == "leader")
    name = ensemble.config.name
    messages = (encode_frame(Notification(leader, 0, 0, 1, ServerState.LOOKING))
                + encode_frame(FollowerInfo(2**32 - 1, 2**64 - 1, False, 1)) + encode_frame(Ack(2**64 - 1))
                + encode_frame(Request(2**64 - 1, 2**64 - 1, forged_create("/evil"))))
    for node in ensemble.config.nodes:
        if node.id != leader:
            hello_loop(node, name, leader, then=messages)
    follower = next(i for i in before if i != leader)
    leader_node = ensemble.config.node(leader)
    hello_loop(leader_node, name, follower, then=messages)
    after = settled(ensemble)
    lost = {i: after[i]["transport"]["disconnects"] - before[i]["transport"]["disconnects"] for i in before}
    assert lost == {i: 0 for i in before}, f"members' links were displaced: {lost}"
    assert roles(after) == roles(before), (roles(before), roles(after))
    assert_commits_everywhere(ensemble)


def test_a_member_restarted_after_a_stranger_claimed_its_id_gets_its_links_back(ensemble: Cluster) -> None:
    """Without TLS a stranger may take the id of a member that is down (TLS is what refuses
    it); the member, once back, must not be locked out after the stranger's link ends, and
    the links of the others are never displaced meanwhile."""
    before = settled(ensemble)
    follower = next(i for i, s in before.items() if s["role"] == "follower")
    node = ensemble.config.node(follower)
    localcluster.stop({follower: before[follower]["pid"]})
    squatters = []
    try:
        for other in ensemble.config.nodes:
            if other.id != follower:
                s = socket.create_connection((other.host, other.peer_port), timeout=10)
                s.sendall(encode_hello(ensemble.config.name, follower))
                squatters.append(s)
        localcluster.spawn(ensemble.config, node)
        time.sleep(1.0)
    finally:
        for s in squatters:
            s.close()
    settled(ensemble)
    assert_commits_everywhere(ensemble)


def test_a_forged_request_in_the_name_of_a_member_that_is_down_is_not_proposed(ensemble: Cluster) -> None:
    """The stranger's link is admitted (the member it names is down, and without TLS nothing
    tells them apart), but the leader takes a REQUEST only from a learner it synchronizes."""
    before = settled(ensemble)
    leader = next(i for i, s in before.items() if s["role"] == "leader")
    follower = next(i for i, s in before.items() if s["role"] == "follower")
    localcluster.stop({follower: before[follower]["pid"]})
    deadline = time.monotonic() + SETTLE_S
    while follower in statuses_of(ensemble, leader)["peers"]:
        assert time.monotonic() < deadline, "the leader still lists the stopped follower"
        time.sleep(0.05)
    leader_node = ensemble.config.node(leader)
    with socket.create_connection((leader_node.host, leader_node.peer_port), timeout=10) as s:
        s.sendall(encode_hello(ensemble.config.name, follower)
                  + encode_frame(Request(follower << 56 | 1, 1, forged_create("/evil")))
                  + encode_frame(Ping((follower << 56 | 1,))))
        time.sleep(1.0)
    with SyncMetaClient([(leader_node.host, leader_node.client_port)]) as client:
        assert client.create("/after-forgery", b"yes") == "/after-forgery"
        assert client.exists("/evil") is None, "the leader proposed a forged REQUEST"
    assert statuses_of(ensemble, leader)["role"] == "leader"
    up = ensemble.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    settled(ensemble)
    assert_commits_everywhere(ensemble)


def statuses_of(cluster: Cluster, node_id: int) -> dict:
    found = trio.run(localcluster.fetch_statuses, cluster.config)[node_id]
    assert found is not None, f"node {node_id} does not answer"
    return found
