"""Partitions on real hosts: a 3-voter cluster plus a bookie-only node, each in a network namespace
of its own with its own address (tests/netns_rig.py), partitioned by pulling cables at the switch.

The module shares one cluster: each story starts from a settled cluster and leaves one (every link
healed, every node running). Clients are real kazoo and the real ledger SDK, in the rig's client
namespace; a client on the old leader's side of a partition runs inside that node's namespace.
Skipped (with the reason) where network namespaces cannot be made (not root, no `ip netns`).
"""

from __future__ import annotations

import argparse
import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from bookie.client import BookiePool
from ledger.client import LedgerClient
from ledger.client_sync import SyncLedgerClient
from cluster_fixtures import stop_kazoo
from netns_rig import NetnsRig, netns_rig
from replay.logs import check_logs_converged
from replay.verify_zab import add_arguments, verify
from zab.core.txn import Txn
from zab.storage.record import scan_records
from zab.storage.recovery import TXNLOG_DIR
from zab.storage.txnlog import SEGMENT_HEADER_BYTES

pytestmark = [pytest.mark.multiprocess, pytest.mark.netns]

VOTERS = (1, 2, 3)
SPARE_BOOKIE = 4
ROLES = {1: ["voter", "bookie"], 2: ["voter", "bookie"], 3: ["voter", "bookie"], SPARE_BOOKIE: ["bookie"]}
BIND_ALL = 3  # binds "0.0.0.0", as in a container; the others dial its host
SESSION_TIMEOUT_S = 4  # kazoo notices a dead server after 2/3 of it
SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # "super:test": reconfig is the super user's


@pytest.fixture(scope="module")
def rig(tmp_path_factory) -> Iterator[NetnsRig]:
    with netns_rig(tmp_path_factory.mktemp("netns"), ROLES, bind_hosts={BIND_ALL: "0.0.0.0"},
                   cluster_settings=f'super_digest = "{SUPER_DIGEST}"\n') as rig:
        rig.start_all()
        with rig.client():
            rig.wait_settled(timeout_s=60)
        yield rig
        rig.stop_all()
    assert rig.leftovers() == [], "the rig left namespaces or links behind"


@pytest.fixture
def client_side(rig: NetnsRig) -> Iterator[NetnsRig]:
    """The test runs in the client namespace, from a settled cluster, and leaves every link healed."""
    with rig.client():
        try:
            rig.wait_settled()
            yield rig
        finally:
            for node_id in rig.node_ids:
                rig.heal(node_id)


@contextmanager
def kazoo(rig: NetnsRig, node_ids: list[int] | None = None, first: int | None = None) -> Iterator[KazooClient]:
    """A kazoo session through `node_ids` (default: every voter), connecting to `first` first."""
    ids = sorted(node_ids or VOTERS, key=lambda i: i != first)
    client = KazooClient(hosts=",".join(rig.client_hosts([i]) for i in ids), timeout=SESSION_TIMEOUT_S,
                         randomize_hosts=first is None, connection_retry={"max_tries": -1, "max_delay": 0.2})
    client.start(timeout=20)
    try:
        yield client
    finally:
        stop_kazoo(client)


def write(zk: KazooClient, folder: str, count: int) -> list[str]:
    """`count` creates under `folder`, each retried until acknowledged; a create whose connection was
    lost in flight is read back first (its outcome is unknown), so every path returned is acknowledged."""
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=30)
    retry(zk.ensure_path, folder)
    paths = [f"{folder}/w{i}" for i in range(count)]
    for path in paths:
        retry(lambda: zk.exists(path) or zk.create(path, path.encode()))
    return paths


