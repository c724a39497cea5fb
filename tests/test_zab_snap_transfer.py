"""A SNAP in chunks with a window (zab/core/snap_transfer.py): the pieces alone, then on the
simulated ensemble with chunks of 64 bytes, so a small tree takes many of them."""

from __future__ import annotations

import hashlib

from crc32c import crc32c

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.tree import DataTree
from metastore.wire.snapshot_codec import encode_tree
from sim.cluster import SimCluster
from zab.core import zxid as Z
from zab.core.actions import (Disconnect, InstallSnapshot, PeerDisconnected, Received, Send, SnapBegin, SnapDiscard,
                              SnapWrite)
from zab.core.config import ZabConfig
from zab.core.messages import (LeaderInfo, NewLeader, Notification, ServerState, SnapAck, SnapChunk, SnapEnd, Sync,
                               SyncMode, SyncTxns)
from zab.core.peer import Peer
from zab.core.snap_transfer import SnapReceiver, SnapSender

def tree_at(zxid: int, znodes: int = 30) -> DataTree:
    """A real tree: `znodes` znodes under /t, one of them ephemeral, with its session."""
    tree = DataTree()
    tree.create_session(0x55, 10_000)
    tree.create("/t", b"", OPEN_ACL_UNSAFE, 0, 1, 1, 0)
    for i in range(znodes):
        tree.create(f"/t/n{i:03}", b"v" * 40, OPEN_ACL_UNSAFE, 0x55 if i == 7 else 0, i + 1, 2 + i, 0)
    tree.last_zxid = zxid
    return tree


ZXID = Z.make(1, 5)
DATA = encode_tree(tree_at(ZXID))  # a real snapshot, about 2.5 KB


def chunks_of(data: bytes, n: int):
    return iter([data[i:i + n] for i in range(0, len(data), n)])


def chunk(offset: int, data: bytes) -> SnapChunk:
    return SnapChunk(offset, data, crc32c(data))


def receiver(max_bytes: int = 1 << 20) -> tuple[SnapReceiver, MetastoreStateMachine]:
    sm = MetastoreStateMachine()
    return SnapReceiver(ZXID, max_bytes, sm.restorer(ZXID)), sm


def test_the_sender_pulls_chunks_as_the_window_opens_and_ends_with_the_digest():
    pulled = []
    source = chunks_of(DATA, 100)
    s = SnapSender((pulled.append(c) or c for c in source), chunk_bytes=100, window_chunks=3)
    first = s.start()
    assert [m.offset for m in first] == [0, 100, 200] and s.sent == 300
    assert len(pulled) == 3  # nothing encoded beyond the window
    assert s.on_ack(100) == [chunk(300, DATA[300:400])]
    assert s.on_ack(100) == []  # the same ack again moves nothing
    assert s.on_ack(50) is None and s.on_ack(401) is None  # backwards, or beyond what was sent
    msgs = []
    while not s.ended:
        msgs += s.on_ack(s.sent)
    assert msgs[-1] == SnapEnd(len(DATA), hashlib.sha256(DATA).digest())
    assert not s.done and s.on_ack(len(DATA)) == [] and s.done


def test_the_receiver_checks_order_and_crc_decodes_as_chunks_come_and_installs_after_the_digest():
    r, sm = receiver()
    assert r.on_chunk(chunk(0, DATA[:1000])) is None
    assert "expected 1000" in r.on_chunk(chunk(1200, DATA[1200:]))
    assert "CRC-32C" in r.on_chunk(SnapChunk(1000, DATA[1000:], crc32c(DATA[1000:]) ^ 1))
    assert r.on_chunk(chunk(1000, DATA[1000:])) is None
    assert "bytes" in r.on_end(SnapEnd(len(DATA) + 1, hashlib.sha256(DATA).digest()))
    assert "SHA-256" in r.on_end(SnapEnd(len(DATA), hashlib.sha256(b"other").digest()))
    assert sm.tree.node("/t") is None  # nothing installed before the end is proven
    assert r.on_end(SnapEnd(len(DATA), hashlib.sha256(DATA).digest())) is None and r.complete
    assert r.install() is None
    assert sm.last_zxid == ZXID and sm.digest() == f"{tree_at(ZXID).digest():016x}"
    assert r.on_chunk(chunk(len(DATA), b"x")) is not None


def test_an_empty_stream_is_one_end_message():
    s = SnapSender(iter(()), chunk_bytes=10, window_chunks=1)
    assert s.start() == [SnapEnd(0, hashlib.sha256(b"").digest())]
    r, _ = receiver()
    assert r.on_end(SnapEnd(0, hashlib.sha256(b"").digest())) is None
    assert "does not decode" in r.install()  # an empty snapshot is not a tree


def test_a_chunk_that_is_not_a_snapshot_is_refused_at_once_not_at_the_end():
    r, _ = receiver()
    junk = b"\x00\xffnot a snapshot at all" * 4
    assert "does not decode" in r.on_chunk(chunk(0, junk))
    r, _ = receiver()
    other = encode_tree(tree_at(Z.make(1, 9)))  # a snapshot, but at another zxid than SYNC said
    assert "expected" in r.on_chunk(chunk(0, other[:100]))


