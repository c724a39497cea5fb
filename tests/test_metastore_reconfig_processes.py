"""Dynamic reconfiguration on real processes with real kazoo (issue 19 item 3).

A 3-voter cluster runs from a cluster.toml; nodes 4 and 5 are then added to that file as
observers and started: they are not members of the running ensemble until a reconfig adds them.
A kazoo client writes all along. Through kazoo's `reconfig` (as the super user): 4 and 5 join as
observers and sync, become participants (3 -> 5 voters), and the leader is removed (the others
elect at once); /zookeeper/config and its watch follow; a reconfig that would lose quorum is
refused; every acknowledged write is on every member at the end, and the removed node serves
nobody. Then `clusterctl node replace` swaps a voter for the removed node, one reconfig shrinks
the ensemble to 3 voters other than the first three, and `clusterctl node add --observer` brings
a removed node back as an observer: the issue's reconfig-under-load story, one test per step, in
order, on one cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NewConfigNoQuorumError
from kazoo.retry import KazooRetry

from cluster_fixtures import Cluster, copy_config, stop_kazoo, wait_for
from clusterd import localcluster
from clusterd.daemon.admin import AdminUnavailable, fetch_status
from zab.core.ensemble import parse_spec

pytestmark = pytest.mark.multiprocess

SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # "super:test", as ZooKeeper's own tests
JOINING = (4, 5)


def role(cluster: Cluster, node_id: int) -> str | None:
    node = cluster.config.node(node_id)
    try:
        status = trio.run(lambda: fetch_status(node.host, node.admin_port, timeout_s=1.0))
    except AdminUnavailable:
        return None
    return status["role"] if status["phase"] == "broadcast" or status["role"] == "looking" else None


def server_line(cluster: Cluster, node_id: int, kind: str) -> str:
    n = cluster.config.node(node_id)
    return f"server.{node_id}={n.host}:{n.peer_port}:{n.peer_port}:{kind};{n.host}:{n.client_port}"


def client(cluster: Cluster, ids, **options) -> KazooClient:
    hosts = ",".join(f"{n.host}:{n.client_port}" for n in cluster.config.nodes if n.id in ids)
    zk = KazooClient(hosts=hosts, timeout=6, connection_retry={"max_tries": -1, "max_delay": 0.2}, **options)
    zk.start(timeout=20)
    return zk


class Writer(threading.Thread):
    """Creates /load/w<n> one after another, each retried until acknowledged."""

    def __init__(self, zk: KazooClient) -> None:
        super().__init__(daemon=True)
        self.zk, self.acked, self.stop = zk, [], threading.Event()

    def run(self) -> None:
        retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=30)
        retry(self.zk.ensure_path, "/load")
        n = 0
        while not self.stop.is_set():
            path = f"/load/w{n}"
            retry(lambda: self.zk.exists(path) or self.zk.create(path, b"x"))
            self.acked.append(path)
            n += 1


def assert_on_every_node(cluster: Cluster, ids, acked: list[str], voters: set[int] | None = None) -> None:
    """Each of `ids`, read alone after a sync, has every acknowledged path (and, if given, shows
    `voters` in /zookeeper/config)."""
    for i in sorted(ids):
        check = client(cluster, (i,))
        try:
            check.sync("/")
            missing = [p for p in acked if check.exists(p) is None]
            assert not missing, f"node {i} lacks {len(missing)} acknowledged writes"
            if voters is not None:
                assert parse_spec(check.get("/zookeeper/config")[0]).voters == voters
        finally:
            stop_kazoo(check)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("reconfig"))
    path.write_text(path.read_text().replace("[cluster]\n", f'[cluster]\nsuper_digest = "{SUPER_DIGEST}"\n', 1))
    cluster = Cluster(path)
    try:
        up = cluster.ctl("up")
        assert up.returncode == 0, up.stdout + up.stderr
        # Nodes 4 and 5 run from the same file, as observers it names: the running members' own
        # membership (their bootstrap) does not have them.
        path.write_text(path.read_text() + "".join(localcluster.extra_node(i, "observer") for i in JOINING))
        cluster.config = Cluster(path).config
        up = cluster.ctl("up", "--timeout", "2")  # they look for a leader until a reconfig adds them
        assert up.stdout.count("started") == len(JOINING), up.stdout + up.stderr
        yield cluster
    finally:
        cluster.down()


def test_grow_by_observers_to_five_voters_then_remove_the_leader_while_kazoo_writes(cluster: Cluster):
    admin = client(cluster, (1, 2, 3), auth_data=[("digest", "super:test")])
    zk = client(cluster, (1, 2, 3, 4, 5))
    writer = Writer(zk)
    writer.start()
    try:
        assert role(cluster, 4) == "looking"  # running, but nobody's member yet
        data, _ = admin.reconfig(joining=",".join(server_line(cluster, i, "observer") for i in JOINING),
                                 leaving=None, new_members=None)
        assert parse_spec(data).observers == set(JOINING)
        assert wait_for(lambda: all(role(cluster, i) == "observer" for i in JOINING), 30)

        data, stat = admin.reconfig(joining=",".join(server_line(cluster, i, "participant") for i in JOINING),
                                    leaving=None, new_members=None)
        assert parse_spec(data).voters == {1, 2, 3, 4, 5}
        assert wait_for(lambda: all(role(cluster, i) == "follower" for i in JOINING), 30)

        with pytest.raises(NewConfigNoQuorumError):  # two of three new voters do not exist
            admin.reconfig(joining=None, leaving=None, new_members=",".join(
                [server_line(cluster, 1, "participant"), "server.8=127.0.0.1:1:1:participant",
                 "server.9=127.0.0.1:2:2:participant"]))

        leader = next(i for i in range(1, 6) if role(cluster, i) == "leader")
        stop_kazoo(admin)  # through a node that stays: the removed one ends its clients' connections
        admin = client(cluster, [i for i in JOINING if i != leader], auth_data=[("digest", "super:test")])
        changed = threading.Event()
        admin.get("/zookeeper/config", watch=lambda event: changed.set())
        rest = {1, 2, 3, 4, 5} - {leader}
        try:
            data, _ = admin.reconfig(joining=None, leaving=str(leader), new_members=None, from_config=stat.mzxid)
            assert parse_spec(data).voters == rest
        except ConnectionLoss:
            pass  # the removed leader's followers elect anew, and drop their clients: outcome unknown
        assert wait_for(lambda: parse_spec(KazooRetry(max_tries=-1, deadline=20)(
            admin.get, "/zookeeper/config")[0]).voters == rest, 30)
        assert changed.wait(20)
        assert wait_for(lambda: any(role(cluster, i) == "leader" for i in rest), 30)
        assert wait_for(lambda: role(cluster, leader) == "looking", 10)  # removed: it serves nobody
        count = len(writer.acked)
        assert wait_for(lambda: len(writer.acked) > count + 5, 30)  # writes go on
    finally:
        writer.stop.set()
        writer.join(60)
        stop_kazoo(zk, admin)
    assert writer.acked
    assert_on_every_node(cluster, rest, writer.acked, voters=rest)


def members(cluster: Cluster) -> set[int]:
    zk = client(cluster, (1, 2, 3, 4, 5))
    try:
        zk.sync("/zookeeper/config")
        return parse_spec(zk.get("/zookeeper/config")[0]).voters
    finally:
        stop_kazoo(zk)


def test_clusterctl_node_replace_takes_a_voter_out_and_puts_the_removed_node_back_while_kazoo_writes(cluster: Cluster):
    """After the test above: the removed node comes back in a member's place (`clusterctl node
    replace OLD NEW`: NEW added as observer, synced, made a voter; OLD removed)."""
    before = members(cluster)
    (outsider,) = {1, 2, 3, 4, 5} - before
    old = min(before)
    zk = client(cluster, (1, 2, 3, 4, 5))
    writer = Writer(zk)
    writer.start()
    try:
        done = cluster.ctl("node", "replace", str(old), str(outsider), "--super", "super:test", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"node {outsider}: voter, following" in done.stdout and f"node {old}: removed" in done.stdout
        count = len(writer.acked)
        assert wait_for(lambda: len(writer.acked) > count + 5, 30)
    finally:
        writer.stop.set()
        writer.join(60)
        stop_kazoo(zk)
    after = before - {old} | {outsider}
    assert members(cluster) == after
    assert wait_for(lambda: role(cluster, old) == "looking", 10)
    assert_on_every_node(cluster, after, writer.acked)
    refused = cluster.ctl("node", "add", str(old))
    assert refused.returncode == 2 and "super user" in refused.stderr


def test_shrink_to_three_other_members_then_gain_an_observer_while_kazoo_writes(cluster: Cluster):
    """After the tests above: one reconfig with a whole new member list shrinks the ensemble to 3
    voters that are not the original three (4 and 5 among them), then `clusterctl node add ID
    --observer` brings one of the removed nodes back as an observer, which serves reads."""
    before = members(cluster)
    keep = sorted({4, 5} | {min(before - {4, 5})})
    dropped = before - set(keep)
    zk = client(cluster, (1, 2, 3, 4, 5))
    admin = client(cluster, keep, auth_data=[("digest", "super:test")])
    writer = Writer(zk)
    writer.start()
    try:
        try:
            admin.reconfig(joining=None, leaving=None,
                           new_members=",".join(server_line(cluster, i, "participant") for i in keep))
        except ConnectionLoss:
            pass  # the leader was among the dropped: outcome read back below
        assert wait_for(lambda: members(cluster) == set(keep), 30)
        assert wait_for(lambda: any(role(cluster, i) == "leader" for i in keep), 30)
        observer = min(dropped)
        done = cluster.ctl("node", "add", str(observer), "--observer", "--super", "super:test", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert role(cluster, observer) == "observer"
        count = len(writer.acked)
        assert wait_for(lambda: len(writer.acked) > count + 5, 30)
    finally:
        writer.stop.set()
        writer.join(60)
        stop_kazoo(zk, admin)
    assert_on_every_node(cluster, set(keep) | {observer}, writer.acked)
