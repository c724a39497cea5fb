"""A hostile or buggy peer against the pure Zab core (issue 17, "Peer port is open to anyone").

The simulator's `forge` hands a node a message as if it came from any id, member or not,
outside every simulated link: what a stranger that sent a HELLO naming a member could do
before TLS, or a member with a bug. Each story names the finding it covers; each failed
before the core refused the message. A refusal is a declared outcome (the message is
ignored, or a Disconnect action drops the sender's links), never an exception, and the
ensemble keeps its invariants (the simulator checks them on every step)."""

from __future__ import annotations

from metastore.core.state_machine import MetastoreStateMachine
from sim.cluster import SimCluster, create_request
from zab.core import zxid as Z
from zab.core.actions import Disconnect, PersistEpoch, Received, Send
from zab.wire.codec import encode_frame
from zab.core.config import ZabConfig
from zab.core.messages import (Ack, AckEpoch, AckNewLeader, FollowerInfo, LeaderInfo, Notification, Ping, Request,
                          ServerState, SyncReply, SyncRequest)
from zab.core.peer import Peer

SETTLE_MS = 10_000
HUGE = 2**64 - 1


def settled(c: SimCluster) -> SimCluster:
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    return c


def stepped_down(c: SimCluster, node: int, since: int) -> bool:
    """Whether `node` went back to election after trace line `since`."""
    return any(f"node {node} -> looking" in line for line in c.trace[since:])


def test_a_forged_request_from_a_peer_the_leader_never_synchronized_is_not_proposed():
    c = settled(SimCluster(3, seed=3))
    leader = c.leader()
    absent = max(n for n in c.nodes if n != leader)
    c.crash(absent)  # its id is free for a stranger to claim
    c.run(100)
    before, mark = c.peer(leader).last_zxid, len(c.trace)
    for frm in (absent, 99):  # a member id with no link, and no member at all
        c.forge(leader, frm, Request(HUGE, HUGE, create_request("evil", "x", origin=absent)))
        c.forge(leader, frm, SyncRequest(HUGE, HUGE))
        c.forge(leader, frm, Ping((1, 2, 3)))
    c.run(500)
    assert c.peer(leader).last_zxid == before, "a request from outside the forwarding set was proposed"
    assert c.read(leader, "evil") is None
    assert not any(n == leader for n, _ in c.touched), "touches of a peer that never synchronized were taken"
    assert c.leader() == leader and not stepped_down(c, leader, mark), c.describe_failure()


def forge_learner(c: SimCluster, leader: int, as_id: int) -> None:
    """A stranger completes the learner handshake as `as_id` (it never hears the answers)."""
    p = c.peer(leader)
    epoch = p.current_epoch
    c.forge(leader, as_id, FollowerInfo(epoch, p.last_zxid, False, 99))
    c.forge(leader, as_id, AckEpoch(0, p.last_zxid))
    c.forge(leader, as_id, AckNewLeader(epoch))
    c.run(5)


def test_an_ack_for_a_zxid_never_proposed_counts_toward_no_quorum():
    c = settled(SimCluster(3, seed=4))
    leader = c.leader()
    f2, f3 = [n for n in c.nodes if n != leader]
    c.crash(f3)
    c.run(20)
    forge_learner(c, leader, f3)
    c.crash(f2)  # only the leader has the write below; the forged learner must not make it a quorum
    op = c.create(leader, "k", "v")
    c.run(5)
    c.forge(leader, f3, Ack(HUGE))
    c.run(20)
    assert op.status != "acked", "the leader committed a write only it has logged"
    assert c.peer(leader).last_committed < c.peer(leader).last_zxid or c.leader() is None


