"""Streamed snapshots on real files (issue 19 item 1): the tree's snapshot encoded and decoded in
bounded pieces, snapshot files written and read in pieces, a learner's SNAP written to a partial
file by the real log writer's thread as chunks arrive (discarded when the transfer is cut or
fails its digest, installed atomically when it holds), and a node restarted from such a file."""

from __future__ import annotations

import hashlib
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.tree import DataTree
from metastore.errors import DecodeError
from metastore.wire.snapshot_codec import FrozenTree, encode_tree
from metastore.wire.snapshot_stream import SnapshotDecoder, decode_chunks
from zab.core import zxid as Z
from zab.core.actions import LogSync, PeerDisconnected, Received, Send, SnapBegin, TakeSnapshot
from zab.core.config import ZabConfig
from zab.core.messages import LeaderInfo, Notification, Ping, ServerState, SnapAck, SnapChunk, SnapEnd, Sync, SyncMode
from zab.core.peer import DiskState, Peer
from zab.edge.driver import _LOG_ACTIONS
from zab.edge.log_writer import LogWriter
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR, recover
from zab.storage.snapshot import RECEIVING_SUFFIX, SnapshotStore, read_body, read_snapshot, verify_snapshot
from zab.storage.storage_errors import SnapshotCorruptError
from zab.storage.txnlog import TxnLog

ZXID = Z.make(1, 40)


def big_tree(znodes: int = 200, data_bytes: int = 300) -> DataTree:
    """A real tree with nested znodes, shared and distinct ACLs, a session and its ephemeral."""
    tree = DataTree()
    tree.create_session(0x77, 30_000)
    tree.create("/a", b"", OPEN_ACL_UNSAFE, 0, 1, 1, 0)
    tree.create("/a/b", b"x" * 5000, OPEN_ACL_UNSAFE, 0, 1, 2, 0)  # larger than the small chunks below
    for i in range(znodes):
        tree.create(f"/a/b/n{i:04}", bytes([i % 251]) * data_bytes, OPEN_ACL_UNSAFE, 0x77 if i == 3 else 0,
                    i + 1, 3 + i, 0)
    tree.last_zxid = ZXID
    return tree


TREE = big_tree()
SNAPSHOT = encode_tree(TREE)


# -- the chunked serializer ------------------------------------------------------------------

@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 4096, 1 << 20])
def test_a_frozen_views_chunks_are_bounded_and_join_to_its_whole_snapshot(chunk_bytes):
    chunks = list(FrozenTree.of(TREE).chunks(chunk_bytes))
    assert all(0 < len(c) <= chunk_bytes for c in chunks)
    # Cut where the next record would not fit: no two neighbours would have fit in one chunk.
    assert all(len(a) + len(b) > chunk_bytes for a, b in zip(chunks, chunks[1:]))
    assert b"".join(chunks) == SNAPSHOT == FrozenTree.of(TREE).to_bytes()


def test_a_frozen_view_streamed_after_the_tree_moved_on_is_the_state_at_the_freeze():
    tree = big_tree(znodes=50)
    before = encode_tree(tree)
    chunks = FrozenTree.of(tree).chunks(100)
    first = next(chunks)  # the stream is under way ...
    tree.set_data("/a/b/n0001", b"changed", 1, Z.make(1, 99), 5)  # ... while the tree changes
    tree.delete("/a/b/n0002", Z.make(1, 100))
    assert first + b"".join(chunks) == before


@settings(max_examples=60)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40))
def test_the_decoder_rebuilds_the_same_tree_whatever_the_split_points(sizes):
    pieces, at = [], 0
    for size in sizes:
        pieces.append(SNAPSHOT[at:at + size])
        at += size
    pieces.append(SNAPSHOT[at:])
    tree = decode_chunks(p for p in pieces if p)
    assert tree.digest() == TREE.digest() and encode_tree(tree) == SNAPSHOT


def test_the_decoder_keeps_only_the_unparsed_tail():
    decoder = SnapshotDecoder()
    for i in range(0, len(SNAPSHOT), 512):
        decoder.feed(SNAPSHOT[i:i + 512])
        assert len(decoder._buf) <= 512 + 5000 + 100  # one piece and the record straddling it
    assert decoder.finish().digest() == TREE.digest()


