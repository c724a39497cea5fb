"""Step-by-step learner stories: the exact actions a follower returns for each message.

These pin the orderings FAULTS.md names: synced transactions durable, then
currentEpoch, then the NEWLEADER ack; duplicates inside the sync ignored;
PROPOSAL and COMMIT interleaved before UPTODATE; gaps refused.
"""

from __future__ import annotations

from metastore.core.state_machine import MetastoreStateMachine
from sim.cluster import create_request
from zab.core import zxid as Z
from zab.core.actions import (Delivered, Disconnect, InstallSnapshot, LogAppend, LogSync, LogTruncate, Phase,
                         PersistEpoch, Received, Role, Send, SnapBegin, SnapWrite, Tick)
from zab.core.config import ZabConfig
from zab.core.messages import (Ack, AckEpoch, AckNewLeader, Commit, FollowerInfo, LeaderInfo, NewLeader, Notification, Proposal,
                          ServerState, Sync, SyncMode, SyncTxns, UpToDate)
from zab.core.peer import DiskState, Peer
from zab.core.txn import Txn

LEADER = 3


def txn(epoch: int, counter: int, key: str = "k") -> Txn:
    """The leader's transaction `counter` of `epoch`: the create of /{key}{counter}. A create
    names its parent's resulting child count, so the leader prepares the creates of
    counters 1..counter-1 first: the transactions of one epoch apply one after the other."""
    leader = MetastoreStateMachine()
    for n in range(1, counter + 1):
        data = leader.prepare(Z.make(epoch, n), 0, create_request(f"{key}{n}", "v", origin=LEADER))
    return Txn(Z.make(epoch, counter), 0, 0, data)


def following(disk: DiskState = DiskState()) -> Peer:
    """Node 1 of {1,2,3}, told by a quorum that node 3 leads: it is in DISCOVERY."""
    p = Peer(ZabConfig(my_id=1, voters=frozenset({1, 2, 3})), MetastoreStateMachine(), disk)
    p.start()
    clock = p.election.logical_clock
    for frm in (2, 3):
        state = ServerState.LEADING if frm == LEADER else ServerState.FOLLOWING
        p.step(Received(frm, Notification(LEADER, 0, 0, clock, state)))
    assert p.role is Role.FOLLOWING and p.phase is Phase.DISCOVERY
    return p


def to_sync(p: Peer, epoch: int = 1) -> list:
    out = p.step(Received(LEADER, LeaderInfo(epoch)))
    assert p.phase is Phase.SYNCHRONIZATION
    return out


def test_leaderinfo_persists_accepted_epoch_before_ackepoch():
    p = following()
    out = to_sync(p, 4)
    assert out == [PersistEpoch(accepted=4), Send(LEADER, AckEpoch(0, 0))]


def test_newleader_is_acked_only_after_synced_txns_and_current_epoch_are_durable():
    p = following()
    to_sync(p)
    assert p.step(Received(LEADER, Sync(SyncMode.DIFF, 0))) == []
    t1, t2 = txn(1, 1), txn(1, 2)
    assert p.step(Received(LEADER, SyncTxns((t1, t2)))) == [LogAppend((t1, t2))]
    out = p.step(Received(LEADER, NewLeader(1, t2.zxid)))
    # Nothing is sent directly: the ack rides inside the LogSync, after the epoch write.
    assert out == [LogSync(then=(PersistEpoch(current=1), Send(LEADER, AckNewLeader(1))))]


def test_proposal_already_received_inside_the_sync_is_ignored():
    p = following()
    to_sync(p)
    p.step(Received(LEADER, Sync(SyncMode.DIFF, 0)))
    t1 = txn(1, 1)
    p.step(Received(LEADER, SyncTxns((t1,))))
    p.step(Received(LEADER, NewLeader(1, t1.zxid)))
    assert p.step(Received(LEADER, Proposal(t1))) == []
    assert p.role is Role.FOLLOWING