def test_followerinfo_with_an_epoch_at_the_limit_neither_unseats_the_leader_nor_is_persisted():
    c = settled(SimCluster(3, seed=5))
    leader = c.leader()
    follower = next(n for n in c.nodes if n != leader)
    mark = len(c.trace)
    for epoch in (Z.EPOCH_MAX, Z.EPOCH_MAX - 1, HUGE):
        c.forge(leader, follower, FollowerInfo(epoch, 0, False, 1000 + epoch % 7))
        c.run(200)
    settled(c)
    assert c.leader() == leader and not stepped_down(c, leader, mark), c.describe_failure()
    assert all(n.disk.accepted_epoch < Z.EPOCH_MAX - 1 for n in c.nodes.values())
    c.check_final()


def test_a_forged_followerinfo_during_discovery_never_sets_the_epoch_to_the_limit():
    c = SimCluster(3, seed=6)
    for _ in range(300):  # a stranger repeats it to every node while they elect and connect
        for n in c.nodes:
            for frm in c.nodes:
                if frm != n:
                    c.forge(n, frm, FollowerInfo(Z.EPOCH_MAX - 1, HUGE, False, 7))
        c.run(10)
    assert all(n.disk.accepted_epoch < Z.EPOCH_MAX - 1 for n in c.nodes.values()), \
        [n.disk.accepted_epoch for n in c.nodes.values()]
    settled(c)
    op = c.create(c.leader(), "k", "v")
    assert c.run_until(lambda: op.status == "acked", SETTLE_MS), c.describe_failure()


def test_votes_for_a_non_member_never_leave_the_ensemble_leaderless():
    c = SimCluster(3, seed=7)
    for _ in range(20):
        for n in c.nodes:
            for frm in c.nodes:
                if frm != n:
                    c.forge(n, frm, Notification(99, HUGE, Z.EPOCH_MAX - 2, 1, ServerState.LOOKING))
                    c.forge(n, frm, Notification(99, HUGE, Z.EPOCH_MAX - 2, 1, ServerState.LEADING))
        c.run(50)
    followed_stranger = [line for line in c.trace if "leader=99" in line]
    assert not followed_stranger, followed_stranger
    settled(c).check_final()


def decided_follower() -> tuple[Peer, list]:
    """Node 2 of {1, 2, 3}, told by 1 (LEADING) and 3 (FOLLOWING) that 1 leads: in discovery."""
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3})), MetastoreStateMachine())
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    out = p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    assert p.leader_id == 1 and any(isinstance(a, Send) and isinstance(a.msg, FollowerInfo) for a in out)
    return p, out


def test_a_leaderinfo_at_the_epoch_limit_is_refused_not_persisted():
    p, _ = decided_follower()
    out = p.step(Received(1, LeaderInfo(Z.EPOCH_MAX)))
    assert not [a for a in out if isinstance(a, PersistEpoch)], out
    assert p.accepted_epoch == 0
    assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out


def test_a_vote_from_an_election_round_at_the_limit_is_ignored():
    """A round number a notification cannot carry once incremented would end the node when sent."""
    p = Peer(ZabConfig(my_id=1, voters=frozenset({1, 2, 3})), MetastoreStateMachine())
    p.start()
    for state in (ServerState.LOOKING, ServerState.FOLLOWING):
        p.step(Received(2, Notification(3, 0, 0, HUGE, state)))
        p.step(Received(2, Notification(3, 0, Z.EPOCH_MAX, 1, state)))
    out = p.look()
    for a in out:
        if isinstance(a, Send):
            encode_frame(a.msg)  # raised struct.error: the round was 2**64
    assert p.election.logical_clock < 2**62
    assert p.election.proposal.peer_epoch < Z.EPOCH_MAX


def test_a_syncreply_beyond_what_the_follower_committed_is_a_protocol_error_not_a_crash():
    """FIFO links make an honest leader's SYNCREPLY follow every COMMIT it covers; one that
    does not (a leader with a bug) drops the link and sends the follower back to election."""
    c = settled(SimCluster(3, seed=8))
    leader = c.leader()
    follower = next(n for n in c.nodes if n != leader)
    c.forge(follower, leader, SyncReply(1, 1, HUGE))
    c.run(50)
    assert any(f"node {follower} disconnects {leader}" in line for line in c.trace), c.describe_failure()
    settled(c).check_final()
