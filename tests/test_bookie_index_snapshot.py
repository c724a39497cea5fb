"""A checkpoint encodes Index.snapshot() in a worker thread while the storage goes on changing the index:
the snapshot shares the ledgers' states and the index copies a state before its first change after it
(copy-on-write). Whatever happens after a snapshot, it must encode exactly as a deep copy taken at the
same moment would have (the reference model here); and the index must go on as if no snapshot existed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from bookie.index import Index, Location, pack_position
from bookie.storage_recovery import CHECKPOINT
from bookie_fixtures import checkpoint_held_after_its_cut
from bookie_fixtures import KEY, add_all, add_req, trio_test
from bookie_fixtures import open_small_storage as open_storage

ledgers = st.integers(0, 4)
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), ledgers, st.integers(0, 40), st.integers(1, 3), st.integers(1, 500)),
    st.tuples(st.just("put_many"), ledgers, st.integers(0, 40), st.integers(1, 3), st.integers(1, 500)),
    st.tuples(st.just("fence"), ledgers, st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("lac"), ledgers, st.integers(-1, 60), st.just(0), st.just(0)),
    st.tuples(st.just("move"), ledgers, st.integers(0, 40), st.integers(4, 6), st.integers(1, 500)),
    st.tuples(st.just("delete"), ledgers, st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("snapshot"), st.just(0), st.just(0), st.just(0), st.just(0)),
), max_size=60)


def deep_copy(index: Index) -> Index:
    """What the checkpoint used to take at its cut: every ledger's state copied."""
    other = Index()
    other.ledgers = {ledger_id: state.copy() for ledger_id, state in index.ledgers.items()}
    other.deleted = set(index.deleted)
    other.live_bytes = dict(index.live_bytes)
    return other


def encoded(index: Index) -> bytes:
    return b"".join(encode_checkpoint(Checkpoint(1, 9, {}, index)))


def apply(index: Index, op: tuple) -> None:
    kind, ledger_id, value, log_id, offset = op
    if kind != "delete" and ledger_id in index.deleted:
        return
    if kind == "put":
        index.put(ledger_id, value, value - 1, Location(log_id, offset, 10), 34)
        index.state_for_write(ledger_id).master_key = KEY
    elif kind == "put_many":
        index.put_many([(ledger_id, value, b"x" * 10, value - 1)], [pack_position(log_id, offset)])
    elif kind == "fence":
        index.state_for_write(ledger_id).fenced = True
    elif kind == "lac":
        state = index.writable_state(ledger_id)
        if state is not None:
            state.explicit_lac = max(state.explicit_lac, value)
    elif kind == "move":
        where = index.get(ledger_id, value)
        if where is not None:
            index.move(ledger_id, value, where, Location(log_id, offset, where.length), 34)
    elif kind == "delete":
        index.delete(ledger_id)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ops)
def test_a_snapshot_stays_what_the_index_was_when_it_was_taken(ops):
    index, model = Index(), Index()  # the same operations, with and without snapshots
    taken: list[tuple[Index, bytes]] = []
    for op in ops:
        if op[0] == "snapshot":
            taken.append((index.snapshot(), encoded(deep_copy(index))))
            continue
        apply(index, op)
        apply(model, op)
    for snapshot, expected in taken:
        assert encoded(snapshot) == expected, "a change after the snapshot reached it"
    assert encoded(index) == encoded(model), "snapshots changed what the index holds"


def test_a_snapshot_shares_the_states_until_they_change():
    index = Index()
    for ledger_id in range(1000):
        index.put(ledger_id, 0, -1, Location(1, 100, 10), 34)
    snapshot = index.snapshot()
    assert all(snapshot.ledgers[i] is index.ledgers[i] for i in range(1000)), "the cut copied states"
    index.put_many([(7, 1, b"x" * 10, 0)], [pack_position(1, 200)])
    assert snapshot.ledgers[7] is not index.ledgers[7] and snapshot.ledgers[7].last_entry == 0
    assert index.ledgers[7].last_entry == 1
    assert sum(snapshot.ledgers[i] is not index.ledgers[i] for i in range(1000)) == 1


@trio_test
async def test_the_checkpoint_image_is_the_index_at_its_cut_while_adds_fences_and_lacs_go_on(tmp_path, monkeypatch):
    """Changes made while a checkpoint writes its image (its entry log fsync is held here) are not in
    the image; the journal replays them on reopen, and nothing is lost."""
    storage = await open_storage(tmp_path)
    await add_all(storage, [add_req(ledger_id, i) for ledger_id in (1, 2, 3) for i in range(20)])
    async with checkpoint_held_after_its_cut(storage, monkeypatch):
        await add_all(storage, [add_req(1, i) for i in range(20, 40)])
        await storage.fence(2, KEY)
        await storage.write_lac(3, 19, KEY)
        await add_all(storage, [add_req(4, 0)])
    image = decode_checkpoint((tmp_path / CHECKPOINT).read_bytes()).index
    assert image.ledgers[1].last_entry == 19 and image.ledgers[1].entries.count() == 20
    assert not image.ledgers[2].fenced
    assert image.ledgers[3].explicit_lac < 19
    assert 4 not in image.ledgers
    assert storage.lac(1) == 38 and storage.is_fenced(2) and storage.lac(3) == 19
    await storage.close(checkpoint=False)
    storage = await open_storage(tmp_path)
    assert all(storage.read(1, i) is not None for i in range(40)) and storage.read(4, 0) is not None
    assert storage.is_fenced(2) and storage.lac(3) == 19
    await storage.close()
