"""Dynamic reconfiguration in the simulator (issue 19 item 3): reconfig requests through the
metastore, committed by Zab with a quorum of the old and of the new voters, adopted by every
node as it applies them; a removed leader steps down and the new voters elect at once.

Nodes 4 and 5 start as observers of a 3-voter ensemble (the way a new server joins: added as
an observer, it syncs, then becomes a participant)."""

from __future__ import annotations

import pytest

from metastore.core import cluster_secret as CS
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode
from sim.client_ops import ClientOp
from sim.cluster import SimCluster
from zab.core.ensemble import parse_spec

SECRET = bytes(range(32))


def reconfig(c: SimCluster, node: int, *, joining: str | None = None, leaving: str | None = None,
             new_members: str | None = None, from_config: int = -1) -> ClientOp:
    """A super client's reconfig through `node` (ZooKeeper's ReconfigRequest)."""
    body = jute.ReconfigRequest(joining, leaving, new_members, from_config)
    payload = jute.encode_request(jute.RequestHeader(1, OpCode.RECONFIG), body)
    auth = ((CS_SUPER, CS.super_token(SECRET)),)
    return c.submit(node, E.encode_envelope(E.Envelope(E.CLIENT, node, c.now, auth, payload)))


CS_SUPER = "super"


def line(i: int, role: str = "participant") -> str:
    return f"server.{i}=node{i}:1:1:{role}"


def members_converged(c: SimCluster, members: set[int]) -> bool:
    """A leader among `members`, every live member in broadcast at the same point."""
    leader = c.leader()
    if leader is None or leader not in members:
        return False
    peers = [c.peer(i) for i in members if c.nodes[i].alive]
    return (all(p.phase.value == "broadcast" for p in peers)
            and len({(p.last_committed, p.last_zxid) for p in peers}) == 1)


def started(seed: int) -> SimCluster:
    c = SimCluster(voters=3, observers=2, seed=seed)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    init = c.submit(c.leader(), E.encode_envelope(E.Envelope(E.INIT_SECRET, 0, 1, (), SECRET)))
    assert c.run_until(lambda: init.status == "acked", 2_000), c.describe_failure()
    return c


def write_some(c: SimCluster, tag: str, count: int = 10) -> list[ClientOp]:
    nodes = [i for i in c.alive() if c.peer(i).cfg.is_member]
    return [c.create(nodes[n % len(nodes)], f"{tag}{n}", tag) for n in range(count)]


def settle(c: SimCluster, op: ClientOp, ms: int = 5_000) -> None:
    assert c.run_until(lambda: op.status != "pending", ms), c.describe_failure()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_grow_to_five_remove_the_leader_shrink_to_three_others_and_nothing_acked_is_lost(seed: int) -> None:
    c = started(seed)
    ops = write_some(c, "a")
    grow = reconfig(c, c.leader(), joining=f"{line(4)},{line(5)}")
    ops += write_some(c, "b")
    settle(c, grow)
    assert grow.status == "acked", (grow.status, grow.error, c.describe_failure())
    assert c.run_until(lambda: members_converged(c, {1, 2, 3, 4, 5}), 10_000), c.describe_failure()
    assert {c.peer(i).role.value for i in (4, 5)} == {"follower"}
    assert all(c.peer(i).ensemble.voters == {1, 2, 3, 4, 5} for i in range(1, 6))

    old_leader = c.leader()
    remove = reconfig(c, old_leader, leaving=str(old_leader))
    ops += write_some(c, "c")
    settle(c, remove)
    assert remove.status in ("acked", "unknown"), (remove.status, remove.error)
    rest = {1, 2, 3, 4, 5} - {old_leader}
    assert c.run_until(lambda: members_converged(c, rest), 10_000), c.describe_failure()
    assert c.leader() != old_leader and not c.peer(old_leader).cfg.is_member
    assert c.peer(old_leader).role.value == "looking"  # removed: it serves nobody

    keep = sorted(rest)[1:]  # three of the four, so the leader may go too
    shrink = reconfig(c, c.leader(), new_members=",".join(line(i) for i in keep))
    settle(c, shrink)
    assert shrink.status in ("acked", "unknown"), (shrink.status, shrink.error)
    assert c.run_until(lambda: members_converged(c, set(keep)), 10_000), c.describe_failure()
    ops += write_some(c, "d")
    assert c.run_until(lambda: all(op.status != "pending" for op in ops), 10_000), c.describe_failure()
    assert c.run_until(lambda: members_converged(c, set(keep)), 10_000), c.describe_failure()
    final = c.peer(keep[0])
    assert final.ensemble.voters == set(keep)
    assert parse_spec(final.sm.tree.get("/zookeeper/config")[0]).voters == set(keep)
    for op in ops:
        if op.status == "acked":
            assert all(c.read(i, op.key) == (op.value, 0) for i in keep), (op, c.describe_failure())
    assert any(op.status == "acked" for op in ops)


def test_a_reconfig_whose_new_voters_do_not_follow_the_leader_is_refused() -> None:
    c = started(7)
    c.crash(4)
    c.crash(5)
    op = reconfig(c, c.leader(), new_members=",".join([line(1), line(4), line(5)]))
    settle(c, op)
    assert (op.status, op.error) == ("refused", "NewConfigNoQuorum")
    assert all(c.peer(i).ensemble.version == 0 for i in (1, 2, 3))


