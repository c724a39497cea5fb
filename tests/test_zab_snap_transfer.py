"""A SNAP in chunks with a window (zab/core/snap_transfer.py): the pieces alone, then on the
simulated ensemble with chunks of 64 bytes, so a small tree takes many of them."""

from __future__ import annotations

import hashlib

from metastore.core.state_machine import MetastoreStateMachine
from sim.cluster import SimCluster
from zab.core import zxid as Z
from zab.core.actions import Disconnect, InstallSnapshot, Received, Send
from zab.core.config import ZabConfig
from zab.core.messages import (LeaderInfo, NewLeader, Notification, ServerState, SnapAck, SnapChunk, SnapEnd, Sync,
                               SyncMode, SyncTxns)
from zab.core.peer import Peer
from zab.core.snap_transfer import SnapReceiver, SnapSender

DATA = bytes(range(256)) * 10  # 2,560 bytes


def test_the_sender_keeps_a_window_and_ends_with_the_digest():
    s = SnapSender(DATA, chunk_bytes=100, window_chunks=3)
    first = s.start()
    assert [m.offset for m in first] == [0, 100, 200] and s.sent == 300
    assert s.on_ack(100) == [SnapChunk(300, DATA[300:400])]
    assert s.on_ack(100) == []  # the same ack again moves nothing
    assert s.on_ack(50) is None and s.on_ack(401) is None  # backwards, or beyond what was sent
    msgs = []
    while not s.ended:
        msgs += s.on_ack(s.sent)
    assert msgs[-1] == SnapEnd(len(DATA), hashlib.sha256(DATA).digest())
    assert not s.done and s.on_ack(len(DATA)) == [] and s.done


def test_the_receiver_takes_chunks_in_order_and_checks_the_whole():
    r = SnapReceiver(zxid=7, max_bytes=1 << 20)
    assert r.on_chunk(SnapChunk(0, DATA[:1000])) is None
    assert "expected 1000" in r.on_chunk(SnapChunk(1200, DATA[1200:]))
    assert r.on_chunk(SnapChunk(1000, DATA[1000:])) is None
    assert "bytes" in r.on_end(SnapEnd(len(DATA) + 1, hashlib.sha256(DATA).digest()))
    assert "SHA-256" in r.on_end(SnapEnd(len(DATA), hashlib.sha256(b"other").digest()))
    assert r.on_end(SnapEnd(len(DATA), hashlib.sha256(DATA).digest())) is None and r.complete == DATA
    assert r.on_chunk(SnapChunk(len(DATA), b"x")) is not None


def test_an_empty_snapshot_is_one_end_message():
    s = SnapSender(b"", chunk_bytes=10, window_chunks=1)
    assert s.start() == [SnapEnd(0, hashlib.sha256(b"").digest())]
    r = SnapReceiver(zxid=1, max_bytes=1 << 20)
    assert r.on_end(SnapEnd(0, hashlib.sha256(b"").digest())) is None and r.complete == b""


def lagging_cluster(seed: int) -> tuple[SimCluster, int]:
    """Node 3 down while 60 writes commit, with a history window of 5: it must come back by SNAP."""
    c = SimCluster(voters=3, seed=seed, sync_window_txns=5, snap_chunk_bytes=64, snap_window_chunks=2)
    assert c.run_until(c.in_broadcast, 10_000)
    lagging = next(i for i in c.alive() if i != c.leader())
    c.crash(lagging)
    for k in range(60):
        c.create(c.leader(), f"k{k}", "v" * 20)
    assert c.run_until(lambda: all(op.status == "acked" for op in c.ops), 20_000), c.describe_failure()
    assert len(c.peer(c.leader()).sm.freeze().to_bytes()) > 20 * 64  # many chunks
    return c, lagging


def test_a_follower_far_behind_comes_back_by_a_snap_of_many_chunks_while_clients_write():
    c, lagging = lagging_cluster(seed=3)
    c.restart(lagging)
    for k in range(60, 80):
        c.set_data(c.leader(), f"k{k - 60}", "w")
    assert c.run_until(c.converged, 30_000), c.describe_failure()
    c.check_final()
    assert c.read(lagging, "k59") == ("v" * 20, 0) and c.read(lagging, "k19") == ("w", 1)


