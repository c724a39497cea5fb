"""The bookie index's memory bound (issue 19, item 2; docs/operations.md, "Memory bounds").

The index lives in memory and grows with the entries a bookie stores (12 bytes a dense slot,
far more for an entry id far from the others). Past `max_index_bytes` (cluster.toml's
`bookie_max_index_bytes`) the bookie turns read-only as on a full disk: adds are refused with
BookieReadOnly naming the bound, reads and fences go on; deleting ledgers brings it back.
These stories run the real storage engine on real files.
"""

from __future__ import annotations

import dataclasses

import pytest

from bookie.checkpoint import CHUNK_SLOTS, Checkpoint, decode_checkpoint, encode_checkpoint
from bookie.errors import BookieReadOnly
from bookie.index import DENSE_SLOT_BYTES, LEDGER_BYTES, SPARSE_ENTRY_BYTES, Index, pack_position
from bookie.storage import BookieStorageConfig
from bookie_fixtures import KEY, SMALL, add_all, add_req, packaged, trio_test
from bookie_fixtures import open_small_storage as open_storage

BOUNDED = dataclasses.replace(SMALL, max_index_bytes=8192)


def test_the_index_counts_dense_slots_outliers_ledgers_and_deleted_ids():
    index = Index()
    state = index.state_for_write(1)
    for entry_id in range(0, 30, 3):  # striped: every third id here, the holes cost a slot each
        state.entries.put(entry_id, pack_position(1, 100 + entry_id), 10)
    state.entries.put(1_000_000, pack_position(1, 99), 10)  # far past the dense run: an outlier
    assert index.memory_bytes() == LEDGER_BYTES + 28 * DENSE_SLOT_BYTES + SPARSE_ENTRY_BYTES
    index.delete(1)
    assert index.memory_bytes() == 150  # the deleted id stays, so a zombie writer finds it deleted


@trio_test
async def test_past_max_index_bytes_adds_are_refused_reads_go_on_and_a_delete_reopens(tmp_path):
    storage = await open_storage(tmp_path, BOUNDED)
    for i in range(100):  # in order, as a ledger's writer sends them: one dense run
        await storage.add(add_req(1, i))
    assert await storage.check_disk() is False
    # A writer that spreads its ids far apart costs an outlier per entry: 40 of them pass 8 KiB.
    await add_all(storage, [add_req(2, i * 100_000) for i in range(40)])
    assert storage.statistics()["index_bytes"] > 8192
    assert await storage.check_disk() is True
    with pytest.raises(BookieReadOnly, match="bookie_max_index_bytes"):
        await storage.add(add_req(1, 100))
    assert storage.read(1, 99) == packaged(1, 99) and storage.read(2, 3_900_000) == packaged(2, 3_900_000)
    await storage.fence(1, KEY)  # recovery can still fence an over-full bookie
    await storage.delete_ledgers([2])
    assert await storage.check_disk() is False
    await storage.add(add_req(3, 0))
    await storage.close()


@trio_test
async def test_a_bookie_reopened_over_the_bound_starts_read_only(tmp_path):
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(2, i * 100_000) for i in range(50)])  # 50 outliers: about 9 kB
    await storage.close()
    reopened = await open_storage(tmp_path, BOUNDED)
    assert reopened.read_only
    with pytest.raises(BookieReadOnly):
        await reopened.add(add_req(2, 1))
    await reopened.close()


def test_the_bound_is_validated():
    with pytest.raises(ValueError, match="max_index_bytes"):
        BookieStorageConfig(max_index_bytes=100)


def test_a_checkpoint_is_written_in_bounded_chunks_and_reads_back():
    """encode_checkpoint streams: no chunk holds more than CHUNK_SLOTS slots of one ledger, so
    writing the image of a large index costs a chunk of memory, not a second index."""
    index = Index()
    state = index.state_for_write(7)
    state.master_key = KEY
    for entry_id in range(300_000):
        state.entries.put_new(entry_id, pack_position(1, 100 + entry_id), 10)
    chunks = list(encode_checkpoint(Checkpoint(3, 2, {1: (4096, 2048)}, index)))
    assert max(len(c) for c in chunks) <= CHUNK_SLOTS * 8
    image = decode_checkpoint(b"".join(chunks)).index
    assert image.get(7, 299_999) == index.get(7, 299_999) and image.memory_bytes() == index.memory_bytes()
