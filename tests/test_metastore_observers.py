"""Observers as real processes (issue 19): the shipped 3 voters plus nodes 4 and 5 with
`roles = ["observer"]`, driven with real kazoo. An observer syncs from the leader, shows up as an
observer in `clusterctl status`, its admin /status and its four-letter words, and serves the
ZooKeeper client port: clients connected to it alone read, get watch events for writes made
through a voter, `sync`, and write (forwarded to the leader, answered after the commit). It
follows a new leader after the leader's SIGKILL with nothing acknowledged lost, restarts from its
data directory, and never counts toward a quorum: with two voters SIGSTOPped, writes stop although
three processes (one voter, two observers) are up."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NodeExistsError, SessionExpiredError

from cluster_fixtures import (Cluster, copy_config, kazoo_session, leader_of, start_cluster, started_kazoo, stop_kazoo,
                              wait_for)
from clusterd import localcluster
from clusterd.daemon.admin import AdminUnavailable, fetch_status

pytestmark = pytest.mark.multiprocess

VOTERS = (1, 2, 3)
OBSERVERS = (4, 5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("observers"))
    path.write_text(path.read_text() + "".join(localcluster.extra_node(i, "observer") for i in OBSERVERS))
    cluster = start_cluster(Cluster(path))
    try:
        assert wait_settled(cluster)
        yield cluster
    finally:
        cluster.down()


def admin_status(cluster: Cluster, node_id: int) -> dict | None:
    node = cluster.config.node(node_id)
    try:
        return trio.run(lambda: fetch_status(node.host, node.admin_port, timeout_s=1.0))
    except AdminUnavailable:
        return None


def statuses(cluster: Cluster) -> dict[int, dict | None]:
    return {n.id: admin_status(cluster, n.id) for n in cluster.config.nodes}


def role(cluster: Cluster, node_id: int) -> str | None:
    """The node's role from its admin /status, None while it does not answer."""
    status = admin_status(cluster, node_id)
    return status["role"] if status is not None else None


def settled(cluster: Cluster) -> bool:
    """One leader among the voters, the other voters following it, the observers observing it, all in
    broadcast at the leader's committed zxid or close behind."""
    s = statuses(cluster)
    if any(x is None or x["phase"] != "broadcast" for x in s.values()):
        return False
    leaders = [i for i, x in s.items() if x["role"] == "leader"]
    return (len(leaders) == 1 and leaders[0] in VOTERS
            and all(s[i]["role"] == "follower" for i in VOTERS if i != leaders[0])
            and all(s[i]["role"] == "observer" and s[i]["leader"] == leaders[0] for i in OBSERVERS))


def wait_settled(cluster: Cluster, timeout_s: float = 30) -> bool:
    return wait_for(lambda: settled(cluster), timeout_s)


def four_letter(cluster: Cluster, node_id: int, word: str) -> str:
    node = cluster.config.node(node_id)
    with socket.create_connection((node.host, node.client_port), timeout=5) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def landed_or_write(client: KazooClient, path: str, data: bytes, deadline: float) -> None:
    """Create `path` through `client` until acknowledged; a ConnectionLoss leaves the outcome unknown, so
    the retry's NodeExists means the earlier attempt landed (its data is checked)."""
    while True:
        try:
            client.create(path, data)
            return
        except NodeExistsError:
            assert client.get(path)[0] == data
            return
        except (ConnectionLoss, SessionExpiredError):
            assert time.monotonic() < deadline, f"{path}: no answer from the observer in time"
            time.sleep(0.05)


def test_observers_sync_and_report_their_role_everywhere(cluster: Cluster):
    leader = leader_of(cluster)
    rows = {r["id"]: r for r in cluster.status()}
    assert [rows[i]["role"] for i in OBSERVERS] == ["observer", "observer"]
    assert all(rows[i]["role"] in ("leader", "follower") for i in VOTERS)
    for i in OBSERVERS:
        assert leader in rows[i]["peers"]
        assert rows[i]["epoch"] == rows[leader]["epoch"]
        status = admin_status(cluster, i)
        assert (status["role"], status["roles"], status["leader"], status["phase"]) == (
            "observer", ["observer"], leader, "broadcast")
        assert "Mode: observer\n" in four_letter(cluster, i, "srvr")
        assert "zk_server_state\tobserver\n" in four_letter(cluster, i, "mntr")
        assert four_letter(cluster, i, "ruok") == "imok"
    assert "zk_server_state\tleader\n" in four_letter(cluster, leader, "mntr")


def test_a_client_of_an_observer_alone_writes_through_it_and_reads_its_writes(cluster: Cluster):
    with kazoo_session(cluster, 4) as observer, kazoo_session(cluster, 1) as voter:
        assert observer.create("/obs", b"a") == "/obs"
        assert observer.get("/obs")[0] == b"a"  # answered after the commit: this node has applied it
        stat = observer.set("/obs", b"b", version=0)
        assert (observer.get("/obs")[0], stat.version) == (b"b", 1)
        created = observer.create("/obs/seq-", b"", sequence=True)
        assert observer.get_children("/obs") == [created.rsplit("/", 1)[1]]
        voter.sync("/obs")
        assert voter.get("/obs")[0] == b"b" and voter.exists(created) is not None
        observer.delete(created)
        assert observer.exists(created) is None
        voter.sync("/obs")
        assert voter.get_children("/obs") == []


