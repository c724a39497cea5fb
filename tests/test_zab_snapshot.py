"""SnapshotStore on real files: atomic writes, invalid newest snapshots, purge."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zab.storage.snapshot import (
    HEADER_BYTES,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot_header,
    read_snapshot,
    snapshot_name,
)
from zab.storage.storage_errors import SnapshotCorruptError


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snapshots")


def state(zxid: int) -> bytes:
    return f"state at {zxid}".encode() * 10


def corrupt(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_write_then_read_round_trip_and_layout(store):
    path = store.write(0x2_00000005, b"tree bytes")
    assert path.name == "snapshot.0000000200000005"
    assert read_snapshot(path) == (0x2_00000005, b"tree bytes")
    raw = path.read_bytes()
    assert raw[:4] == b"QSNP" and len(raw) == HEADER_BYTES + len(b"tree bytes")
    assert struct.unpack_from(">IQQ", raw, 4) == (1, 0x2_00000005, 10)
    assert not list(store.directory.glob("*.tmp"))


def test_empty_store(store):
    assert store.newest_valid() is None
    assert store.valid_zxids() == []
    assert store.purge(keep=2) == []


def test_newest_valid_and_ordering(store):
    for zxid in (5, 0x1_00000000, 300):
        store.write(zxid, state(zxid))
    assert store.valid_zxids() == [5, 300, 0x1_00000000]
    assert store.newest_valid() == (0x1_00000000, state(0x1_00000000))


@pytest.mark.parametrize("offset", [-1, 0, 10, 20, 29, HEADER_BYTES])
def test_invalid_newest_falls_back_to_older_valid(store, caplog, offset):
    store.write(10, state(10))
    newest = store.write(20, state(20))
    corrupt(newest, offset)
    with caplog.at_level(logging.WARNING, logger="quire.snapshot"):
        assert store.newest_valid() == (10, state(10))
    assert newest.name in caplog.text
    assert store.valid_zxids() == [10]


def test_truncated_or_extended_snapshot_is_invalid(store):
    path = store.write(7, state(7))
    good = path.read_bytes()
    path.write_bytes(good[:-1])
    with pytest.raises(SnapshotCorruptError, match="resync"):
        read_snapshot(path)
    path.write_bytes(good + b"\x00")
    with pytest.raises(SnapshotCorruptError):
        read_snapshot(path)


def test_name_and_header_zxid_must_agree(store):
    path = store.write(7, state(7))
    renamed = path.rename(store.directory / snapshot_name(8))
    with pytest.raises(SnapshotCorruptError, match="file name"):
        read_snapshot(renamed)
    assert store.newest_valid() is None


def test_unreadable_snapshot_is_corrupt(store):
    (store.directory / snapshot_name(9)).mkdir()
    with pytest.raises(SnapshotCorruptError):
        read_snapshot(store.directory / snapshot_name(9))


def test_leftover_tmp_files_are_ignored_and_discarded(store):
    store.write(3, state(3))
    tmp = store.directory / (snapshot_name(4) + ".tmp")
    tmp.write_bytes(b"half a snap")
    assert store.newest_valid() == (3, state(3))
    assert store.discard_temporaries() == [tmp]
    assert not tmp.exists()


def test_purge_keeps_newest_valid_and_invalid_newer_ones(store):
    paths = {z: store.write(z, state(z)) for z in (1, 2, 3, 4, 5, 6)}
    corrupt(paths[6])  # newest invalid: stays for the operator
    corrupt(paths[2])  # older than the oldest kept: removed
    removed = store.purge(keep=2)
    assert sorted(removed) == [paths[1], paths[2], paths[3]]
    assert store.valid_zxids() == [4, 5]
    assert paths[6].exists()


def test_purge_never_drops_the_last_valid_snapshot(store):
    paths = {z: store.write(z, state(z)) for z in (1, 2, 3)}
    corrupt(paths[2])
    corrupt(paths[3])
    assert store.purge(keep=5) == []
    assert store.purge(keep=1) == []
    assert store.valid_zxids() == [1]
    with pytest.raises(ValueError):
        store.purge(keep=0)


def test_all_invalid_purges_nothing(store):
    for zxid in (1, 2):
        corrupt(store.write(zxid, state(zxid)))
    assert store.purge(keep=1) == []
    assert len(store.files()) == 2


def test_overwriting_a_snapshot_replaces_it(store):
    store.write(5, b"old")
    store.write(5, b"new")
    assert store.newest_valid() == (5, b"new")


# --- fuzzing ------------------------------------------------------------------------


def _only_documented_errors(buf: bytes) -> None:
    try:
        zxid, body = decode_snapshot(buf)
    except SnapshotCorruptError:
        return
    assert encode_snapshot_header(zxid, body) + body == buf


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(buf):
    _only_documented_errors(buf)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 64) - 1), st.binary(max_size=100), st.data())
def test_fuzz_mutated_snapshots(zxid, body, data):
    buf = bytearray(encode_snapshot_header(zxid, body) + body)
    for _ in range(data.draw(st.integers(0, 3))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf) + 8))
    mutated = bytes(buf[:cut]) + b"\x00" * max(0, cut - len(buf))
    _only_documented_errors(mutated)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_read_snapshot_from_file(tmp_path_factory, buf):
    path = tmp_path_factory.mktemp("fuzz") / snapshot_name(1)
    path.write_bytes(buf)
    try:
        assert read_snapshot(path)[0] == 1
    except SnapshotCorruptError:
        pass


def test_each_node_snapshots_after_more_than_half_and_at_most_all_of_snapshot_every_txns():
    """ZooKeeper's randRoll, derived rather than drawn: the members of an ensemble do not all
    snapshot at once, and a simulated run replays exactly."""
    from zab.core.peer import snapshot_count

    for every in (1, 2, 3, 10, 50_000):
        counts = [snapshot_count(every, node, ordinal) for node in range(1, 8) for ordinal in range(20)]
        assert all(every // 2 < c <= every for c in counts), (every, counts)
    first = {snapshot_count(50_000, node, 0) for node in range(1, 6)}
    assert len(first) == 5, first  # five nodes, five different points
    assert snapshot_count(50_000, 3, 4) == snapshot_count(50_000, 3, 4)
    assert len({snapshot_count(50_000, 3, k) for k in range(10)}) > 1  # and a node's vary
