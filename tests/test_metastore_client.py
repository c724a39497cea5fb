"""Our metastore client (metastore/client/__init__.py, recipes.py, clusterctl's metastore commands).

The first tests check the pure rules (watch tables, the reply pipeline, backoff,
states) without I/O. The rest run against a real 3-node clusterd ensemble
speaking the ZooKeeper protocol, started once for the module (as tests/test_metastore_kazoo.py):
a node the client is on gets SIGSTOPped or SIGKILLed, a client process gets
SIGSTOPped past its session timeout, and the client must say what happened.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial

import pytest
import trio
import trio.testing

from clusterd import config as cfg
from clusterd import localcluster
from clusterd.ctl import main as ctl
from metastore.client import MetaClient, SyncMetaClient
from metastore.client.core import (ANY_VERSION, TRANSITIONS, Backoff, Pipeline, ProtocolViolation, State,
                                   WatchEvent, WatchKind, WatchTable, check_transition, wire_version)
from metastore.client.ops import Check, Create, Delete, MultiFailed, RolledBack, SetData, digest_acl
from metastore.client.watches import Watch
from metastore.errors import (AuthFailed, BadVersion, ConnectionLoss, NoAuth, NodeExists, NoNode, NotEmpty,
                              RuntimeInconsistency, SessionExpired)
from metastore.wire import jute
from metastore.wire import jute_records as J
from metastore.wire.jute_defs import Err, EventType, OpCode, Xid
from metastore.client.recipes import IdGenerator, LeaderElection, LeadershipLost, Lock
from cluster_fixtures import ENV, Cluster, copy_config


# --- the pure rules ------------------------------------------------------------------

def test_one_shot_watches_fire_once_and_persistent_ones_keep_firing():
    table: WatchTable[str] = WatchTable()
    table.add(WatchKind.DATA, "/a", "data")
    table.add(WatchKind.EXIST, "/a/new", "exist")
    table.add(WatchKind.CHILD, "/a", "child")
    table.add(WatchKind.PERSISTENT, "/a", "persistent")
    table.add(WatchKind.PERSISTENT_RECURSIVE, "/", "recursive")
    changed = WatchEvent(EventType.NODE_DATA_CHANGED, "/a")
    assert table.targets(changed) == ["data", "persistent", "recursive"]
    assert table.targets(changed) == ["persistent", "recursive"]  # the data watch was one-shot
    # Recursive watches never hear of children changes; persistent ones on the parent do.
    assert table.targets(WatchEvent(EventType.NODE_CHILDREN_CHANGED, "/a")) == ["child", "persistent"]
    assert table.targets(WatchEvent(EventType.NODE_CREATED, "/a/new")) == ["exist", "recursive"]
    assert len(table) == 2 and sorted(table.clear()) == ["persistent", "recursive"]


def test_set_watches_carries_every_kind_relative_to_the_last_zxid_and_splits_big_sets():
    table: WatchTable[object] = WatchTable()
    table.add(WatchKind.DATA, "/d", 1)
    table.add(WatchKind.EXIST, "/e", 1)
    table.add(WatchKind.CHILD, "/c", 1)
    table.add(WatchKind.PERSISTENT, "/p", 1)
    table.add(WatchKind.PERSISTENT_RECURSIVE, "/r", 1)
    [request] = table.set_watches(relative_zxid=0x100000007)
    assert (request.relative_zxid, request.data_watches, request.exist_watches, request.child_watches,
            request.persistent_watches, request.persistent_recursive_watches) == \
        (0x100000007, ("/d",), ("/e",), ("/c",), ("/p",), ("/r",))
    for i in range(100):
        table.add(WatchKind.DATA, f"/many/{i:040d}", 1)
    batches = table.set_watches(7, max_path_bytes=1000)
    assert len(batches) > 4 and all(b.relative_zxid == 7 for b in batches)
    assert sum(len(b.data_watches) for b in batches) == 101


def test_replies_must_come_in_the_order_requests_were_sent():
    pipeline: Pipeline[str] = Pipeline()
    pipeline.push(1, 4, "first")
    pipeline.push(2, 4, "second")
    with pytest.raises(ProtocolViolation):
        pipeline.pop_reply(2)
    assert pipeline.pop_reply(1).call == "first"
    assert [o.call for o in pipeline.drain()] == ["second"] and len(pipeline) == 0


def test_backoff_is_jittered_doubling_and_bounded():
    backoff = Backoff(random.Random(7), 0.05, 1.0)
    delays = [backoff.next_delay_s() for _ in range(10)]
    assert all(0.025 <= d <= 1.0 for d in delays) and delays[-1] >= 0.5
    backoff.reset()
    assert backoff.next_delay_s() <= 0.05


def test_states_and_versions_are_explicit():
    check_transition(State.SUSPENDED, State.CONNECTED)
    with pytest.raises(AssertionError):
        check_transition(State.LOST, State.CONNECTED)  # LOST is terminal
    assert not any(old is State.LOST for old, _ in TRANSITIONS)
    assert wire_version(ANY_VERSION) == -1 and wire_version(3) == 3
    with pytest.raises(ValueError):
        wire_version(-1)  # "any" is ANY_VERSION, never a bare -1


# --- against a real ensemble ----------------------------------------------------------

multiprocess = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("metaclient")
    path = copy_config(folder)
    path.write_text(path.read_text().replace("[cluster]\n", "[cluster]\nmin_session_timeout_ms = 1000\n", 1))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def addresses(cluster: Cluster) -> list[tuple[str, int]]:
    return cluster.config.client_addresses()


def node_at(cluster: Cluster, address: tuple[str, int] | None) -> cfg.NodeConfig:
    assert address is not None
    return next(n for n in cluster.config.nodes if (n.host, n.client_port) == address)


def others(cluster: Cluster, node: cfg.NodeConfig) -> list[tuple[str, int]]:
    return [(n.host, n.client_port) for n in cluster.config.nodes if n.id != node.id]


async def followers(cluster: Cluster) -> list[tuple[str, int]]:
    """Client addresses of the followers: a client put there can lose its server while
    the leader, and so every other client's writes, carry on undisturbed."""
    statuses = await localcluster.fetch_statuses(cluster.config)
    return [(n.host, n.client_port) for n in cluster.config.nodes if (statuses[n.id] or {}).get("role") == "follower"]


