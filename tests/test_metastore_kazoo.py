"""kazoo, unchanged, against a real 3-node clusterd ensemble speaking the ZooKeeper protocol."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, NoAuthError, NodeExistsError, NoNodeError, NotEmptyError,
                              RolledBackError)
from kazoo.security import make_digest_acl

from clusterd import config as cfg
from clusterd import localcluster
from cluster_fixtures import Cluster, ensemble, hosts, kazoo_session, wait_for  # noqa: F401 (ensemble is a fixture)

pytestmark = pytest.mark.multiprocess

@pytest.fixture
def zk(ensemble: Cluster) -> Iterator[KazooClient]:
    with kazoo_session(ensemble, start_timeout_s=15) as client:
        yield client


def test_crud_and_versions(zk: KazooClient):
    zk.create("/crud", b"v0")
    with pytest.raises(NodeExistsError):
        zk.create("/crud", b"again")
    data, stat = zk.get("/crud")
    assert data == b"v0" and stat.version == 0 and stat.czxid == stat.mzxid
    zk.set("/crud", b"v1", version=0)
    with pytest.raises(BadVersionError):
        zk.set("/crud", b"stale", version=0)
    zk.create("/crud/child", b"")
    with pytest.raises(NotEmptyError):
        zk.delete("/crud")
    assert zk.get_children("/crud") == ["child"]
    assert zk.get("/crud")[1].numChildren == 1
    zk.delete("/crud", recursive=True)
    assert zk.exists("/crud") is None
    with pytest.raises(NoNodeError):
        zk.get("/crud")


def test_sequential_and_ephemeral_nodes(ensemble: Cluster, zk: KazooClient):
    zk.ensure_path("/seq")
    names = [zk.create("/seq/n-", b"", sequence=True) for _ in range(3)]
    assert names == ["/seq/n-0000000000", "/seq/n-0000000001", "/seq/n-0000000002"]
    other = KazooClient(hosts=hosts(ensemble), timeout=5)
    other.start(timeout=15)
    other.create("/seq/eph", b"", ephemeral=True)
    zk.sync("/seq")  # the two clients may sit on different nodes
    assert zk.exists("/seq/eph").ephemeralOwner == other.client_id[0]
    other.stop()  # closeSession deletes its ephemerals at once
    other.close()
    assert wait_for(lambda: zk.exists("/seq/eph") is None)
    zk.delete("/seq", recursive=True)


def test_multi_is_all_or_nothing(zk: KazooClient):
    zk.create("/multi", b"0")
    t = zk.transaction()
    t.create("/multi/a", b"")
    t.check("/multi", 0)
    t.set_data("/multi", b"1")
    results = t.commit()
    assert results[0] == "/multi/a" and results[1] is True and results[2].version == 1
    t = zk.transaction()
    t.create("/multi/b", b"")
    t.check("/multi", 0)
    results = t.commit()
    assert isinstance(results[0], RolledBackError) and isinstance(results[1], BadVersionError)
    assert zk.exists("/multi/b") is None
    zk.delete("/multi", recursive=True)


def test_the_loser_of_a_compare_and_set_race_reads_the_winner_on_its_own_node(ensemble: Cluster, zk: KazooClient):
    """A failed set is answered without a transaction, but only after the write it lost to is
    applied on the loser's node: a plain read there (no sync) right after BadVersion sees it."""
    zk.create("/race", b"0")
    clients = [KazooClient(hosts=hosts(ensemble, only=node), timeout=5) for node in (1, 2, 3)]
    try:
        for client in clients:
            client.start(timeout=15)
        for version in range(30):
            results = [client.set_async("/race", f"{i}:{version}".encode(), version=version)
                       for i, client in enumerate(clients)]
            outcomes = []
            for result in results:
                try:
                    outcomes.append(result.get(timeout=10))
                except BadVersionError as e:
                    outcomes.append(e)
            winners = [i for i, o in enumerate(outcomes) if not isinstance(o, BadVersionError)]
            assert len(winners) == 1, outcomes
            for i in range(len(clients)):
                if i != winners[0]:
                    data, stat = clients[i].get("/race")
                    assert (data, stat.version) == (f"{winners[0]}:{version}".encode(), version + 1)
    finally:
        for client in clients:
            client.stop()
            client.close()
    zk.delete("/race")


def test_watches_fire_once_in_order(zk: KazooClient):
    zk.create("/w", b"0")
    seen: list = []
    done = threading.Event()

    def watcher(event):
        seen.append((event.type, event.path))
        done.set()

    zk.get("/w", watch=watcher)
    zk.get_children("/w", watch=lambda e: seen.append((e.type, e.path)))
    zk.set("/w", b"1")
    zk.create("/w/kid", b"")
    assert wait_for(lambda: len(seen) == 2)
    assert seen == [("CHANGED", "/w"), ("CHILD", "/w")]
    zk.set("/w", b"2")  # one-shot: no second event
    time.sleep(0.2)
    assert len(seen) == 2
    zk.delete("/w", recursive=True)


