"""Zab scenarios of FAULTS.md and the paper, each a story on the simulated ensemble.

Every cluster is seeded; on failure the assertion message carries the seed and
the tail of the trace (SimCluster.describe_failure) so the run replays exactly.
"""

from __future__ import annotations

import pytest

from metastore.core.txn import Create, SetData
from metastore.wire.txn_codec import decode_txn
from sim.cluster import SimCluster, path_of
from zab.core import zxid as Z
from zab.core.actions import LeaderTicked, Phase, Role, Tick
from zab.core.leader import LeaderRole

SETTLE_MS = 10_000


def settled(c: SimCluster) -> SimCluster:
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    return c


def write_all(c: SimCluster, n: int, prefix: str = "k", via=None) -> list:
    nodes = via or c.alive()
    ops = [c.create(nodes[i % len(nodes)], f"{prefix}{i}", str(i)) for i in range(n)]
    c.run_until(lambda: all(o.status != "pending" for o in ops), SETTLE_MS)
    return ops


def finish(c: SimCluster) -> None:
    """Heal, restart everyone, converge, and check no acknowledged write was lost."""
    c.heal()
    for i in c.nodes:
        if not c.nodes[i].alive:
            c.restart(i)
    settled(c)
    c.check_final()


def writes_delivered(c: SimCluster) -> list[tuple[str, str]]:
    """(path, data) of every create and setData some node delivered, in zxid order."""
    bodies = [decode_txn(c.deliveries.data[z].data).body for z in c.deliveries.order]
    return [(b.path, b.data.decode()) for b in bodies if isinstance(b, (Create, SetData))]