def test_a_snap_cut_by_the_leaders_crash_is_dropped_and_the_next_leader_syncs_the_follower():
    c, lagging = lagging_cluster(seed=5)
    leader = c.leader()
    c.restart(lagging)

    def halfway() -> bool:
        role = c.nodes[lagging].peer.role_state if c.nodes[lagging].peer else None
        snap = getattr(role, "snap", None)
        return snap is not None and snap.received >= 8 * 64
    assert c.run_until(halfway, 20_000), c.describe_failure()
    c.crash(leader)
    assert c.run_until(lambda: c.leader() not in (None, leader) and c.converged(), 30_000), c.describe_failure()
    c.restart(leader)
    assert c.run_until(c.converged, 30_000), c.describe_failure()
    c.check_final()
    assert c.read(lagging, "k59") == ("v" * 20, 0)


def follower_receiving_a_snap() -> Peer:
    """Node 2 of {1, 2, 3}, following leader 1 of epoch 1, told a SNAP at 1/5 follows in chunks."""
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3})), MetastoreStateMachine())
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(1)))
    assert p.step(Received(1, Sync(SyncMode.SNAP, Z.make(1, 5)))) == []
    return p


def test_a_snap_whose_digest_fails_or_that_does_not_decode_installs_nothing_and_drops_the_leader():
    for data, digest in ((b"\x00" * 100, hashlib.sha256(b"something else").digest()),
                         (b"\x00\xffnot a snapshot", hashlib.sha256(b"\x00\xffnot a snapshot").digest())):
        p = follower_receiving_a_snap()
        assert p.step(Received(1, SnapChunk(0, data))) == [Send(1, SnapAck(len(data)))]
        out = p.step(Received(1, SnapEnd(len(data), digest)))
        assert not [a for a in out if isinstance(a, InstallSnapshot)], out
        assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out
        assert p.last_committed == 0


def test_history_or_newleader_before_the_snap_ended_is_a_broken_leader():
    for msg in (SyncTxns(()), NewLeader(1, Z.make(1, 5)), SnapChunk(2, b"x")):
        p = follower_receiving_a_snap()
        p.step(Received(1, SnapChunk(0, b"abc")))
        out = p.step(Received(1, msg))
        assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), (msg, out)


def test_the_leader_refuses_a_snapack_beyond_what_it_sent_or_from_a_learner_it_sends_no_snap():
    c, lagging = lagging_cluster(seed=7)
    leader = c.leader()
    other = next(i for i in c.alive() if i != leader)
    c.restart(lagging)
    assert c.run_until(lambda: getattr(c.peer(leader).role_state.learners.get(lagging), "snap", None) is not None,
                       20_000)
    out = c.peer(leader).step(Received(lagging, SnapAck(1 << 40)))
    assert [a.peer for a in out if isinstance(a, Disconnect)] == [lagging]
    out = c.peer(leader).step(Received(other, SnapAck(10)))
    assert [a.peer for a in out if isinstance(a, Disconnect)] == [other]


def test_a_snapshot_beyond_snap_max_bytes_is_refused_before_it_is_held():
    r = SnapReceiver(zxid=1, max_bytes=1000)
    assert r.on_chunk(SnapChunk(0, DATA[:1000])) is None
    assert "snap_max_bytes=1000" in r.on_chunk(SnapChunk(1000, b"x"))
    assert r.received == 1000


def test_a_leader_sending_more_than_snap_max_bytes_is_dropped():
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3}), snap_max_bytes=100), MetastoreStateMachine())
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(1)))
    p.step(Received(1, Sync(SyncMode.SNAP, Z.make(1, 5))))
    assert p.step(Received(1, SnapChunk(0, b"a" * 100))) == [Send(1, SnapAck(100))]
    out = p.step(Received(1, SnapChunk(100, b"b")))
    assert any(isinstance(a, Disconnect) and a.peer == 1 for a in out), out
    assert p.role_state is None  # back to election: the partial snapshot went with the role