def assert_everywhere(rig: NetnsRig, paths: list[str], absent: tuple[str, ...] = ()) -> None:
    """Every path reads back through each voter alone (after a sync), and none of `absent` does."""
    for node_id in VOTERS:
        with kazoo(rig, [node_id]) as zk:
            zk.sync("/")
            missing = [p for p in paths if zk.exists(p) is None]
            assert not missing, f"node {node_id} lacks {len(missing)} acknowledged writes: {missing[:5]}"
            assert [p for p in absent if zk.exists(p) is not None] == [], f"node {node_id}"


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_caught_up(rig: NetnsRig, timeout_s: float = 30) -> None:
    """Until every voter has committed the same zxid."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = rig.statuses(list(VOTERS))
        committed = {i: s and s["last_committed_zxid"] for i, s in statuses.items()}
        if None not in committed.values() and len(set(committed.values())) == 1:
            return
        assert time.monotonic() < deadline, f"voters did not catch up: {committed}"
        time.sleep(0.1)


def four_letter_word(host: str, port: int, word: bytes = b"ruok") -> bytes:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(word)
        return s.recv(64)


# -- the stories -----------------------------------------------------------------------------------

def test_listeners_bind_bind_host_while_the_others_dial_host(client_side):
    """Node 3's bind_host is "0.0.0.0": inside its namespace it answers on 127.0.0.1 too, while
    node 1 (no bind_host) listens on its host alone; everyone reaches both at their host."""
    rig = client_side
    for node_id in (1, BIND_ALL):
        assert four_letter_word(rig.address(node_id), 2181) == b"imok"
    with rig.inside(BIND_ALL):
        assert four_letter_word("127.0.0.1", 2181) == b"imok"
    with rig.inside(1):
        with pytest.raises(ConnectionRefusedError):
            four_letter_word("127.0.0.1", 2181)


def test_an_isolated_leader_is_replaced_stops_acknowledging_and_no_acknowledged_write_is_lost(client_side):
    rig = client_side
    leader = rig.leader(rig.wait_settled())
    with kazoo(rig, first=leader) as zk:  # connected to the leader: it must fail over
        acked = write(zk, "/iso-leader/before", 30)
        with rig.inside(leader):  # a client beside the leader, on its side of the partition to come
            beside = KazooClient(hosts=rig.client_hosts([leader]), timeout=SESSION_TIMEOUT_S)
            beside.start(timeout=10)
        try:
            rig.isolate(leader)
            stale = beside.create_async("/iso-leader/stale", b"x")  # the old leader can reach no quorum
            with pytest.raises((KazooException, KazooTimeoutError)) as refused:
                stale.get(timeout=SESSION_TIMEOUT_S)
            print(f"the write through the isolated leader {leader}: {refused.value!r}")
            with rig.inside(leader):  # seen from its own side, it gave up leading (sync_limit_ticks)
                assert wait_for(lambda: rig.statuses([leader])[leader]["role"] == "looking", 10)
            majority = rig.wait_settled([i for i in rig.node_ids if i != leader])
            assert rig.leader(majority) != leader
            acked += write(zk, "/iso-leader/during", 30)  # failed over to the majority
        finally:
            beside.stop()  # before the heal: nothing of it may reach the old leader afterwards
            beside.close()
            rig.heal(leader)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked, absent=("/iso-leader/stale",))


def test_an_isolated_follower_misses_writes_and_catches_up_after_the_heal(client_side):
    rig = client_side
    statuses = rig.wait_settled()
    leader = rig.leader(statuses)
    follower = next(i for i in VOTERS if i != leader)
    rig.isolate(follower)
    with kazoo(rig, [i for i in VOTERS if i != follower]) as zk:
        acked = write(zk, "/iso-follower", 60)
        behind = rig.statuses([follower])[follower]
        assert behind is None  # unreachable from here while isolated
    rig.heal(follower)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked)


def test_asymmetric_loss_the_leaders_packets_are_lost_while_the_followers_reach_it(client_side):
    """One-way loss (tests/netns_rig.py `lose_one_way`): what the leader sends to both followers is
    lost, what they send arrives. They stop hearing it and elect one of them; the old leader stops
    acknowledging (it hears no ACK: TCP's own are lost too); clients fail over; after the fault
    ends, nothing acknowledged is lost and the old leader's stale write never shows."""
    rig = client_side
    leader = rig.leader(rig.wait_settled())
    followers = [i for i in VOTERS if i != leader]
    with kazoo(rig, first=leader) as zk:
        acked = write(zk, "/one-way/before", 20)
        with rig.inside(leader):
            beside = KazooClient(hosts=rig.client_hosts([leader]), timeout=SESSION_TIMEOUT_S)
            beside.start(timeout=10)
        try:
            rig.lose_one_way(leader, followers)
            stale = beside.create_async("/one-way/stale", b"x")
            with pytest.raises((KazooException, KazooTimeoutError)):
                stale.get(timeout=SESSION_TIMEOUT_S)
            majority = rig.wait_settled(followers)
            assert rig.leader(majority) in followers
            acked += write(zk, "/one-way/during", 20)
        finally:
            beside.stop()
            beside.close()
            rig.restore_one_way(leader, followers)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked, absent=("/one-way/stale",))