def test_a_session_on_an_observer_lives_past_its_timeout_and_its_ephemerals_go_with_it(cluster: Cluster):
    """The observer's pings carry its sessions to the leader, whose clock expires them."""
    with kazoo_session(cluster, 1) as voter:
        observer = started_kazoo(cluster, 4, timeout=2)  # the shortest session cluster.toml grants
        try:
            observer.create("/eph", b"", ephemeral=True)
            owner = observer.client_id[0]
            time.sleep(4)  # two session timeouts, the session kept alive through the observer alone
            voter.sync("/eph")
            assert voter.exists("/eph").ephemeralOwner == owner
        finally:
            stop_kazoo(observer)  # closes the session
        assert wait_for(lambda: voter.exists("/eph") is None, 5)


def test_an_observer_client_gets_watch_events_for_writes_through_a_voter_and_reads_after_sync(cluster: Cluster):
    with kazoo_session(cluster, 5) as observer, kazoo_session(cluster, 2) as voter:
        voter.create("/watched", b"0")
        observer.sync("/watched")
        assert observer.get("/watched")[0] == b"0"
        events: list = []
        changed, children, created = threading.Event(), threading.Event(), threading.Event()
        observer.get("/watched", watch=lambda e: (events.append(e), changed.set()))
        observer.get_children("/watched", watch=lambda e: (events.append(e), children.set()))
        observer.exists("/watched/later", watch=lambda e: (events.append(e), created.set()))
        voter.set("/watched", b"1")
        voter.create("/watched/later", b"x")
        assert changed.wait(10) and children.wait(10) and created.wait(10), events
        assert {(e.type, e.path) for e in events} == {
            ("CHANGED", "/watched"), ("CHILD", "/watched"), ("CREATED", "/watched/later")}
        # The event means this node applied the write: the read that follows sees it.
        assert observer.get("/watched")[0] == b"1"
        voter.set("/watched/later", b"y")
        observer.sync("/watched/later")
        assert observer.get("/watched/later")[0] == b"y"


def test_an_observer_serves_again_after_the_leader_is_sigkilled_and_nothing_acknowledged_is_lost(cluster: Cluster):
    leader = leader_of(cluster)
    killed_pid = cluster.pids()[leader]
    observer = started_kazoo(cluster, 4, timeout=10)
    try:
        observer.create("/failover", b"")
        acked = []
        deadline = time.monotonic() + 30
        for i in range(60):
            if i == 20:
                os.kill(killed_pid, signal.SIGKILL)
            landed_or_write(observer, f"/failover/w{i}", str(i).encode(), deadline)
            acked.append(i)
        new_leader = leader_of(cluster)
        assert new_leader != leader and new_leader in VOTERS
    finally:
        stop_kazoo(observer)
    start_cluster(cluster)  # clusterctl up restarts the killed node
    assert wait_settled(cluster)
    for node in cluster.config.nodes:
        with kazoo_session(cluster, node.id) as client:
            client.sync("/failover")
            names = client.get_children("/failover")
            assert sorted(names) == sorted(f"w{i}" for i in acked), f"node {node.id}"
            assert client.get("/failover/w59")[0] == b"59"


def test_an_observer_restarts_from_its_data_directory(cluster: Cluster):
    with kazoo_session(cluster, 5) as observer:
        observer.create("/before-observer-restart", b"kept")
    assert list((cluster.config.node(5).data_dir / "txnlog").iterdir()), "the observer logs what it applies"
    os.kill(cluster.pids()[5], signal.SIGKILL)
    with kazoo_session(cluster, 1) as voter:
        voter.create("/while-observer-down", b"missed")
    start_cluster(cluster)
    assert wait_settled(cluster)
    assert role(cluster, 5) == "observer"
    with kazoo_session(cluster, 5) as observer:
        observer.sync("/while-observer-down")
        assert observer.get("/while-observer-down")[0] == b"missed"
        assert observer.get("/before-observer-restart")[0] == b"kept"
        observer.set("/while-observer-down", b"seen")


def test_observers_never_make_a_quorum(cluster: Cluster):
    """Two voters SIGSTOPped leave one voter and two observers up: no write commits, whether the one
    voter is the leader (the observers' acks would make three) or a follower (their votes would)."""
    pids = cluster.pids()
    try:
        for stopped_leader in (False, True):
            leader = leader_of(cluster)
            followers = [i for i in VOTERS if i != leader]
            stop = [leader, followers[0]] if stopped_leader else followers
            with kazoo_session(cluster, 4, timeout=10) as observer:
                for i in stop:
                    os.kill(pids[i], signal.SIGSTOP)
                write = observer.create_async(f"/no-quorum-{stopped_leader}", b"x")
                with pytest.raises(Exception) as refused:  # ConnectionLoss once the node loses its leader
                    write.get(timeout=4)
                assert not isinstance(refused.value, NodeExistsError)
                up = [i for i in VOTERS + OBSERVERS if i not in stop]
                assert wait_for(lambda: all(role(cluster, i) == "looking" for i in up), 10)
                time.sleep(1.5)  # 30 ticks: ample time for an election that observers could complete
                assert all(role(cluster, i) == "looking" for i in up)
                for i in stop:
                    os.kill(pids[i], signal.SIGCONT)
                assert wait_settled(cluster)
            with kazoo_session(cluster, 4) as observer:
                observer.create(f"/quorum-back-{stopped_leader}", b"y")
    finally:
        for pid in pids.values():
            if pid is not None and localcluster.is_clusterd(pid):
                os.kill(pid, signal.SIGCONT)