@pytest.mark.parametrize("voters", [1, 3, 5, 7])
def test_ensembles_elect_broadcast_and_survive_a_minority(voters):
    c = settled(SimCluster(voters, seed=voters))
    assert c.now < 1000, f"election took {c.now} simulated ms\n{c.describe_failure()}"
    ops = write_all(c, 30)
    assert all(o.status == "acked" for o in ops), c.describe_failure()
    for victim in sorted(c.nodes)[: (voters - 1) // 2]:
        c.crash(victim)
    if voters > 1:
        settled(c)
        ops = write_all(c, 30, "after")
        assert all(o.status == "acked" for o in ops), c.describe_failure()
    finish(c)


def test_leader_crash_elects_a_new_leader_quickly_and_loses_nothing():
    c = settled(SimCluster(3, seed=11))
    write_all(c, 50)
    old = c.leader()
    c.crash(old)
    crashed_at = c.now
    assert c.run_until(lambda: c.leader() not in (None, old) and c.converged(), SETTLE_MS), c.describe_failure()
    assert c.now - crashed_at < 1000, c.describe_failure()
    write_all(c, 50, "b")
    finish(c)


def test_paper_causal_order_w1_w2_w3():
    """Paper section 2: w2 was proposed by L1 only to itself; L2's w3 (conditioned on
    version 1) must win, and w2 must never be delivered anywhere."""
    c = settled(SimCluster(3, seed=3))
    l1 = c.leader()
    w1 = c.create(l1, "/a", "1")
    c.run_until(lambda: w1.status == "acked", SETTLE_MS)
    assert (w1.error, w1.version, w1.result.zxid) == (None, 0, w1.zxid)
    others = {i for i in c.nodes if i != l1}
    c.partition({l1}, others)
    w2 = c.set_data(l1, "/a", "2")
    c.run(5)
    assert c.peer(l1).last_zxid > w1.zxid, "L1 must have logged w2 locally"
    c.crash(l1)
    settled(c)
    via = sorted(others)[0]
    w3 = c.set_data(via, "/a", "3", version=0)  # the version w1 created
    c.run_until(lambda: w3.status != "pending", SETTLE_MS)
    assert w3.status == "acked" and w3.version == 1, (w3, c.describe_failure())
    finish(c)
    assert w2.status != "acked"
    assert ("/a", "2") not in writes_delivered(c), "w2 was delivered: causal order broken"
    for i in c.nodes:
        assert c.read(i, "/a") == ("3", 1)


def test_most_up_to_date_node_absent_from_election_is_truncated():
    """ZOOKEEPER-1154/1156: the node with the longest log was away; it returns and is
    truncated exactly to the new leader's history; nothing committed is lost."""
    c = settled(SimCluster(3, seed=5))
    write_all(c, 20)
    l1 = c.leader()
    others = {i for i in c.nodes if i != l1}
    c.partition({l1}, others)
    for i in range(5):
        c.create(l1, f"orphan{i}", "x")
    c.run(5)
    orphan_last = c.peer(l1).last_zxid
    c.crash(l1)
    settled(c)
    write_all(c, 20, "new")
    c.heal()
    c.restart(l1)
    assert c.peer(l1).last_zxid == orphan_last, "the returning node still has its orphans"
    settled(c)
    c.check_final()
    assert c.nodes[l1].disk.log and all(b"orphan" not in t.data for t in c.nodes[l1].disk.log)
    assert c.read(l1, "orphan0") is None


@pytest.mark.parametrize("restart_old_leader_first", [False, True])
def test_txn_logged_only_on_old_leader_is_truncated(restart_old_leader_first):
    """ZOOKEEPER-2845: the old leader logged T1 but never got it out; a new quorum
    moves on; the old leader rejoins (with or without its own restart) and is TRUNCated."""
    c = settled(SimCluster(3, seed=7, sync_limit_ticks=6))
    write_all(c, 10)
    l1 = c.leader()
    others = {i for i in c.nodes if i != l1}
    c.partition({l1}, others)
    t1 = c.create(l1, "t1", "only-on-old-leader")
    c.run(5)
    assert any(t.data and b"only-on-old-leader" in t.data for t in c.peer(l1).history.after(0))
    # The isolated leader notices it lost its quorum and steps down within sync_limit.
    assert c.run_until(lambda: c.peer(l1).role is Role.LOOKING, 6 * 50 + 200), c.describe_failure()
    assert c.run_until(lambda: c.leader() in others and c.in_broadcast(sorted(others)), SETTLE_MS), \
        c.describe_failure()
    write_all(c, 10, "moved-on", via=sorted(others))
    if restart_old_leader_first:
        c.crash(l1)
        c.restart(l1)
    c.heal()
    settled(c)
    c.check_final()
    assert t1.status != "acked"
    assert all(b"only-on-old-leader" not in t.data for t in c.nodes[l1].disk.log)


def test_follower_that_syncs_during_broadcast_gets_every_proposal():
    """Paper-level finding: PROPOSAL goes to every follower that acked the epoch, not only
    those that already acked NEWLEADER; commits interleave with the sync (ZOOKEEPER-4394)."""
    c = SimCluster(3, seed=13)
    c.crash(1)
    settled(c)
    ops = [c.create(2 + i % 2, f"k{i}", str(i)) for i in range(200)]
    c.run(20)
    c.restart(1)
    more = [c.create(2 + i % 2, f"m{i}", str(i)) for i in range(200)]
    c.run_until(lambda: all(o.status != "pending" for o in ops + more), SETTLE_MS)
    finish(c)
    assert c.peer(1).last_committed == c.peer(2).last_committed


@pytest.mark.parametrize("offset_ms", range(0, 60, 3))
def test_crash_at_every_point_of_a_snap_sync(offset_ms):
    """ZOOKEEPER-3104/3642: a learner far behind gets a SNAP; crashing it at any moment
    of the sync must leave a node that restarts and converges."""
    c = SimCluster(3, seed=17 + offset_ms, sync_window_txns=5)
    c.crash(3)
    settled(c)
    write_all(c, 60, via=[1, 2])
    c.restart(3)
    c.run(offset_ms)
    c.crash(3)
    c.restart(3)
    settled(c)
    c.check_final()


def test_crashes_and_restarts_during_election_and_connect_converge():
    """ZOOKEEPER-1732/1818: peers restarting while others elect and connect still converge."""
    c = SimCluster(5, seed=19)
    for step in range(12):
        victim = 1 + step % 5
        c.run(37 + 11 * step)
        c.crash(victim)
        c.run(23)
        c.restart(victim)
    settled(c)
    write_all(c, 20)
    finish(c)


def test_follower_crashes_mid_proposal_and_resyncs():
    """ZOOKEEPER-2355: a follower dies with proposals half-written; it must never claim
    what it did not apply, and the trees match afterwards."""
    c = settled(SimCluster(3, seed=23))
    follower = min(i for i in c.nodes if i != c.leader())
    ops = [c.create(c.leader(), f"k{i}", str(i)) for i in range(100)]
    c.run(7)
    c.crash(follower)
    c.restart(follower)
    c.run_until(lambda: all(o.status != "pending" for o in ops), SETTLE_MS)
    finish(c)


def test_leader_loses_quorum_steps_down_within_sync_limit_and_others_move_on():
    c = settled(SimCluster(5, seed=29, sync_limit_ticks=8))
    leader = c.leader()
    others = {i for i in c.nodes if i != leader}
    c.partition({leader}, others)
    limit_ms = 8 * 50 + 100
    assert c.run_until(lambda: c.peer(leader).role is Role.LOOKING, limit_ms), c.describe_failure()
    assert c.run_until(lambda: c.leader() in others, SETTLE_MS), c.describe_failure()
    finish(c)


def test_no_quorum_no_commit():
    c = settled(SimCluster(3, seed=31))
    leader = c.leader()
    for i in c.nodes:
        if i != leader:
            c.crash(i)
    op = c.create(leader, "lonely", "x")
    c.run(3000)
    assert op.status != "acked", "a lone node committed without a quorum"
    finish(c)


def test_observer_receives_commits_but_never_votes():
    c = settled(SimCluster(3, observers=1, seed=37))
    observer = 4
    assert c.peer(observer).role is Role.OBSERVING
    ops = write_all(c, 30, via=[observer])
    assert all(o.status == "acked" for o in ops), c.describe_failure()
    assert c.peer(observer).last_committed == c.peer(c.leader()).last_committed
    leader = c.leader()
    for i in (1, 2, 3):
        if i != leader:
            c.crash(i)
    op = c.create(observer, "no-quorum", "x")
    c.run(3000)
    assert op.status != "acked", "an observer's ack must not count toward a quorum"
    finish(c)


def test_zxid_counter_rollover_forces_a_new_epoch():
    c = settled(SimCluster(3, seed=41, zxid_counter_limit=5))
    leader = c.leader()
    epoch = c.peer(leader).current_epoch
    write_all(c, 4, via=[leader])
    last = c.create(leader, "last-of-epoch", "x")
    c.run_until(lambda: last.status != "pending", SETTLE_MS)
    assert last.status == "acked" and Z.counter_of(last.zxid) == 5
    rolled = c.create(leader, "rolled", "y")
    c.run(1)
    assert rolled.status == "failed"
    settled(c)
    op = write_all(c, 1, "next-epoch")[0]
    assert op.status == "acked" and Z.epoch_of(op.zxid) > epoch, c.describe_failure()
    finish(c)


def test_snapshots_and_replay_after_restarts_of_everyone():
    """ZOOKEEPER-3144/3145: replay from a snapshot plus the log is exact."""
    c = settled(SimCluster(3, seed=43, snapshot_every_txns=7))
    write_all(c, 40)
    for i in c.nodes:
        c.crash(i)
    for i in c.nodes:
        c.restart(i)
        assert c.nodes[i].disk.snapshots, "snapshots were taken"
    settled(c)
    write_all(c, 20, "after")
    finish(c)


def test_slow_fsync_on_a_follower_does_not_cost_the_quorum():
    """Slow fsync: pings are answered without waiting behind the disk."""
    c = settled(SimCluster(3, seed=47, disk_latency_ms={1: 400, 2: 400, 3: 400}))
    leader = c.leader()
    write_all(c, 30)
    assert c.leader() == leader, "a slow disk made the leader lose its quorum"
    finish(c)


def test_all_nodes_crash_at_once_and_come_back():
    c = settled(SimCluster(3, seed=53))
    ops = [c.create(1 + i % 3, f"k{i}", str(i)) for i in range(100)]
    # Crash in the middle of the stream: some writes acknowledged, most still in flight.
    assert c.run_until(lambda: sum(o.status == "acked" for o in ops) >= 10, SETTLE_MS), c.describe_failure()
    for i in c.nodes:
        c.crash(i)
    finish(c)  # every acknowledged one is still there
    in_history = set(writes_delivered(c))
    assert all((path_of(o.key), o.value) in in_history for o in ops if o.status == "acked")


def test_phase_is_broadcast_everywhere_after_election():
    c = settled(SimCluster(3, seed=59))
    assert {c.peer(i).phase for i in c.nodes} == {Phase.BROADCAST}


@pytest.mark.parametrize("seed", range(20))
def test_failover_does_not_wait_for_a_resend(seed):
    """A survivor that goes LOOKING while the other still follows the dead leader must
    not wait for the resend timer: the worse-voting peer is answered at once (bench found
    failovers of ~650 ms from exactly that)."""
    c = settled(SimCluster(3, seed=100 + seed, election_resend_ticks=20))
    old = c.leader()
    survivors = [i for i in c.nodes if i != old]
    # The survivor with the better vote (same history, higher id) notices the loss 30 ms
    # before the other (a timeout versus a reset).
    c.partition({old}, {max(survivors)})
    c.run(30)
    c.crash(old)
    c.heal()
    start = c.now
    assert c.run_until(lambda: c.leader() in survivors and c.converged(), SETTLE_MS), c.describe_failure()
    assert c.now - start < 20 * 50, f"failover took {c.now - start} ms\n{c.describe_failure()}"


def test_sync_on_a_follower_returns_after_every_earlier_commit_is_delivered_there():
    from zab.core.actions import ClientSync
    c = settled(SimCluster(3, seed=61))
    leader = c.leader()
    follower = min(i for i in c.nodes if i != leader)
    op = c.create(leader, "fresh", "value")
    c.run_until(lambda: op.status == "acked", SETTLE_MS)
    c.inject(follower, ClientSync(77, 1))
    assert c.run_until(lambda: any(n == follower for n, _ in c.synced), SETTLE_MS)
    [(_, synced)] = [(n, s) for n, s in c.synced if n == follower]
    assert synced.zxid >= op.zxid
    assert c.read(follower, "fresh") == ("value", 0)


def test_session_touches_on_any_node_reach_the_leader():
    from zab.core.actions import TouchSessions
    c = settled(SimCluster(3, seed=67))
    leader = c.leader()
    follower = min(i for i in c.nodes if i != leader)
    c.inject(follower, TouchSessions((101, 102)))
    c.inject(leader, TouchSessions((103,)))
    assert c.run_until(lambda: {s for n, t in c.touched for s in t.session_ids} == {101, 102, 103}, 1000)
    assert all(n == leader for n, _ in c.touched), "only the leader reports touches"
    assert {t.frm for _, t in c.touched} == {leader, follower}


def test_only_an_established_leader_tells_its_clock_on_each_tick():
    """LeaderTicked(ticks so far x tick_ms) is the clock session expiry runs on: from the established
    leader alone, so no follower or deposed leader expires anything."""
    c = SimCluster(voters=3, seed=4)
    assert c.run_until(c.in_broadcast, 10_000)
    leader = c.leader()
    peer = c.peer(leader)
    [ticked] = [a for a in peer.step(Tick()) if isinstance(a, LeaderTicked)]
    assert ticked.now_ms == peer.now * peer.cfg.tick_ms
    for follower in (i for i in c.alive() if i != leader):
        assert not [a for a in c.peer(follower).step(Tick()) if isinstance(a, LeaderTicked)]
    c.partition({leader}, set(c.alive()) - {leader})
    assert c.run_until(lambda: not isinstance(c.peer(leader).role_state, LeaderRole)
                       or not c.peer(leader).role_state.established, 10_000)
    assert not [a for a in c.peer(leader).step(Tick()) if isinstance(a, LeaderTicked)]
