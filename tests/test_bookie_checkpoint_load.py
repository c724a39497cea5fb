"""Loading a bookie's index checkpoint at start, streamed (issue 19, items 1 and 2).

The checkpoint file is about as large as the index (12 bytes a slot: gigabytes on a big
bookie), so a bookie reads it in pieces, sums its CRC on the way and builds the index as the
pieces come, never holding the file's bytes whole. These stories write real checkpoint files
with the bookie's own writer and load them back with a small piece size, so that even a modest
index takes hundreds of pieces; then they damage the file and watch the load refuse it.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from bookie.checkpoint import HEADER_BYTES, Checkpoint, CheckpointCorrupt, decode_checkpoint_from
from bookie.errors import StorageError
from bookie.index import Index, pack_position
from bookie.storage_recovery import read_checkpoint, write_checkpoint
from bookie_fixtures import KEY

PIECE = 4096  # small, so the files below take many pieces


def _index(ledgers: int, entries: int) -> Index:
    """`ledgers` ledgers of `entries` dense slots (striped: every other id), a far-away outlier
    each, one fenced and keyless, and two deleted ids."""
    index = Index()
    for ledger_id in range(1, ledgers + 1):
        state = index.state_for_write(ledger_id)
        state.master_key = None if ledger_id == 2 else KEY
        state.fenced = ledger_id == 2
        state.explicit_lac = entries - 3
        for entry_id in range(0, 2 * entries, 2):
            state.entries.put_new(entry_id, pack_position(ledger_id, 100 + entry_id), 10 + entry_id % 7)
        state.entries.put(10_000_000 + ledger_id, pack_position(ledger_id, 99), 5)
    index.delete(1000)
    index.delete(1001)
    return index


def _written(tmp_path: Path, index: Index) -> tuple[Path, Checkpoint]:
    checkpoint = Checkpoint(7, 4, {1: (1 << 20, 1 << 19), 3: (4096, 0)}, index)
    path = tmp_path / "checkpoint"
    write_checkpoint(path, checkpoint)
    return path, checkpoint


def _assert_same(loaded: Checkpoint, written: Checkpoint) -> None:
    assert (loaded.journal_seq, loaded.next_log_id, loaded.logs) == (
        written.journal_seq, written.next_log_id, written.logs)
    assert loaded.index.deleted == written.index.deleted
    assert loaded.index.live_bytes == {log_id: live for log_id, (_, live) in written.logs.items()}
    assert loaded.index.memory_bytes() == written.index.memory_bytes()
    assert set(loaded.index.ledgers) == set(written.index.ledgers)
    for ledger_id, state in written.index.ledgers.items():
        other = loaded.index.ledgers[ledger_id]
        assert list(other.entries.items()) == list(state.entries.items())
        assert (other.master_key, other.fenced, other.explicit_lac, other.max_lac, other.last_entry) == (
            state.master_key, state.fenced, state.explicit_lac, state.max_lac, state.last_entry)


def test_a_checkpoint_loads_back_in_many_bounded_pieces(tmp_path):
    path, written = _written(tmp_path, _index(ledgers=5, entries=20_000))
    asked: list[int] = []
    with path.open("rb") as file:
        def read(size: int) -> bytes:
            asked.append(size)
            return file.read(size)

        loaded = decode_checkpoint_from(read, piece_bytes=PIECE)
    _assert_same(loaded, written)
    assert len(asked) > path.stat().st_size // PIECE, "the file was read in pieces"
    assert max(asked) <= PIECE
    _assert_same(read_checkpoint(path, piece_bytes=PIECE), written)  # the bookie's own load
    _assert_same(read_checkpoint(path), written)  # and with its default piece


def test_loading_holds_the_index_and_a_piece_not_the_file(tmp_path):
    """Reading the file whole before decoding held its bytes beside the index it becomes (twice
    the index); streamed, the load's peak is the index plus a piece."""
    path, written = _written(tmp_path, _index(ledgers=2, entries=300_000))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        loaded = read_checkpoint(path, piece_bytes=64 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _assert_same(loaded, written)
    assert size > 7_000_000
    assert peak < size * 1.3 + 256 * 1024, f"peak {peak} for a file of {size} bytes"


def test_every_truncation_of_a_checkpoint_is_refused(tmp_path):
    path, _ = _written(tmp_path, _index(ledgers=3, entries=3000))
    whole = path.read_bytes()
    for keep in (0, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 10, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:keep])
        with path.open("rb") as file, pytest.raises(CheckpointCorrupt, match="shorter than its header|truncated"):
            decode_checkpoint_from(file.read, piece_bytes=PIECE)
        with pytest.raises(StorageError, match="wipe the bookie directory"):
            read_checkpoint(path, piece_bytes=PIECE)


def test_a_corrupted_byte_anywhere_is_refused(tmp_path):
    path, _ = _written(tmp_path, _index(ledgers=3, entries=3000))
    whole = path.read_bytes()
    # The header, the journal position, a ledger's fields, its positions and lengths, the last byte.
    for at in (5, HEADER_BYTES + 3, HEADER_BYTES + 200, len(whole) // 3, len(whole) // 2, len(whole) - 1):
        damaged = bytearray(whole)
        damaged[at] ^= 0x40
        path.write_bytes(bytes(damaged))
        expected = "header is invalid" if at < HEADER_BYTES else "checksum mismatch"
        with path.open("rb") as file, pytest.raises(CheckpointCorrupt, match=expected):
            decode_checkpoint_from(file.read, piece_bytes=PIECE)
        with pytest.raises(StorageError, match="wipe the bookie directory"):
            read_checkpoint(path, piece_bytes=PIECE)


def test_bytes_after_the_announced_body_are_refused(tmp_path):
    path, _ = _written(tmp_path, _index(ledgers=1, entries=100))
    with path.open("ab") as file:
        file.write(b"\0")
    with path.open("rb") as file, pytest.raises(CheckpointCorrupt, match="longer than"):
        decode_checkpoint_from(file.read, piece_bytes=PIECE)


def test_a_missing_checkpoint_is_a_fresh_directory(tmp_path):
    fresh = read_checkpoint(tmp_path / "checkpoint")
    assert (fresh.journal_seq, fresh.next_log_id, fresh.index.ledgers) == (1, 1, {})