def lagging_cluster(seed: int) -> tuple[SimCluster, int]:
    """Node 3 down while 60 writes commit, with a history window of 5: it must come back by SNAP."""
    c = SimCluster(voters=3, seed=seed, sync_window_txns=5, snap_chunk_bytes=64, snap_window_chunks=2)
    assert c.run_until(c.in_broadcast, 10_000)
    lagging = next(i for i in c.alive() if i != c.leader())
    c.crash(lagging)
    for k in range(60):
        c.create(c.leader(), f"k{k}", "v" * 20)
    assert c.run_until(lambda: all(op.status == "acked" for op in c.ops), 20_000), c.describe_failure()
    assert sum(map(len, c.peer(c.leader()).sm.freeze().chunks(64))) > 20 * 64  # many chunks
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
    assert c.nodes[lagging].disk.receiving is not None  # the partial snapshot, on its (simulated) disk
    c.crash(leader)
    assert c.run_until(lambda: c.leader() not in (None, leader) and c.converged(), 30_000), c.describe_failure()
    assert c.nodes[lagging].disk.receiving is None  # discarded, then the next leader's SNAP installed
    c.restart(leader)
    assert c.run_until(c.converged, 30_000), c.describe_failure()
    c.check_final()
    assert c.read(lagging, "k59") == ("v" * 20, 0)


def follower_receiving_a_snap(**config) -> Peer:
    """Node 2 of {1, 2, 3}, following leader 1 of epoch 1, told a SNAP at 1/5 follows in chunks."""
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3}), **config), MetastoreStateMachine())
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(1)))
    assert p.step(Received(1, Sync(SyncMode.SNAP, ZXID))) == [SnapBegin(ZXID)]
    return p


def dropped_leader_and_discarded(out: list) -> bool:
    return (any(isinstance(a, Disconnect) and a.peer == 1 for a in out) and SnapDiscard(ZXID) in out
            and not [a for a in out if isinstance(a, InstallSnapshot)])


def test_a_learner_writes_each_chunk_then_acks_it_and_installs_once_the_digest_holds():
    p = follower_receiving_a_snap()
    out = []
    for offset in range(0, len(DATA), 1000):
        piece = DATA[offset:offset + 1000]
        got = p.step(Received(1, chunk(offset, piece)))
        assert got == [SnapWrite(piece, then=(Send(1, SnapAck(offset + len(piece))),))]  # acked once written
        out += got
    assert p.sm.last_zxid == 0  # the old state serves until the end
    assert p.step(Received(1, SnapEnd(len(DATA), hashlib.sha256(DATA).digest()))) == [InstallSnapshot(ZXID)]
    assert p.sm.last_zxid == ZXID and p.last_committed == ZXID and p.history.base_zxid == ZXID


def test_a_snap_whose_digest_fails_or_that_does_not_decode_installs_nothing_discards_and_drops_the_leader():
    p = follower_receiving_a_snap()
    p.step(Received(1, chunk(0, DATA)))
    assert dropped_leader_and_discarded(p.step(Received(1, SnapEnd(len(DATA), hashlib.sha256(b"else").digest()))))
    assert p.last_committed == 0 and p.sm.last_zxid == 0
    p = follower_receiving_a_snap()
    assert dropped_leader_and_discarded(p.step(Received(1, chunk(0, b"\x00\xffnot a snapshot" * 3))))
    p = follower_receiving_a_snap()
    p.step(Received(1, chunk(0, DATA[:-1])))  # every chunk right, the last one missing
    assert dropped_leader_and_discarded(p.step(Received(1, SnapEnd(len(DATA) - 1, hashlib.sha256(DATA[:-1]).digest()))))
    assert p.sm.last_zxid == 0


def test_a_leader_lost_mid_transfer_leaves_no_partial_file_behind():
    p = follower_receiving_a_snap()
    p.step(Received(1, chunk(0, DATA[:500])))
    out = p.step(PeerDisconnected(1))
    assert SnapDiscard(ZXID) in out and p.role_state is None and p.sm.last_zxid == 0


def test_history_or_newleader_before_the_snap_ended_is_a_broken_leader():
    for msg in (SyncTxns(()), NewLeader(1, ZXID), chunk(2, b"x")):
        p = follower_receiving_a_snap()
        p.step(Received(1, chunk(0, DATA[:3])))
        assert dropped_leader_and_discarded(p.step(Received(1, msg))), msg


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


def test_a_snapshot_beyond_snap_max_bytes_is_refused_before_it_is_written():
    r, _ = receiver(max_bytes=1000)
    assert r.on_chunk(chunk(0, DATA[:1000])) is None
    assert "snap_max_bytes=1000" in r.on_chunk(chunk(1000, b"x"))
    assert r.received == 1000


def test_a_leader_sending_more_than_snap_max_bytes_is_dropped():
    p = follower_receiving_a_snap(snap_max_bytes=100)
    assert p.step(Received(1, chunk(0, DATA[:100]))) == [SnapWrite(DATA[:100], then=(Send(1, SnapAck(100)),))]
    assert dropped_leader_and_discarded(p.step(Received(1, chunk(100, DATA[100:101]))))
    assert p.role_state is None  # back to election: the partial snapshot went with the role