def test_proposal_and_commit_interleaved_before_uptodate_are_applied_with_it():
    p = following()
    to_sync(p)
    p.step(Received(LEADER, Sync(SyncMode.DIFF, 0)))
    t1, t2 = txn(1, 1), txn(1, 2)
    p.step(Received(LEADER, SyncTxns((t1,))))
    p.step(Received(LEADER, NewLeader(1, t1.zxid)))
    out = p.step(Received(LEADER, Proposal(t2)))
    assert out == [LogAppend((t2,)), LogSync(then=(Send(LEADER, Ack(t2.zxid)),))]
    assert p.step(Received(LEADER, Commit(t2.zxid))) == []  # remembered, not applied before UPTODATE
    assert p.last_committed == 0
    out = p.step(Received(LEADER, UpToDate(t1.zxid)))
    assert [a.txn.zxid for a in out if isinstance(a, Delivered)] == [t1.zxid, t2.zxid]
    assert p.phase is Phase.BROADCAST


def test_a_gap_is_refused_and_sends_the_follower_back_to_election():
    p = following()
    to_sync(p)
    p.step(Received(LEADER, Sync(SyncMode.DIFF, 0)))
    out = p.step(Received(LEADER, SyncTxns((txn(1, 1), txn(1, 3)))))
    assert any(isinstance(a, Disconnect) for a in out)
    assert p.role is Role.LOOKING
    assert p.last_zxid == Z.make(1, 1)  # memory holds exactly what was logged


def test_trunc_drops_skipped_proposals_and_never_committed_ones():
    disk = DiskState(1, 1, 0, None, (txn(1, 1), txn(1, 2), txn(1, 3)))
    p = following(disk)
    to_sync(p, 2)
    out = p.step(Received(LEADER, Sync(SyncMode.TRUNC, Z.make(1, 1))))
    assert out == [LogTruncate(Z.make(1, 1))]
    assert p.last_zxid == Z.make(1, 1)
    t = txn(2, 1)
    assert p.step(Received(LEADER, SyncTxns((t,)))) == [LogAppend((t,))]


def test_trunc_below_what_we_delivered_is_refused():
    p = following()
    to_sync(p)
    p.step(Received(LEADER, Sync(SyncMode.DIFF, 0)))
    t1, t2 = txn(1, 1), txn(1, 2)
    p.step(Received(LEADER, SyncTxns((t1, t2))))
    p.step(Received(LEADER, NewLeader(1, t2.zxid)))
    p.step(Received(LEADER, UpToDate(t2.zxid)))
    assert p.last_committed == t2.zxid
    # A later leader that would cut delivered history must be refused.
    p.look()
    p2 = p
    clock = p2.election.logical_clock
    for frm in (2, 3):
        p2.step(Received(frm, Notification(LEADER, 0, 0, clock,
                                           ServerState.LEADING if frm == LEADER else ServerState.FOLLOWING)))
    p2.step(Received(LEADER, LeaderInfo(2)))
    out = p2.step(Received(LEADER, Sync(SyncMode.TRUNC, t1.zxid)))
    assert any(isinstance(a, Disconnect) for a in out) and p2.role is Role.LOOKING


def test_snap_installs_the_state_before_anything_after_it():
    p = following()
    to_sync(p)
    leader_sm = MetastoreStateMachine()
    t1 = txn(1, 1)
    leader_sm.apply(t1.zxid, t1.data)
    state = leader_sm.freeze().to_bytes()
    out = p.step(Received(LEADER, Sync(SyncMode.SNAP, t1.zxid, state)))  # inline, from an older leader
    assert out == [SnapBegin(t1.zxid), SnapWrite(state), InstallSnapshot(t1.zxid)]
    assert p.sm.digest() == leader_sm.digest() and p.last_committed == t1.zxid


def test_follower_returns_to_election_when_the_leader_falls_silent():
    p = following()
    for _ in range(p.cfg.init_limit_ticks + 1):
        p.step(Tick())
    assert p.role is Role.LOOKING


def test_followerinfo_is_resent_until_the_leader_answers():
    p = following()
    sent = [a for _ in range(4) for a in p.step(Tick()) if isinstance(a, Send)]
    assert sent and all(isinstance(s.msg, FollowerInfo) and s.to == LEADER for s in sent)
    assert len({s.msg.attempt for s in sent}) == 1