def test_a_sigkilled_leader_is_replaced_and_rejoins(client_side):
    rig = client_side
    leader = rig.leader(rig.wait_settled())
    with kazoo(rig, first=leader) as zk:
        acked = write(zk, "/kill-leader/before", 30)
        rig.kill(leader)
        majority = rig.wait_settled([i for i in rig.node_ids if i != leader])
        assert rig.leader(majority) != leader
        acked += write(zk, "/kill-leader/during", 30)
    rig.start(leader)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked)


class QuickLedgerClient(SyncLedgerClient):
    """The SDK with a 2 s bookie request timeout (10 s by default), so an isolated bookie is
    replaced within the test's budget."""

    async def _open(self, stack: AsyncExitStack) -> LedgerClient:
        meta = await stack.enter_async_context(self._meta_factory())
        pool = await stack.enter_async_context(BookiePool(self._addresses, timeout_s=2.0, connect_timeout_s=1.0))
        return await stack.enter_async_context(LedgerClient(meta, pool, self._manager, **self._options))


def test_ledger_appends_go_on_while_a_bookie_of_the_ensemble_is_isolated(client_side):
    rig = client_side
    leader = rig.leader(rig.wait_settled())
    hosts = [(n.host, n.client_port) for n in rig.config.ensemble]
    with QuickLedgerClient(hosts) as ledgers:
        writer = ledgers.create(3, 2, 2, password=b"pw")
        payloads = [f"entry {i}".encode() for i in range(60)]
        acked = writer.append_many(payloads[:20])
        first = ledgers.open(writer.ledger_id, b"pw").metadata
        victim = next(b for b in first.last_fragment.ensemble if b != leader)  # a bookie, not the Zab leader
        rig.isolate(victim)
        try:
            for payload in payloads[20:]:
                acked.append(writer.append(payload))
            changed = ledgers.open(writer.ledger_id, b"pw").metadata
            assert victim not in changed.last_fragment.ensemble, changed  # an ensemble change replaced it
        finally:
            rig.heal(victim)
        assert acked == list(range(60))
        writer.close()
    rig.wait_settled()
    with QuickLedgerClient(hosts) as ledgers:  # a fresh client reads every acknowledged entry back
        entries = ledgers.open(writer.ledger_id, b"pw").read(0, 59)
        assert [e.payload for e in entries] == payloads