def test_reconfig_checks_the_config_version_and_the_super_user() -> None:
    c = started(8)
    stale = reconfig(c, c.leader(), joining=line(4), from_config=0x1234)
    settle(c, stale)
    assert (stale.status, stale.error) == ("refused", "BadVersion")
    body = jute.ReconfigRequest(line(4), None, None, -1)
    payload = jute.encode_request(jute.RequestHeader(1, OpCode.RECONFIG), body)
    anyone = c.submit(c.leader(), E.encode_envelope(E.Envelope(E.CLIENT, c.leader(), c.now, (), payload)))
    settle(c, anyone)
    assert (anyone.status, anyone.error) == ("refused", "NoAuth")
    ok = reconfig(c, c.leader(), joining=line(4), from_config=0)
    settle(c, ok)
    assert ok.status == "acked", (ok.status, ok.error)


def test_a_node_restarted_after_a_reconfig_keeps_the_new_ensemble() -> None:
    c = started(9)
    grow = reconfig(c, c.leader(), joining=f"{line(4)},{line(5)}")
    settle(c, grow)
    assert grow.status == "acked"
    assert c.run_until(lambda: members_converged(c, {1, 2, 3, 4, 5}), 10_000), c.describe_failure()
    for i in (1, 2, 3, 4, 5):
        c.crash(i)
    for i in (1, 2, 3, 4, 5):
        c.restart(i)
    assert c.run_until(lambda: members_converged(c, {1, 2, 3, 4, 5}), 10_000), c.describe_failure()
    assert {c.peer(i).role.value for i in (1, 2, 3, 4, 5)} <= {"leader", "follower"}
    c.check_final()


@pytest.mark.parametrize("seed", range(10, 22))
def test_a_crash_at_a_random_moment_of_a_reconfig_loses_nothing_acknowledged(seed: int) -> None:
    """A random member crashes at a random moment while a reconfig (grow, or remove the
    leader) and writes are in flight, and comes back later: every member converges on one
    ensemble and one state, with every acknowledged write."""
    c = started(seed)
    rng = c.rng
    if rng.random() < 0.5:
        change, members = {"joining": f"{line(4)},{line(5)}"}, {1, 2, 3, 4, 5}
    else:
        leader = c.leader()
        change, members = {"leaving": str(leader)}, {1, 2, 3, 4, 5} - {leader}
    ops = write_some(c, "a", 5)
    op = reconfig(c, c.leader(), **change)
    ops += write_some(c, "b", 5)
    victim = rng.choice(sorted(members))
    c.run(rng.randint(0, 60))
    c.crash(victim)
    c.run(rng.randint(0, 1_000))
    c.restart(victim)
    settle(c, op, 10_000)
    assert c.run_until(lambda: all(o.status != "pending" for o in ops), 10_000), c.describe_failure()
    if op.status != "acked":  # lost with a crashed leader, or refused: the old ensemble stays
        members = {1, 2, 3}
    assert c.run_until(lambda: members_converged(c, members) and all(
        c.peer(i).ensemble == c.peer(min(members)).ensemble for i in members), 15_000), c.describe_failure()
    digests = {c.peer(i).sm.digest() for i in members}
    assert len(digests) == 1, c.describe_failure()
    for o in ops:
        if o.status == "acked":
            assert all(c.read(i, o.key) == (o.value, 0) for i in members), (o, c.describe_failure())


@pytest.mark.parametrize("seed", range(30, 36))
def test_the_leader_crashes_as_a_promotion_commits_and_the_rest_go_on(seed: int) -> None:
    """Observers 4 and 5 are promoted (3 -> 5 voters) and the leader crashes the moment it applies
    that: the survivors elect and serve, whichever of them had the reconfig committed, logged or not
    yet, and all end with the new ensemble. A second old voter crashing too is more than the old
    ensemble tolerates (the others cannot know the reconfig committed, so they need a majority of
    the old voters as well): writes wait until it is back, and then nothing acknowledged is lost."""
    c = started(seed)
    leader = c.leader()
    other = next(i for i in (1, 2, 3) if i != leader)
    grow = reconfig(c, leader, joining=f"{line(4)},{line(5)}")
    assert c.run_until(lambda: grow.status != "pending", 5_000), c.describe_failure()
    c.crash(leader)
    survivors = {1, 2, 3, 4, 5} - {leader}
    ops = write_some(c, "z", 5)
    assert c.run_until(lambda: members_converged(c, survivors) and all(o.status != "pending" for o in ops),
                       20_000), c.describe_failure()
    assert all(c.peer(i).ensemble.voters == {1, 2, 3, 4, 5} for i in survivors)
    c.crash(other)
    c.restart(leader)
    assert c.run_until(lambda: members_converged(c, {1, 2, 3, 4, 5} - {other}), 20_000), c.describe_failure()
    late = write_some(c, "y", 5)
    assert c.run_until(lambda: all(o.status == "acked" for o in late), 10_000), c.describe_failure()
    c.restart(other)
    assert c.run_until(lambda: members_converged(c, {1, 2, 3, 4, 5}), 20_000), c.describe_failure()
    c.check_final()
