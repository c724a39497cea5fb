"""A leader with a bug against its followers (issue 17, "no fault of another node can take a node down").

A follower reads only from its leader, so garbage from it (a SNAP whose snapshot does not
decode, a Refused whose answer does not, a PROPOSAL whose payload is not a transaction)
used to raise KeyError, UnicodeDecodeError or DecodeError inside the state machine and out
of the core: the follower's node ended. Now the state machines raise MalformedState for
bytes they cannot decode, before changing anything, and the learner takes it as the
leader's fault: nothing of it is persisted, acked or delivered, the link drops and the
follower returns to election. Every test here failed before that."""

from __future__ import annotations

import struct

import pytest

from metastore.wire import envelope as E
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import Error, Transaction
from metastore.wire.txn_codec import encode_txn
from sim.cluster import ClientOp, SimCluster
from zab.core import zxid as Z
from zab.core.actions import Answered, Delivered, Disconnect, InstallSnapshot, LogAppend, Received, Send
from zab.core.config import ZabConfig
from zab.core.messages import (Commit, LeaderInfo, NewLeader, Notification, Proposal, Refused, ServerState, Sync, SyncMode,
                          SyncTxns, UpToDate)
from zab.core.peer import DiskState, Peer
from zab.core.statemachine import MalformedState
from zab.core.txn import Txn

SETTLE_MS = 10_000
# Not UTF-8, not a metastore transaction or snapshot; and JSON or jute of the wrong shape.
GARBAGE = [b"\xff\xfe\x00garbage", b"", b"{}", b'{"t":"set"}', b'{"zxid":1,"items":[[1]]}', b"[1,2]", b"null",
           b'{"e":1}', b'{"k":"a","t":"set","v":"x","ver":true}', b"[" * 100_000,
           struct.pack(">iq", 1, 0) + b"\x07" * 9]


def settled(c: SimCluster) -> SimCluster:
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    return c


def disconnected(c: SimCluster, node: int, peer: int, since: int) -> bool:
    return any(f"node {node} disconnects {peer}" in line for line in c.trace[since:])


def metastore_cluster(seed: int) -> SimCluster:
    c = settled(SimCluster(3, seed=seed, state_machine=MetastoreStateMachine))
    c.submit(c.leader(), E.encode_envelope(E.Envelope(E.CREATE_SESSION, 1, 1_000, (), struct.pack(">i", 5000))),
             session_id=0x0001_0000_0000_0001)
    return settled(c)


# -- the state machines: MalformedState, before any change ------------------------------

@pytest.mark.parametrize("data", GARBAGE)
def test_undecodable_bytes_raise_malformed_state_and_change_nothing(data):
    sm = MetastoreStateMachine()
    digest, last = sm.digest(), sm.last_zxid
    for call in (lambda: sm.apply(Z.make(1, 1), data), lambda: sm.restore(Z.make(1, 1), data),
                 lambda: sm.refused(0, data)):
        with pytest.raises(MalformedState):
            call()
        assert (sm.digest(), sm.last_zxid) == (digest, last)


def test_a_metastore_refusal_that_is_a_real_transaction_is_malformed():
    sm = MetastoreStateMachine()
    create_session = MetastoreStateMachine().prepare(Z.make(1, 1), 1, E.encode_envelope(
        E.Envelope(E.CREATE_SESSION, 1, 1_000, (), struct.pack(">i", 5000))))
    assert isinstance(create_session, bytes)
    with pytest.raises(MalformedState):
        sm.refused(0, create_session)
    sm.refused(0, encode_txn(Transaction(0, Error(-101))))  # a real refusal is still answered


# -- the learner: drop the leader, persist and deliver nothing of it -------------------

def follower_in_synchronization() -> tuple[MetastoreStateMachine, Peer]:
    """Node 2 of {1, 2, 3}, following leader 1 of epoch 1, waiting for the leader's Sync."""
    sm = MetastoreStateMachine()
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3})), sm)
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(1)))
    return sm, p


def test_a_snap_of_garbage_leaves_the_follower_as_it_was_and_looking():
    sm, p = follower_in_synchronization()
    digest = sm.digest()
    out = p.step(Received(1, Sync(SyncMode.SNAP, Z.make(1, 5), b"\x00\xffnot a snapshot")))
    assert not [a for a in out if isinstance(a, (InstallSnapshot, Delivered))], out
    assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out
    assert p.role_state is None or p.leader_id != 1 or p.phase.value != "synchronization"
    assert (sm.digest(), sm.last_zxid, p.last_committed, p.last_zxid) == (digest, 0, 0, 0)