def test_the_decoder_refuses_a_prefix_trailing_bytes_and_a_damaged_snapshot():
    for bad in (SNAPSHOT[:-1], SNAPSHOT + b"\0", SNAPSHOT[:40]):
        with pytest.raises(DecodeError):
            decode_chunks([bad[:100], bad[100:]])
    flipped = bytearray(SNAPSHOT)
    flipped[SNAPSHOT.index(b"x" * 5000)] ^= 1
    with pytest.raises(DecodeError, match="digest"):
        decode_chunks([bytes(flipped)])


# -- snapshot files in pieces --------------------------------------------------------------------

def test_a_snapshot_file_is_written_from_chunks_and_read_back_in_bounded_pieces(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots")
    written = store.write_chunks(ZXID, FrozenTree.of(TREE).chunks(1000))
    assert written.body_length == len(SNAPSHOT) and read_snapshot(written.path) == (ZXID, SNAPSHOT)
    pieces = list(read_body(written.path, chunk_bytes=4096))
    assert max(map(len, pieces)) <= 4096 and b"".join(pieces) == SNAPSHOT
    assert verify_snapshot(written.path) == ZXID and store.newest_valid_file() == (ZXID, written.path)
    assert not list(store.directory.glob("*.tmp"))


def test_a_body_damaged_after_verification_fails_at_the_end_of_the_read(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots")
    path = store.write(ZXID, SNAPSHOT)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorruptError, match="body checksum"):
        b"".join(read_body(path, chunk_bytes=1024))
    assert store.newest_valid_file() is None


# -- the learner's partial file, through the real log writer ----------------------------------------

BARRIER = Send(99, Ping())


@asynccontextmanager
async def running_writer(data_dir: Path):
    """The node's real LogWriter on `data_dir`, its thread running; yields `perform(actions)`, which
    returns once the thread has done them (and everything they released)."""
    log = TxnLog.open(data_dir / TXNLOG_DIR)
    store = SnapshotStore(data_dir / SNAPSHOT_DIR)
    released: list = []
    woken = [trio.Event()]

    def on_done() -> None:
        for then in writer.take_done():
            released.extend(then)
        woken[0].set()

    writer = LogWriter(log, store, snapshots_retained=2, on_done=on_done)

    async def perform(actions) -> list:
        for a in actions:
            if isinstance(a, _LOG_ACTIONS):  # what the driver hands the writer; the rest is not the disk's
                writer.submit(a)
        writer.submit(LogSync(then=(BARRIER,)))
        writer.flush()
        with trio.fail_after(30):
            while BARRIER not in released:
                await woken[0].wait()
                woken[0] = trio.Event()
        out = [a for a in released if a != BARRIER]
        released.clear()
        return out

    perform.writer = writer
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        yield perform
        nursery.cancel_scope.cancel()
    log.close()


def learner_in_snap(data_dir: Path) -> tuple[Peer, list]:
    """Node 2 of {1, 2, 3}, recovered from `data_dir`, following leader 1 of epoch 1 into a SNAP at ZXID."""
    recovered = recover(data_dir)
    recovered.log.close()
    p = Peer(ZabConfig(my_id=2, voters=frozenset({1, 2, 3})), MetastoreStateMachine(),
             DiskState(0, 0, recovered.snapshot_zxid, recovered.snapshot_chunks(), tuple(recovered.txns)))
    p.start()
    p.step(Received(1, Notification(1, 0, 0, 1, ServerState.LEADING)))
    p.step(Received(3, Notification(1, 0, 0, 1, ServerState.FOLLOWING)))
    p.step(Received(1, LeaderInfo(1)))
    out = p.step(Received(1, Sync(SyncMode.SNAP, ZXID)))
    assert out == [SnapBegin(ZXID)]
    return p, out


def chunk_messages(chunk_bytes: int = 700) -> list[SnapChunk]:
    return [SnapChunk(i, SNAPSHOT[i:i + chunk_bytes], crc32c(SNAPSHOT[i:i + chunk_bytes]))
            for i in range(0, len(SNAPSHOT), chunk_bytes)]


def partial_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / SNAPSHOT_DIR).glob("*" + RECEIVING_SUFFIX))


