"""Linearizable sync (zab/core/read_index.py): a sync is answered only after a quorum of voters
confirmed the leadership in a round sent after the sync arrived."""

from __future__ import annotations

from sim.cluster import SimCluster
from zab.core.actions import ClientSync, Disconnect, Received, Send, Synced
from zab.core.messages import ReadIndexAck, ReadIndexProbe, SyncReply, SyncRequest
from zab.core.read_index import ReadIndex

THREE = frozenset({1, 2, 3})


def majority_of(voters: frozenset[int]):
    return lambda ids: len(ids & voters) * 2 > len(voters)


def answer(n: int) -> list:
    return [Synced(n, n, 100 + n)]


def test_a_lone_voter_answers_at_once_and_sends_no_round():
    r = ReadIndex(1, majority_of(frozenset({1})), retry_ticks=10)
    assert r.sync(answer(1), now=0) == (None, answer(1))


def test_a_sync_waits_for_one_other_voter_to_answer_the_round_sent_after_it():
    r = ReadIndex(1, majority_of(THREE), retry_ticks=10)
    assert r.sync(answer(1), now=0) == (1, [])
    assert r.acked(2, 1, now=1) == (None, answer(1))


def test_syncs_arriving_during_a_round_share_the_next_round_not_the_one_in_flight():
    r = ReadIndex(1, majority_of(THREE), retry_ticks=10)
    assert r.sync(answer(1), now=0) == (1, [])
    assert r.sync(answer(2), now=0) == (None, [])
    assert r.sync(answer(3), now=0) == (None, [])
    # Round 1 was sent before syncs 2 and 3 arrived: it confirms only sync 1, and round 2 starts.
    assert r.acked(3, 1, now=1) == (2, answer(1))
    assert r.acked(3, 1, now=1) == (None, [])  # a repeated or stale answer releases nothing
    assert r.acked(2, 2, now=2) == (None, answer(2) + answer(3))


def test_a_round_without_quorum_is_replaced_after_retry_ticks_and_old_answers_do_not_count():
    r = ReadIndex(1, majority_of(frozenset({1, 2, 3, 4, 5})), retry_ticks=4)
    assert r.sync(answer(1), now=0) == (1, [])
    assert r.acked(2, 1, now=1) == (None, [])  # 2 of 5
    assert r.sync(answer(2), now=2) == (None, [])
    assert r.tick(now=3) == (None, [])
    assert r.tick(now=4) == (2, [])  # one round for both waiting syncs
    assert r.acked(3, 1, now=5) == (None, [])  # an answer to the replaced round
    assert r.acked(3, 2, now=5) == (None, [])
    assert r.acked(2, 2, now=6) == (None, answer(1) + answer(2))
    assert r.last_round == 2


def test_in_the_simulator_a_sync_is_answered_only_after_a_voter_answered_the_probe():
    c = SimCluster(voters=3, seed=11)
    assert c.run_until(c.in_broadcast, 10_000)
    leader = c.leader()
    follower = next(i for i in c.alive() if i != leader)
    out = c.peer(leader).step(ClientSync(77, 1))
    assert not [a for a in out if isinstance(a, Synced)], out
    probes = [a for a in out if isinstance(a, Send) and isinstance(a.msg, ReadIndexProbe)]
    assert sorted(a.to for a in probes) == sorted(i for i in c.alive() if i != leader)
    # The follower answers its own leader's probe and nobody else's.
    assert _received(c, follower, leader, probes[0].msg) == [Send(leader, ReadIndexAck(probes[0].msg.round))]
    assert _received(c, follower, follower + 10, probes[0].msg) == []
    released = _received(c, leader, follower, ReadIndexAck(probes[0].msg.round))
    assert released == [Synced(77, 1, c.peer(leader).last_committed)]


def test_a_forwarded_sync_gets_its_reply_after_the_round_and_a_forged_round_is_refused():
    c = SimCluster(voters=3, seed=12)
    assert c.run_until(c.in_broadcast, 10_000)
    leader = c.leader()
    follower = next(i for i in c.alive() if i != leader)
    out = _received(c, leader, follower, SyncRequest(5, 6))
    [probe] = {a.msg for a in out if isinstance(a, Send) and isinstance(a.msg, ReadIndexProbe)}
    assert not [a for a in out if isinstance(a, Send) and isinstance(a.msg, SyncReply)]
    released = _received(c, leader, follower, ReadIndexAck(probe.round))
    assert released == [Send(follower, SyncReply(5, 6, c.peer(leader).last_committed))]
    forged = _received(c, leader, follower, ReadIndexAck(probe.round + 1))
    assert [a.peer for a in forged if isinstance(a, Disconnect)] == [follower]


def _received(c: SimCluster, node: int, frm: int, msg) -> list:
    return c.peer(node).step(Received(frm, msg))