def test_watch_survives_a_server_switch(ensemble: Cluster):
    """The watching client's server dies; kazoo reconnects to another server and its
    DataWatch (the kazoo recipe that re-arms after a reconnect; kazoo never sends
    setWatches) sees the change made meanwhile."""
    nodes = cfg.load(ensemble.path).nodes
    first, second, third = nodes
    watcher_client = KazooClient(hosts=f"{first.host}:{first.client_port},{third.host}:{third.client_port}",
                                 timeout=5, randomize_hosts=False)
    watcher_client.start(timeout=15)
    writer = KazooClient(hosts=f"{second.host}:{second.client_port}", timeout=5)
    writer.start(timeout=15)
    writer.create("/switch", b"0")
    seen = []
    watcher_client.DataWatch("/switch", lambda data, stat: seen.append(data))
    assert wait_for(lambda: seen == [b"0"])
    os.kill(localcluster.running_pid(first), signal.SIGKILL)
    writer.set("/switch", b"1")  # while the watcher is between servers
    assert wait_for(lambda: seen[-1:] == [b"1"], timeout_s=20), seen
    writer.set("/switch", b"2")  # and the re-armed watch keeps working on the new server
    assert wait_for(lambda: seen[-1:] == [b"2"]), seen
    assert watcher_client.client_id is not None and watcher_client.connected
    writer.delete("/switch")
    for c in (watcher_client, writer):
        c.stop()
        c.close()
    up = ensemble.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr


def test_ephemerals_of_a_sigkilled_client_go_after_its_session_timeout_and_not_before(ensemble: Cluster,
                                                                                      zk: KazooClient):
    script = (
        "import sys, time\n"
        "from kazoo.client import KazooClient\n"
        f"zk = KazooClient(hosts={hosts(ensemble)!r}, timeout=3)\n"
        "zk.start(timeout=15)\n"
        "zk.create('/doomed', b'', ephemeral=True)\n"
        "print(zk._session_timeout, flush=True)\n"
        "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        timeout_ms = int(child.stdout.readline())
        zk.sync("/doomed")  # the child's node may be ahead of ours
        assert zk.exists("/doomed") is not None
        child.kill()
        killed = time.monotonic()
        time.sleep(timeout_ms / 1000 * 0.6)
        assert zk.exists("/doomed") is not None, "ephemeral deleted before the session timeout"
        assert wait_for(lambda: zk.exists("/doomed") is None, timeout_s=timeout_ms / 1000 + 10)
        assert time.monotonic() - killed >= timeout_ms / 1000 * 0.6
    finally:
        child.kill()
        child.wait()


def test_digest_acls(ensemble: Cluster, zk: KazooClient):
    acl = make_digest_acl("alice", "secret", all=True)
    zk.create("/private", b"s", acl=[acl])
    with pytest.raises(NoAuthError):
        zk.get("/private")
    alice = KazooClient(hosts=hosts(ensemble), timeout=5, auth_data=[("digest", "alice:secret")])
    alice.start(timeout=15)
    alice.sync("/private")
    assert alice.get("/private")[0] == b"s"
    assert alice.get_acls("/private")[0] == [acl]
    alice.delete("/private")
    alice.stop()
    alice.close()


def test_recipes(ensemble: Cluster, zk: KazooClient):
    other = KazooClient(hosts=hosts(ensemble), timeout=5)
    other.start(timeout=15)
    counter = zk.Counter("/recipes/counter")
    counter += 5
    other_counter = other.Counter("/recipes/counter")
    other_counter += 2
    zk.sync("/recipes/counter")  # clients on different nodes: sync before reading another's write
    assert zk.Counter("/recipes/counter").value == 7

    lock = zk.Lock("/recipes/lock", "a")
    assert lock.acquire(timeout=5)
    other.sync("/recipes/lock")
    assert not other.Lock("/recipes/lock", "b").acquire(blocking=False)
    lock.release()
    assert other.Lock("/recipes/lock", "b").acquire(timeout=5)

    queue = zk.Queue("/recipes/queue")
    for item in (b"1", b"2", b"3"):
        queue.put(item)
    other.sync("/recipes/queue")
    assert [other.Queue("/recipes/queue").get() for _ in range(3)] == [b"1", b"2", b"3"]

    elected = []
    election = zk.Election("/recipes/election", "me")
    t = threading.Thread(target=election.run, args=(lambda: elected.append(True),), daemon=True)
    t.start()
    assert wait_for(lambda: elected == [True])
    assert election.contenders() == [] or isinstance(election.contenders(), list)

    barrier = zk.Barrier("/recipes/barrier")
    barrier.create()
    assert not barrier.wait(timeout=0.2)
    other.Barrier("/recipes/barrier").remove()
    assert barrier.wait(timeout=5)

    party = zk.Party("/recipes/party", "one")
    party.join()
    other.Party("/recipes/party", "two").join()
    zk.sync("/recipes/party")
    assert sorted(zk.Party("/recipes/party")) == ["one", "two"]
    other.stop()
    other.close()


def test_ip_acls_match_the_client_address(zk: KazooClient):
    from kazoo.security import ACL, Id, Permissions
    zk.create("/by-ip", b"local", acl=[ACL(Permissions.ALL, Id("ip", "127.0.0.1"))])
    assert zk.get("/by-ip")[0] == b"local"
    zk.create("/other-ip", b"x", acl=[ACL(Permissions.ALL, Id("ip", "10.9.8.7"))])
    with pytest.raises(NoAuthError):
        zk.get("/other-ip")
    zk.delete("/by-ip")