def test_a_snap_is_written_to_a_partial_file_as_it_arrives_and_installed_atomically(tmp_path):
    async def main() -> None:
        p, begin = learner_in_snap(tmp_path)
        async with running_writer(tmp_path) as perform:
            await perform(begin)
            messages = chunk_messages()
            for m in messages[:3]:
                acks = await perform(p.step(Received(1, m)))
                assert acks == [Send(1, SnapAck(m.offset + len(m.data)))]  # released once written
            [partial] = partial_files(tmp_path)
            assert partial.stat().st_size == 32 + 3 * 700  # the header's place, then the chunks
            for m in messages[3:]:
                await perform(p.step(Received(1, m)))
            await perform(p.step(Received(1, SnapEnd(len(SNAPSHOT), hashlib.sha256(SNAPSHOT).digest()))))
        assert partial_files(tmp_path) == [] and p.sm.digest() == f"{TREE.digest():016x}"
        assert read_snapshot(tmp_path / SNAPSHOT_DIR / f"snapshot.{ZXID:016x}") == (ZXID, SNAPSHOT)
        # A restart restores the tree from that file, in pieces.
        p2, _ = learner_in_snap(tmp_path)
        assert p2.sm.digest() == p.sm.digest() and p2.last_committed == ZXID

    trio.run(main)


@pytest.mark.parametrize("cut", ["leader lost", "bad digest", "bad chunk"])
def test_a_cut_or_refused_snap_leaves_no_partial_file_and_the_old_state(tmp_path, cut):
    async def main() -> None:
        p, begin = learner_in_snap(tmp_path)
        async with running_writer(tmp_path) as perform:
            await perform(begin)
            messages = chunk_messages()
            for m in messages[:4]:
                await perform(p.step(Received(1, m)))
            assert len(partial_files(tmp_path)) == 1
            if cut == "leader lost":
                await perform(p.step(PeerDisconnected(1)))
            elif cut == "bad digest":
                for m in messages[4:]:
                    await perform(p.step(Received(1, m)))
                await perform(p.step(Received(1, SnapEnd(len(SNAPSHOT), hashlib.sha256(b"not it").digest()))))
            else:
                m = messages[4]
                await perform(p.step(Received(1, SnapChunk(m.offset, m.data, m.crc ^ 1))))
        assert partial_files(tmp_path) == [] and not list((tmp_path / SNAPSHOT_DIR).iterdir())
        assert p.sm.last_zxid == 0 and p.last_committed == 0

    trio.run(main)


def test_a_partial_file_left_by_a_crash_is_removed_at_start(tmp_path):
    async def main() -> None:
        p, begin = learner_in_snap(tmp_path)
        async with running_writer(tmp_path) as perform:
            await perform(begin)
            await perform(p.step(Received(1, chunk_messages()[0])))
        # The writer stopped with the transfer open, as a SIGKILL would leave it.
        assert len(partial_files(tmp_path)) == 1

    trio.run(main)
    recovered = recover(tmp_path)
    recovered.log.close()
    assert partial_files(tmp_path) == [] and recovered.snapshot_path is None


def test_a_local_snapshot_is_written_in_pieces_and_a_restart_restores_it_in_pieces(tmp_path):
    sm = MetastoreStateMachine()
    sm.restore(ZXID, SNAPSHOT)

    async def main() -> None:
        async with running_writer(tmp_path) as perform:
            await perform([TakeSnapshot(sm.freeze())])
            await perform.writer.snapshotter.wait_taken(1)  # written beside the log, on its own thread

    trio.run(main)
    recovered = recover(tmp_path)
    recovered.log.close()
    assert recovered.snapshot_zxid == ZXID
    pieces = recovered.snapshot_chunks()
    restored = MetastoreStateMachine()
    restored.restore(ZXID, pieces)
    assert restored.digest() == sm.digest()