def test_a_follower_removed_then_added_back_by_reconfig_while_kazoo_writes(client_side):
    """Reconfig under load on separate hosts: a follower leaves the ensemble (it then serves
    nobody), writes go on with two voters, then it comes back as an observer, syncs, and is made
    a participant again; every acknowledged write is on every voter."""
    rig = client_side
    leader = rig.leader(rig.wait_settled())
    follower = next(i for i in VOTERS if i != leader)
    node = rig.config.node(follower)

    def line(kind: str) -> str:
        return f"server.{follower}={node.host}:{node.peer_port}:{node.peer_port}:{kind};{node.host}:{node.client_port}"

    def role() -> str | None:
        status = rig.statuses([follower])[follower]
        return status and status["role"]

    admin = KazooClient(hosts=rig.client_hosts([leader]), timeout=SESSION_TIMEOUT_S, auth_data=[("digest", "super:test")])
    admin.start(timeout=10)
    try:
        with kazoo(rig, [i for i in VOTERS if i != follower]) as zk:
            acked = write(zk, "/reconfig/before", 20)
            admin.reconfig(joining=None, leaving=str(follower), new_members=None)
            assert wait_for(lambda: role() == "looking", 10)
            acked += write(zk, "/reconfig/without", 30)
            admin.reconfig(joining=line("observer"), leaving=None, new_members=None)
            assert wait_for(lambda: role() == "observer", 30)
            acked += write(zk, "/reconfig/observer", 20)
            data, _ = admin.reconfig(joining=line("participant"), leaving=None, new_members=None)
            assert wait_for(lambda: role() == "follower", 30)
            assert f"server.{follower}=" in data.decode() and "participant" in data.decode()
            acked += write(zk, "/reconfig/after", 20)
    finally:
        stop_kazoo(admin)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked)


@pytest.mark.soak
def test_many_rounds_of_isolating_a_random_voter_lose_no_acknowledged_write(client_side):
    """With --soak: 12 rounds (seeded), each isolating one voter (the leader or a follower) for a
    while as kazoo writes through every voter, then healing it."""
    rig = client_side
    rng = random.Random(19)
    acked: list[str] = []
    with kazoo(rig) as zk:
        for round_ in range(12):
            statuses = rig.wait_settled()
            victim = rig.leader(statuses) if rng.random() < 0.5 else rng.choice(VOTERS)
            rig.isolate(victim)
            try:
                acked += write(zk, f"/soak/r{round_}", rng.randint(10, 60))
                time.sleep(rng.uniform(0, 2))
            finally:
                rig.heal(victim)
    rig.wait_settled()
    wait_caught_up(rig)
    assert_everywhere(rig, acked)


def voter_logs(rig: NetnsRig) -> dict[int, list[Txn]]:
    """Each voter's transaction log, read back from its data directory."""
    logs = {}
    for node_id in VOTERS:
        segments = sorted((rig.config.node(node_id).data_dir / TXNLOG_DIR).glob("log.*"))
        logs[node_id] = [t for s in segments for t in scan_records(s.read_bytes(), SEGMENT_HEADER_BYTES).txns]
    return logs


def test_after_every_story_the_logs_agree_and_converged(rig):
    """Last but one: once every voter has committed the same zxid, stops the cluster (each node exits 0)
    and checks its logs with the multi-process tests' pure checker: a zxid names the same bytes
    everywhere, no log has a gap, all end alike. Stopping without that wait could stop a voter that
    was healed a moment before, while the last commits were still on their way to it (TCP's
    retransmission backoff after a pulled cable delays them by seconds)."""
    with rig.client():
        rig.wait_settled()
        wait_caught_up(rig)
    assert all(status == 0 for status in rig.stop_all().values())
    check_logs_converged(voter_logs(rig))


@pytest.mark.soak
def test_the_logs_of_every_story_pass_the_spark_zab_verifier(rig, spark):
    """With --soak (Spark's start and the checks take over a minute here): `clusterctl verify zab`'s
    checks (Agreement, PrefixConsistency, epoch order, quorum presence, replay digests; docs/verify.md)."""
    rig.stop_all()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    verdict = verify(parser.parse_args([str(rig.config.node(i).data_dir) for i in VOTERS]))
    assert verdict.passed, verdict.to_json()


def test_a_torn_down_rig_leaves_no_namespace_or_link_behind(tmp_path: Path):
    """Everything the rig made carries its prefix, and all of it goes at teardown."""
    with netns_rig(tmp_path, {1: ["voter"]}) as rig:
        assert rig.leftovers()  # its namespaces exist while it lives
    assert rig.leftovers() == []