def run(async_fn, *args, timeout_s: float = 30):
    async def guarded():
        with trio.fail_after(timeout_s):
            return await async_fn(*args)
    return trio.run(guarded)


def restart(cluster: Cluster) -> None:
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr


async def wait_for_state(client: MetaClient, wanted: State) -> None:
    async for state in client.states():
        if state is wanted:
            return


async def record_states(client: MetaClient, into: list[State]) -> None:
    async for state in client.states():
        into.append(state)


@multiprocess
def test_crud_versions_and_typed_errors(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as c:
            assert c.state is State.CONNECTED and c.session_timeout_ms > 0
            assert await c.create("/crud", b"v0") == "/crud"
            with pytest.raises(NodeExists):
                await c.create("/crud")
            data, stat = await c.get("/crud")
            assert data == b"v0" and stat.version == 0 and stat.czxid == stat.mzxid
            stat = await c.set("/crud", b"v1", version=0)
            assert stat.version == 1
            with pytest.raises(BadVersion):
                await c.set("/crud", b"stale", version=0)
            assert (await c.set("/crud", b"v2")).version == 2  # ANY_VERSION
            await c.create("/crud/kid")
            with pytest.raises(NotEmpty):
                await c.delete("/crud")
            assert await c.children("/crud") == ["kid"]
            assert (await c.exists("/crud")).num_children == 1
            await c.delete("/crud/kid", version=0)
            await c.delete("/crud", version=2)
            assert await c.exists("/crud") is None
            with pytest.raises(NoNode) as missing:
                await c.get("/crud")
            assert missing.value.path == "/crud"
            # Linearizable read: sync, then read, through another node than the writer's.
            writer_node = node_at(ensemble, c.server)
            async with MetaClient(others(ensemble, writer_node)) as reader:
                await c.create("/fresh", b"x")
                assert (await reader.get("/fresh", linearizable=True))[0] == b"x"
            await c.delete("/fresh")
    run(scenario)


@multiprocess
def test_sequential_and_ephemeral_nodes(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as c:
            await c.create("/seq")
            names = [await c.create("/seq/n-", sequential=True) for _ in range(3)]
            assert names == ["/seq/n-0000000000", "/seq/n-0000000001", "/seq/n-0000000002"]
            other = MetaClient(addresses(ensemble))
            async with other:
                await other.create("/seq/eph", ephemeral=True)
                await c.sync("/seq")  # the two clients may sit on different nodes
                assert (await c.exists("/seq/eph")).ephemeral_owner == other.session_id
            # close() ended the session: its ephemeral is gone at once, as seen by a sync-then-read.
            assert other.state is State.LOST and await c.exists("/seq/eph", linearizable=True) is None
            with pytest.raises(SessionExpired):
                await other.get("/seq")
            await c.delete_recursive("/seq")
    run(scenario)


@multiprocess
def test_multi_is_all_or_nothing_with_per_op_results(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as c:
            await c.create("/multi", b"0")
            results = await c.multi([Create("/multi/a"), Check("/multi", 0), SetData("/multi", b"1", 0)])
            assert results[0] == "/multi/a" and results[1] is None and results[2].version == 1
            with pytest.raises(MultiFailed) as failed:
                await c.multi([Create("/multi/b"), Delete("/multi/a"), Check("/multi", 0), SetData("/multi", b"2")])
            e = failed.value
            assert e.index == 2 and isinstance(e.error, BadVersion)
            assert [type(r) for r in e.results] == [RolledBack, RolledBack, BadVersion, RuntimeInconsistency]
            assert await c.exists("/multi/b") is None and await c.exists("/multi/a") is not None
            await c.delete_recursive("/multi")
    run(scenario)


@multiprocess
def test_many_requests_in_flight_on_one_connection_each_get_their_own_reply(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble), max_in_flight=64) as c:
            await c.create("/pipe")
            created: dict[int, str] = {}

            async def make(i: int) -> None:
                created[i] = await c.create(f"/pipe/{i}", str(i).encode())

            async with trio.open_nursery() as nursery:
                for i in range(150):
                    nursery.start_soon(make, i)
            assert created == {i: f"/pipe/{i}" for i in range(150)}
            assert c.statistics()["connects"] == 1  # one connection carried them all
            reads = {}

            async def read(i: int) -> None:
                reads[i] = (await c.get(f"/pipe/{i}"))[0]

            async with trio.open_nursery() as nursery:
                for i in range(150):
                    nursery.start_soon(read, i)
            assert reads == {i: str(i).encode() for i in range(150)}
            await c.delete_recursive("/pipe")
    run(scenario)


@multiprocess
def test_watches_are_one_shot_in_order_and_persistent_watches_stream(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as c:
            await c.create("/w", b"0")
            data_watch, child_watch, exist_watch = Watch(), Watch(), Watch()
            await c.get("/w", watch=data_watch)
            await c.children("/w", watch=child_watch)
            assert await c.exists("/w/later", watch=exist_watch) is None
            with pytest.raises(ValueError):
                await c.get("/w", watch=data_watch)  # a Watch serves one read
            recursive = await c.add_watch("/w", recursive=True)
            await c.set("/w", b"1")
            await c.create("/w/later")
            await c.set("/w", b"2")  # one-shot: the data watch does not fire again
            assert await data_watch.wait() == WatchEvent(EventType.NODE_DATA_CHANGED, "/w")
            assert await child_watch.wait() == WatchEvent(EventType.NODE_CHILDREN_CHANGED, "/w")
            assert await exist_watch.wait() == WatchEvent(EventType.NODE_CREATED, "/w/later")
            async with recursive:
                seen = [await recursive.__anext__() for _ in range(3)]
            assert seen == [WatchEvent(EventType.NODE_DATA_CHANGED, "/w"),
                            WatchEvent(EventType.NODE_CREATED, "/w/later"),
                            WatchEvent(EventType.NODE_DATA_CHANGED, "/w")]
            assert [e async for e in recursive] == []  # closed: the iteration ends
            missing = Watch()
            with pytest.raises(NoNode):
                await c.get("/w/none", watch=missing)
            assert not missing.armed  # a failed get arms nothing, so the Watch can be reused
            await c.delete_recursive("/w")
            assert c.statistics()["watches"] == 0
    run(scenario)


@multiprocess
def test_a_server_switch_keeps_watches_and_fails_only_requests_in_flight(ensemble: Cluster):
    """The client's server is SIGSTOPped with a read in flight; meanwhile another client
    changes what it watches; the server is SIGKILLed. The read fails with ConnectionLoss
    (never retried), the client goes SUSPENDED then CONNECTED on another server, and
    SetWatches2 (relative to its last zxid) fires the watches for the changes it missed."""
    async def scenario():
        async with MetaClient(await followers(ensemble), session_timeout_ms=6000) as c:
            victim = node_at(ensemble, c.server)
            async with MetaClient(others(ensemble, victim)) as writer:
                await writer.create("/switch", b"0")
                # Another session wrote it through another server: reads are sequentially
                # consistent, so sync first (as a ZooKeeper client must) or c's server may lag.
                await c.sync("/switch")
                data_watch, child_watch, exist_watch = Watch(), Watch(), Watch()
                await c.get("/switch", watch=data_watch)
                await c.children("/switch", watch=child_watch)
                await c.exists("/switch/new", watch=exist_watch)
                states: list[State] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(record_states, c, states)
                    pid = localcluster.running_pid(victim)
                    os.kill(pid, signal.SIGSTOP)
                    outcome: list[BaseException] = []

                    async def read_in_flight():
                        with pytest.raises(ConnectionLoss) as lost:
                            await c.get("/switch")
                        outcome.append(lost.value)

                    nursery.start_soon(read_in_flight)
                    await trio.testing.wait_all_tasks_blocked(0.05)
                    assert c.statistics()["in_flight"] == 1
                    await writer.set("/switch", b"1")
                    await writer.create("/switch/new")
                    os.kill(pid, signal.SIGKILL)
                    assert await data_watch.wait() == WatchEvent(EventType.NODE_DATA_CHANGED, "/switch")
                    assert await child_watch.wait() == WatchEvent(EventType.NODE_CHILDREN_CHANGED, "/switch")
                    assert await exist_watch.wait() == WatchEvent(EventType.NODE_CREATED, "/switch/new")
                    assert len(outcome) == 1 and "in flight" in str(outcome[0])
                    await c.wait_connected()
                    await trio.testing.wait_all_tasks_blocked()  # the recorder has seen it too
                    assert states == [State.CONNECTED, State.SUSPENDED, State.CONNECTED]
                    assert node_at(ensemble, c.server).id != victim.id
                    assert (await c.get("/switch"))[0] == b"1"  # the same session carries on
                    nursery.cancel_scope.cancel()
                await writer.delete_recursive("/switch")
    try:
        run(scenario)
    finally:
        restart(ensemble)


@multiprocess
def test_requests_wait_while_suspended_bounded_by_reconnect_wait(ensemble: Cluster):
    """Clients that know only one node: it is SIGKILLed. A request waits for the
    reconnection, up to reconnect_wait_s; when the node is back it is answered."""
    node = ensemble.config.nodes[0]
    only = [(node.host, node.client_port)]

    async def scenario():
        async with MetaClient(only, session_timeout_ms=8000) as patient, \
                MetaClient(only, session_timeout_ms=8000, reconnect_wait_s=0.2) as hasty:
            await patient.ensure_path("/waiting")
            os.kill(localcluster.running_pid(node), signal.SIGKILL)
            await wait_for_state(hasty, State.SUSPENDED)
            await wait_for_state(patient, State.SUSPENDED)
            with pytest.raises(ConnectionLoss, match="not connected"):
                await hasty.get("/waiting")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, partial(restart, ensemble))
                data, _ = await patient.get("/waiting")  # waits for the node to come back
            assert data == b"" and patient.state is State.CONNECTED
            await patient.delete("/waiting")
    run(scenario, timeout_s=40)


EXPIRING_CLIENT = """
import json, sys, trio
from metastore.client import MetaClient, Watch

async def main():
    async with MetaClient([tuple(a) for a in json.loads(sys.argv[1])], session_timeout_ms=1000) as c:
        await c.create("/expiring", b"", ephemeral=True)
        watch = Watch()
        await c.get("/expiring", watch=watch)
        async for state in c.states():
            print(state.name, flush=True)
        for attempt in (c.get("/expiring"), watch.wait()):
            try:
                await attempt
            except Exception as e:
                print(type(e).__name__, flush=True)

trio.run(main)
"""


@multiprocess
def test_a_client_stopped_past_its_session_timeout_finds_its_session_lost(ensemble: Cluster):
    """A real client process, SIGSTOPped: the leader expires its session (its ephemeral
    goes); on SIGCONT the client sees its connection gone (SUSPENDED), a server tells
    it the session expired (LOST), and every request and watch fails with SessionExpired."""
    child = subprocess.Popen([sys.executable, "-c", EXPIRING_CLIENT, json.dumps(addresses(ensemble))],
                             env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "CONNECTED"
        with SyncMetaClient(addresses(ensemble)) as observer:
            assert observer.exists("/expiring") is not None
            child.send_signal(signal.SIGSTOP)
            gone = Watch()
            if observer.exists("/expiring", watch=gone) is not None:
                assert observer.wait(gone, timeout_s=15).type == EventType.NODE_DELETED
        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate(timeout=20)
        assert out.split() == ["SUSPENDED", "LOST", "SessionExpired", "SessionExpired"]
    finally:
        child.kill()
        child.wait()


@multiprocess
def test_digest_auth_and_acls(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as c, \
                MetaClient(addresses(ensemble), auth=[("digest", "alice:secret")]) as alice:
            acl = digest_acl("alice", "secret")
            await alice.create("/private", b"s", acl=[acl])
            await c.sync("/private")  # the two clients may sit on different nodes (reads are sequentially consistent)
            with pytest.raises(NoAuth):
                await c.get("/private")
            assert (await alice.get("/private"))[0] == b"s"
            assert (await alice.get_acl("/private"))[0] == [acl]
            await c.add_auth("digest", "alice:secret")  # now c is alice too
            assert (await c.get("/private"))[0] == b"s"
            await c.delete("/private")
        with pytest.raises(AuthFailed):
            async with MetaClient(addresses(ensemble), auth=[("kerberos", "x")]):
                pass
    run(scenario)


@multiprocess
def test_cas_under_contention_counts_every_successful_increment(ensemble: Cluster):
    async def scenario():
        returned: list[int] = []

        async def increments(client: MetaClient, count: int) -> None:
            for _ in range(count):
                data, _ = await client.cas("/counter", lambda d: str(int(d or b"0") + 1).encode())
                returned.append(int(data))

        async with MetaClient(addresses(ensemble), rng=random.Random(1)) as a, \
                MetaClient(addresses(ensemble), rng=random.Random(2)) as b, \
                MetaClient(addresses(ensemble), rng=random.Random(3)) as c, \
                MetaClient(addresses(ensemble), rng=random.Random(4)) as d:
            async with trio.open_nursery() as nursery:
                for client in (a, b, c, d):
                    for _ in range(2):  # two tasks per client: conflicts inside a session too
                        nursery.start_soon(increments, client, 10)
            data, stat = await a.get("/counter", linearizable=True)
            assert int(data) == len(returned) == 80 and stat.version == 79
            assert sorted(returned) == list(range(1, 81))  # each value written exactly once
            with pytest.raises(NoNode):
                await a.cas("/absent", lambda d: b"x", create=False)
            await a.delete("/counter")
    run(scenario)


@multiprocess
def test_lock_is_exclusive_and_passes_to_the_next_in_line(ensemble: Cluster):
    async def scenario():
        inside: list[str] = []
        log: list[tuple[str, str]] = []

        async def worker(client: MetaClient, name: str) -> None:
            for _ in range(3):
                async with Lock(client, "/locks/one", name.encode()):
                    inside.append(name)
                    assert len(inside) == 1, inside
                    log.append(("in", name))
                    await trio.sleep(0.005)
                    inside.remove(name)

        async with MetaClient(addresses(ensemble)) as a, MetaClient(addresses(ensemble)) as b, \
                MetaClient(addresses(ensemble)) as c:
            async with trio.open_nursery() as nursery:
                for client, name in ((a, "a"), (b, "b"), (c, "c")):
                    nursery.start_soon(worker, client, name)
            assert sorted(log) == sorted([("in", n) for n in "abc" for _ in range(3)])
            held = Lock(a, "/locks/one", b"a")
            await held.acquire()
            waiter = Lock(b, "/locks/one", b"b")
            with trio.move_on_after(0.2):
                await waiter.acquire()  # cancelled while queued: it withdraws
            assert await held.contenders() == [b"a"]
            await held.release()
            await a.delete_recursive("/locks")
    run(scenario)


@multiprocess
def test_leader_election_hands_over_when_the_leaders_server_dies(ensemble: Cluster):
    async def scenario():
        async with MetaClient(await followers(ensemble), session_timeout_ms=6000) as a:
            victim = node_at(ensemble, a.server)
            async with MetaClient(others(ensemble, victim)) as b:
                first, second = LeaderElection(a, "/election", b"a"), LeaderElection(b, "/election", b"b")
                a_leads, a_stepped_down, b_leads = trio.Event(), trio.Event(), trio.Event()

                async def lead_a():
                    with pytest.raises(LeadershipLost, match="SUSPENDED"):
                        async with first.lead():
                            a_leads.set()
                            await trio.sleep_forever()
                    a_stepped_down.set()

                async def lead_b():
                    async with second.lead():
                        b_leads.set()
                        await trio.sleep_forever()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lead_a)
                    await a_leads.wait()
                    queued = Watch()
                    assert len(await b.children("/election", watch=queued)) == 1
                    nursery.start_soon(lead_b)
                    await queued.wait()  # b has joined the queue
                    assert await second.contenders() == [b"a", b"b"] and await second.leader() == b"a"
                    os.kill(localcluster.running_pid(victim), signal.SIGKILL)
                    await a_stepped_down.wait()
                    await b_leads.wait()
                    assert await second.contenders() == [b"b"]
                    nursery.cancel_scope.cancel()
                await b.delete_recursive("/election")
    try:
        run(scenario)
    finally:
        restart(ensemble)


@multiprocess
def test_id_generator_hands_out_unique_increasing_ids_in_batches(ensemble: Cluster):
    async def scenario():
        async with MetaClient(addresses(ensemble)) as a, MetaClient(addresses(ensemble)) as b:
            generators = [IdGenerator(a, "/ids/ledger"), IdGenerator(b, "/ids/ledger", batch=10),
                          IdGenerator(a, "/ids/ledger", batch=3)]
            per_generator: list[list[int]] = [[], [], []]

            async def take(i: int) -> None:
                for _ in range(20):
                    per_generator[i].append(await generators[i].next())

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(take, i)
            every = [x for ids in per_generator for x in ids]
            assert len(set(every)) == 60 and min(every) >= 1
            assert all(ids == sorted(ids) for ids in per_generator)
            block = await generators[0].next_batch(5)
            assert len(block) == 5 and block.start > max(per_generator[0])
            await a.delete_recursive("/ids")
    run(scenario)


@multiprocess
def test_a_watch_set_by_a_read_fires_only_for_changes_after_what_the_read_returned(ensemble: Cluster):
    """ZooKeeper's ordering guarantee: a client sees the watch event for a change before
    it sees data that reflects the change. So after `get(path, watch=w)` returned version
    v and w fired, a read sent after the event must return a version above v. Writers
    keep /order busy so that the leader commits (and followers apply) in batches."""
    async def scenario():
        reader_node = (await followers(ensemble))[0]
        async with MetaClient([reader_node]) as reader, MetaClient(addresses(ensemble)) as w1, \
                MetaClient(addresses(ensemble)) as w2:
            await w1.create("/order", b"")
            await reader.sync("/order")  # the reader's node may not have applied the create yet
            stale: list[tuple[int, int]] = []
            with trio.move_on_after(15):  # the bug shows within about a second
                async with trio.open_nursery() as nursery:
                    async def write(client: MetaClient) -> None:
                        while True:
                            async with trio.open_nursery() as batch:
                                for _ in range(32):
                                    batch.start_soon(client.set, "/order", b"x")

                    async def watch_and_read() -> None:
                        while True:
                            watch = Watch()
                            _, seen = await reader.get("/order", watch=watch)
                            await watch.wait()
                            _, after = await reader.get("/order")
                            if after.version <= seen.version:
                                stale.append((seen.version, after.version))
                                nursery.cancel_scope.cancel()

                    for client in (w1, w2):
                        nursery.start_soon(write, client)
                    for _ in range(8):
                        nursery.start_soon(watch_and_read)
            await w1.delete("/order")
            assert stale == [], f"watch fired for a change older than the data read with it: {stale}"
    run(scenario, timeout_s=40)


# --- clusterctl ----------------------------------------------------------------------

def clusterctl(capsys, cluster: Cluster, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        ctl.main(["--config", str(cluster.path), *args])
    out, err = capsys.readouterr()
    return done.value.code, out, err


@multiprocess
def test_clusterctl_metastore_commands_with_json(ensemble: Cluster, capsys):
    def ok(*args: str) -> dict:
        status, out, err = clusterctl(capsys, ensemble, *args, "--json")
        assert status == 0, err
        return json.loads(out)

    assert ok("create", "/cli", "hello")["path"] == "/cli"
    got = ok("get", "/cli")
    assert (got["data"], got["stat"]["version"]) == ("hello", 0)
    assert ok("set", "/cli", "v2", "--version", "0")["stat"]["version"] == 1
    status, _, err = clusterctl(capsys, ensemble, "set", "/cli", "v3", "--version", "0")
    assert status == 1 and "BadVersion" in err
    assert ok("create", "/cli/s-", "--sequential")["path"] == "/cli/s-0000000000"
    assert ok("ls", "/cli") == {"path": "/cli", "children": ["s-0000000000"]}
    assert ok("stat", "/cli")["stat"]["num_children"] == 1
    assert ok("cas", "/cli/n", "--increment")["data"] == "1"
    assert ok("cas", "/cli/n", "--increment", "5")["data"] == "6"
    assert ok("cas", "/cli/n", "--expect", "6", "--value", "10")["data"] == "10"
    status, _, err = clusterctl(capsys, ensemble, "cas", "/cli/n", "--expect", "6", "--value", "11")
    assert status == 1 and "nothing written" in err
    status, _, err = clusterctl(capsys, ensemble, "rm", "/cli")
    assert status == 1 and "NotEmpty" in err
    assert ok("rm", "/cli", "--recursive") == {"path": "/cli", "deleted": True}
    status, _, err = clusterctl(capsys, ensemble, "get", "/cli")
    assert status == 1 and "NoNode" in err
    status, _, err = clusterctl(capsys, ensemble, "put", "key", "value")
    assert status == 2 and "use `create PATH DATA` or `set PATH DATA`" in err
    # And once as an operator runs it: a process of its own, plain output.
    created = ensemble.ctl("create", "/proc", "x")
    assert (created.returncode, created.stdout) == (0, "/proc\n"), created.stderr
    got = ensemble.ctl("get", "/proc")
    assert (got.returncode, got.stdout, got.stderr.split()[0]) == (0, "x\n", "version=0")
    assert ensemble.ctl("rm", "/proc").returncode == 0


@multiprocess
def test_sync_facade_from_a_plain_thread(ensemble: Cluster):
    results = []

    def user():
        with SyncMetaClient(addresses(ensemble)) as c:
            watch = Watch()
            assert c.exists("/facade", watch=watch) is None
            c.create("/facade", b"1")
            results.append(c.wait(watch, timeout_s=5))
            results.append(c.cas("/facade", lambda d: d + b"2")[0])
            c.delete("/facade")
            assert c.state is State.CONNECTED
        results.append(c.state)

    thread = threading.Thread(target=user)
    thread.start()
    thread.join(30)
    assert results == [WatchEvent(EventType.NODE_CREATED, "/facade"), b"12", State.LOST]


def test_a_linearizable_read_sends_its_sync_and_the_read_before_either_reply():
    """One round trip: a server that answers nothing until it holds two requests still answers
    `exists(linearizable=True)`; a client that awaited the sync's reply first would hang here."""
    seen: list[OpCode] = []

    async def server(stream: trio.SocketStream) -> None:
        reader, frames, held = jute.FrameReader(), [], []
        while not frames:
            frames += reader.feed(await stream.receive_some(65536))
        jute.decode_connect_request(frames.pop(0))
        await stream.send_all(jute.frame(jute.encode_connect_response(J.ConnectResponse(0, 10_000, 0x51, b"\1" * 16))))
        while len(held) < 2:
            for header, body in map(jute.decode_request, frames):
                if header.type == OpCode.PING:
                    await stream.send_all(jute.frame(jute.encode_reply(J.ReplyHeader(Xid.PING, 0, 0))))
                else:
                    held.append((header, body))
            frames = [] if len(held) >= 2 else reader.feed(await stream.receive_some(65536))
        seen.extend(header.type for header, _ in held)
        for header, body in held:  # in order, as a server answers one connection
            if header.type == OpCode.SYNC:
                await stream.send_all(jute.frame(jute.encode_reply(J.ReplyHeader(header.xid, 0, 0), J.SyncResponse(body.path))))
            else:
                await stream.send_all(jute.frame(jute.encode_reply(J.ReplyHeader(header.xid, 0, Err.NO_NODE))))
        await trio.sleep_forever()

    async def scenario() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                [listener] = await nursery.start(partial(trio.serve_tcp, server, 0, host="127.0.0.1"))
                port = listener.socket.getsockname()[1]
                async with MetaClient([("127.0.0.1", port)]) as c:
                    assert await c.exists("/x", linearizable=True) is None
                nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert seen == [OpCode.SYNC, OpCode.EXISTS]
