"""Ledger metadata in a real metastore: ids, the hierarchical layout, CAS, listing,
deletion; and the pure rules of the metadata record and of placement."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bookie.entry import DigestType
from ledger.errors import MetadataConflict, NoSuchLedger, NotEnoughBookies
from ledger.manager import LedgerManager
from ledger.metadata import (Fragment, LedgerMetadata, LedgerMetadataError, LedgerState, decode, encode,
                             ledger_id_from_path, ledger_path)
from ledger.placement import choose_ensemble, choose_outside, choose_replacement
from metastore.client import MetaClient
from cluster_fixtures import Cluster, copy_config


def metadata(**overrides) -> LedgerMetadata:
    fields = dict(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2,
                  fragments=(Fragment(0, (1, 2, 3)),), digest_type=DigestType.CRC32C,
                  password_digest=b"\x01" * 32, ctime_ms=1_700_000_000_000, custom={"app": b"\x00\xff"})
    fields.update(overrides)
    return LedgerMetadata(**fields)


# -- pure rules ---------------------------------------------------------------------------

def test_the_hierarchical_path_of_seed_000():
    assert ledger_path("/ledgers", 1) == "/ledgers/00/0000/L0001"
    assert ledger_path("/ledgers", 1234567890) == "/ledgers/12/3456/L7890"
    assert ledger_id_from_path("/ledgers", "/ledgers/12/3456/L7890") == 1234567890
    for bad in ("/ledgers/12/3456/7890", "/ledgers/1/3456/L7890", "/other/12/3456/L7890", "/ledgers/idgen"):
        with pytest.raises(LedgerMetadataError):
            ledger_id_from_path("/ledgers", bad)


@pytest.mark.parametrize("overrides, problem", [
    (dict(ensemble_size=2, write_quorum=3), "E >= Qw >= Qa"),
    (dict(write_quorum=2, ack_quorum=3), "E >= Qw >= Qa"),
    (dict(fragments=(Fragment(1, (1, 2, 3)),)), "start at entry 0"),
    (dict(fragments=(Fragment(0, (1, 2, 2)),)), "distinct bookies"),
    (dict(fragments=(Fragment(0, (1, 2, 3)), Fragment(0, (1, 2, 4)))), "increasing"),
    (dict(state=LedgerState.CLOSED), "exactly when the ledger is CLOSED"),
    (dict(last_entry=5), "exactly when the ledger is CLOSED"),
])
def test_metadata_that_breaks_the_rules_is_refused(overrides, problem):
    with pytest.raises(LedgerMetadataError, match=problem):
        metadata(**overrides)


def test_fragments_and_closing():
    m = metadata().with_fragment(12, (4, 2, 3))
    assert m.ensemble_for(11) == (1, 2, 3) and m.ensemble_for(12) == (4, 2, 3)
    assert m.fragment_end(0) == 11 and m.fragment_end(1) is None
    closed = m.closed(11, 500)
    assert closed.state is LedgerState.CLOSED and closed.last_entry == 11
    assert closed.fragments == (Fragment(0, (1, 2, 3)),)  # the unused fragment is dropped
    assert metadata().closed(-1, 0).last_entry == -1  # an empty ledger


@given(st.binary(max_size=300))
def test_decoding_random_bytes_is_a_typed_error(data):
    try:
        decode(data)
    except LedgerMetadataError:
        pass


@given(st.integers(min_value=0, max_value=400))
def test_decoding_truncated_metadata_is_a_typed_error(cut):
    data = encode(metadata())
    if cut >= len(data):
        assert decode(data[:cut]) == metadata()
        return
    with pytest.raises(LedgerMetadataError):
        decode(data[:cut])


def test_placement_spreads_and_never_repeats_a_bookie():
    rng = random.Random(7)
    chosen = [choose_ensemble([1, 2, 3, 4, 5], 3, rng) for _ in range(50)]
    assert all(len(set(e)) == 3 for e in chosen)
    assert len({e[0] for e in chosen}) == 5  # every bookie leads some ensemble
    with pytest.raises(NotEnoughBookies):
        choose_ensemble([1, 2], 3, rng)
    replacement = choose_replacement([1, 2, 3, 4, 5], (1, 2, 3), [2], rng)
    assert set(replacement) == {2} and replacement[2] in {4, 5}
    with pytest.raises(NotEnoughBookies):
        choose_replacement([1, 2, 3], (1, 2, 3), [2], rng)
    # What the ledger driver asks for a writer's ensemble change: fewer when there are not enough.
    outside = [choose_outside([5, 1, 4, 2, 3, 4], (1, 3), 2, rng) for _ in range(30)]
    assert all(len(set(c)) == 2 and set(c) <= {2, 4, 5} for c in outside)
    assert {b for c in outside for b in c} == {2, 4, 5}
    assert choose_outside([1, 2, 3], (1, 3), 2, rng) == (2,)
    assert choose_outside([1, 2], (1, 2), 3, rng) == ()


# -- against a real metastore ---------------------------------------------------------------

@pytest.fixture(scope="module")
def metastore(tmp_path_factory) -> Iterator[Cluster]:
    cluster = Cluster(copy_config(Path(tmp_path_factory.mktemp("ledgermanager"))))
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


@pytest.mark.multiprocess
def test_manager_create_read_cas_list_delete(metastore: Cluster):
    async def scenario():
        async with MetaClient(metastore.config.client_addresses()) as meta:
            manager = LedgerManager(meta, root="/test/ledgers", idgen_path="/test/idgen")
            first, version = await manager.create(metadata())
            second, _ = await manager.create(metadata())
            assert version == 0 and second.ledger_id > first.ledger_id >= 1
            assert (await meta.get(ledger_path("/test/ledgers", first.ledger_id)))[0] == encode(first)
            assert await manager.read(first.ledger_id) == (first, 0)

            recovering = first.with_state(LedgerState.IN_RECOVERY)
            assert await manager.write(recovering, 0) == 1
            with pytest.raises(MetadataConflict):
                await manager.write(first.closed(3, 10), 0)  # a writer holding the old version loses
            assert await manager.read(first.ledger_id) == (recovering, 1)

            assert await manager.list_ledgers() == [first.ledger_id, second.ledger_id]
            await manager.delete(first.ledger_id)
            assert await manager.list_ledgers() == [second.ledger_id]
            assert not await manager.exists(first.ledger_id)
            assert not await manager.exists(10**12)  # outside the layout: no metadata can exist
            with pytest.raises(NoSuchLedger):
                await manager.read(first.ledger_id)
            with pytest.raises(NoSuchLedger):
                await manager.write(recovering, 1)

    trio.run(scenario)