def test_a_refused_with_garbage_data_is_not_answered_and_the_follower_resyncs():
    c = settled(SimCluster(3, seed=11))
    leader = c.leader()
    follower = next(n for n in c.nodes if n != leader)
    mark = len(c.trace)
    op = ClientOp(follower, "", "", session_id=7, cxid=10**6)  # a client of the follower, waiting
    c.nodes[follower].pending[(7, op.cxid)] = op
    c.forge(follower, leader, Refused(7, op.cxid, c.peer(follower).last_committed, b"\xff\x00{garbage"))
    c.run(50)
    assert op.status != "refused", "garbage was answered to a client"
    assert disconnected(c, follower, leader, mark), c.describe_failure()
    settled(c).check_final()


def test_a_proposal_whose_payload_is_no_metastore_txn_is_neither_logged_nor_acked():
    c = metastore_cluster(seed=12)
    leader = c.leader()
    follower = next(n for n in c.nodes if n != leader)
    p = c.peer(follower)
    zxid = Z.make(Z.epoch_of(p.last_zxid), Z.counter_of(p.last_zxid) + 1)
    mark, log_before = len(c.trace), list(c.nodes[follower].disk.log)
    c.forge(follower, leader, Proposal(Txn(zxid, 0, 0, b"\x00\x00\x00\x01garbage")))
    c.forge(follower, leader, Commit(zxid))
    c.run(50)
    assert disconnected(c, follower, leader, mark), c.describe_failure()
    assert all(t.data != b"\x00\x00\x00\x01garbage" for t in c.nodes[follower].disk.log)
    assert c.nodes[follower].disk.log[:len(log_before)] == log_before
    settled(c).check_final()
    c.submit(follower, E.encode_envelope(E.Envelope(E.CLOSE_SESSION, 1, 1_000, (), b"")),
             session_id=0x0001_0000_0000_0001)
    settled(c).check_final()
    assert c.peer(follower).last_committed == c.peer(leader).last_committed


def test_a_diff_carrying_one_garbage_txn_logs_none_of_that_message():
    sm, p = follower_in_synchronization()
    p.step(Received(1, Sync(SyncMode.DIFF, 0)))
    good = encode_txn(Transaction(0, Error(-101)))  # an old-format no-op: decodes and applies
    out = p.step(Received(1, SyncTxns((Txn(Z.make(1, 1), 0, 0, good), Txn(Z.make(1, 2), 0, 0, b"\xff")))))
    assert not [a for a in out if isinstance(a, LogAppend)], out
    assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out
    assert p.last_zxid == 0


def test_a_committed_txn_that_cannot_be_applied_is_not_skipped_the_follower_stops_following():
    """A txn already in the follower's log (written by an older version, say) that does not decode:
    it cannot be skipped (the ones after it depend on it), so the follower delivers everything
    before it, drops the leader and goes back to election, with the bad txn still pending."""
    good = encode_txn(Transaction(0, Error(-101)))
    txns = (Txn(Z.make(1, 1), 0, 0, good), Txn(Z.make(1, 2), 0, 0, b"\xff"), Txn(Z.make(1, 3), 0, 0, good))
    sm = MetastoreStateMachine()
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3})), sm, DiskState(1, 1, txns=txns))
    p.start()
    p.step(Received(1, Notification(1, Z.make(1, 3), 1, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, Z.make(1, 3), 1, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(2)))
    p.step(Received(1, Sync(SyncMode.DIFF, Z.make(1, 3))))
    p.step(Received(1, NewLeader(2, Z.make(1, 3))))
    out = p.step(Received(1, UpToDate(Z.make(1, 3))))
    assert [a.txn.zxid for a in out if isinstance(a, Delivered)] == [Z.make(1, 1)]
    assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out
    assert not [a for a in out if isinstance(a, (Answered, Send)) and getattr(a, "to", None) == 1
                and type(getattr(a, "msg", None)).__name__ == "Ack"]
    assert (p.last_committed, sm.last_zxid, p.last_zxid) == (Z.make(1, 1), Z.make(1, 1), Z.make(1, 3))
