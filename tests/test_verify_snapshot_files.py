"""The verifiers read snapshot files in pieces (issue 19, item 2): replay.verify_replay restores
a snapshot's tree as zab.storage.snapshot.read_body yields the file's body, so a verifier task
holds the tree it rebuilds and one piece, never the file whole. Each story writes a real
snapshot file with the node's own SnapshotStore, then checks it as the Spark tasks do (without
Spark: spark_source's snapshot task, and the replay tasks, call exactly this), whole or damaged.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.tree import DataTree
from metastore.wire.snapshot_codec import encode_tree
from replay.verify_replay import check_snapshot, restore
from zab.core import zxid as Z
from zab.storage.snapshot import HEADER_BYTES, SnapshotStore, read_body, snapshot_name

ZXID = Z.make(3, 500)
PIECE = 4096


def _tree(znodes: int, data_bytes: int) -> DataTree:
    """A real tree: nested znodes, a session and its ephemeral, one znode larger than a piece."""
    tree = DataTree()
    tree.create_session(0x51, 30_000)
    tree.create("/app", b"x" * (3 * PIECE), OPEN_ACL_UNSAFE, 0, 1, 1, 0)
    for i in range(znodes):
        tree.create(f"/app/n{i:05}", bytes([i % 253]) * data_bytes, OPEN_ACL_UNSAFE, 0x51 if i == 7 else 0,
                    i + 1, 2 + i, 0)
    tree.last_zxid = ZXID
    return tree


def _snapshot_file(tmp_path: Path, znodes: int = 400, data_bytes: int = 200) -> tuple[Path, str]:
    """A snapshot file of a real tree at ZXID, and the digest a node restoring it whole gets."""
    state = encode_tree(_tree(znodes, data_bytes))
    whole = MetastoreStateMachine()
    whole.restore(ZXID, state)
    return SnapshotStore(tmp_path).write(ZXID, state), whole.digest()


def _counted(pieces: Iterator[bytes], sizes: list[int]) -> Iterator[bytes]:
    for piece in pieces:
        sizes.append(len(piece))
        yield piece


def test_a_snapshot_is_verified_from_many_bounded_pieces_with_the_digest_of_the_whole(tmp_path):
    path, digest = _snapshot_file(tmp_path)
    sizes: list[int] = []
    info = check_snapshot(_counted(read_body(path, PIECE), sizes), ZXID, str(path))
    assert (info.status, info.zxid, info.digest, info.error) == ("ok", ZXID, digest, "")
    assert len(sizes) > 20 and max(sizes) <= PIECE
    assert sum(sizes) == path.stat().st_size - HEADER_BYTES
    assert restore(ZXID, read_body(path, PIECE)).digest() == digest  # what the replay tasks start from


def test_verifying_holds_the_tree_and_a_piece_not_the_file(tmp_path):
    """Read whole, the file's bytes and a copy of its body sat beside the tree they became."""
    path, digest = _snapshot_file(tmp_path, znodes=60, data_bytes=100_000)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        info = check_snapshot(read_body(path, 64 * 1024), ZXID, str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.digest == digest
    assert peak < size * 1.4, f"peak {peak} for a snapshot file of {size} bytes"


def test_a_damaged_byte_is_reported_as_the_files_checksum_even_where_decoding_stops_first(tmp_path):
    path, _ = _snapshot_file(tmp_path)
    whole = path.read_bytes()
    # The tree snapshot's magic (decoding stops at once), a znode's path length, a data byte, the last byte.
    for at in (HEADER_BYTES, HEADER_BYTES + 200, len(whole) // 2, len(whole) - 1):
        damaged = bytearray(whole)
        damaged[at] ^= 0x21
        path.write_bytes(bytes(damaged))
        info = check_snapshot(read_body(path, PIECE), ZXID, str(path))
        assert (info.status, info.digest) == ("corrupt", None)
        assert "body checksum mismatch" in info.error, (at, info.error)


def test_a_truncated_or_misnamed_snapshot_is_corrupt(tmp_path):
    path, _ = _snapshot_file(tmp_path)
    whole = path.read_bytes()
    for keep in (0, HEADER_BYTES - 1, HEADER_BYTES + 10, len(whole) - 1):
        path.write_bytes(whole[:keep])
        info = check_snapshot(read_body(path, PIECE), ZXID, str(path))
        assert info.status == "corrupt" and "bytes" in info.error, (keep, info.error)
    renamed = path.with_name(snapshot_name(ZXID + 1))
    renamed.write_bytes(whole)
    info = check_snapshot(read_body(renamed, PIECE), ZXID + 1, str(renamed))
    assert info.status == "corrupt" and "differs from the file name" in info.error


def test_a_checksummed_state_that_is_no_tree_does_not_restore(tmp_path):
    """A file that passes its CRC but holds what no tree encodes: a bug of the node that wrote it."""
    path = SnapshotStore(tmp_path).write(ZXID, b"QZNT" + bytes(5000))
    info = check_snapshot(read_body(path, PIECE), ZXID, str(path))
    assert info.status == "corrupt" and "state does not restore" in info.error, info.error


def test_a_checksummed_tree_whose_digest_is_wrong_does_not_restore_in_the_verifier(tmp_path):
    """A node takes a snapshot's digest on trust (its CRC passed); the verifier recomputes it, so
    an encoder's wrong digest is reported there rather than carried on."""
    state = bytearray(encode_tree(_tree(50, 20)))
    state[20] ^= 1  # the last byte of the header's digest (magic 4, version 1, zxid 8, digest 8)
    path = SnapshotStore(tmp_path).write(ZXID, bytes(state))
    node = MetastoreStateMachine()
    node.restore(ZXID, read_body(path, PIECE))
    info = check_snapshot(read_body(path, PIECE), ZXID, str(path))
    assert info.status == "corrupt" and "digest" in info.error, info.error
    assert node.tree.digest() != node.tree.recompute_digest()
