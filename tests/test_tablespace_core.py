"""The table service's pure parts: change records, the tables and their checkpoints, and what a
leader decides (tablespace/change.py, state.py, leading.py), with the decoders fuzzed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablespace import change
from tablespace.change import Delete, Put
from tablespace.errors import BadRequest, CorruptChange, VersionMismatch
from tablespace.leading import ABSENT, Leader, Op
from tablespace.state import CheckpointDecoder, TableState

tables = st.sampled_from(["orders", "users", "é"])
keys = st.binary(max_size=12)
effects = st.lists(st.one_of(st.builds(Put, tables, keys, st.binary(max_size=40), st.integers(0, 2**63 - 1)),
                             st.builds(Delete, tables, keys)), max_size=8)


@given(effects)
def test_a_change_reads_back_as_written(es):
    assert change.decode(change.encode(es)) == es


@settings(max_examples=300)
@given(effects, st.data())
def test_a_damaged_change_is_refused_or_reads_as_a_change(es, data):
    raw = bytearray(change.encode(es))
    for _ in range(data.draw(st.integers(1, 3))):
        if raw and data.draw(st.booleans()):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
        else:
            raw = raw[:data.draw(st.integers(0, len(raw)))]
    try:
        back = change.decode(bytes(raw))
    except CorruptChange:
        return
    assert change.encode(back) == bytes(raw)  # accepted only if it is exactly some change


@given(st.binary(max_size=64))
def test_random_bytes_are_refused_or_read_as_a_change(raw):
    try:
        back = change.decode(raw)
    except CorruptChange:
        return
    assert change.encode(back) == raw


def state_of(history: list[list]) -> TableState:
    s = TableState()
    for es in history:
        s.apply(es)
    return s


@settings(max_examples=100)
@given(st.lists(effects, max_size=6), st.integers(1, 200))
def test_a_checkpoint_fed_in_any_pieces_is_the_same_state(history, piece):
    s = state_of(history)
    data = b"".join(s.encode_chunks(64))
    d = CheckpointDecoder()
    for at in range(0, len(data), piece):
        d.feed(data[at:at + piece])
    back = d.finish()
    assert back.tables == s.tables and back.keys == s.keys == sum(map(len, s.tables.values()))
    assert back.digest() == s.digest()


@settings(max_examples=200)
@given(st.lists(effects, min_size=1, max_size=4), st.data())
def test_a_damaged_checkpoint_is_refused_or_is_some_state(history, data):
    raw = bytearray(b"".join(state_of(history).encode_chunks()))
    at = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        raw[at] ^= data.draw(st.integers(1, 255))
    else:
        raw = raw[:at]
    d = CheckpointDecoder()
    try:
        d.feed(bytes(raw))
        back = d.finish()
    except CorruptChange:
        return
    assert b"".join(back.encode_chunks()) == bytes(raw)


def test_scan_is_in_key_order_within_bounds():
    s = state_of([[Put("t", k, b"v" + k, 0) for k in (b"b", b"a", b"d", b"c")], [Delete("t", b"c")]])
    assert [k for k, _, _ in s.scan("t")] == [b"a", b"b", b"d"]
    assert [k for k, _, _ in s.scan("t", b"b", b"d")] == [b"b"]
    assert [k for k, _, _ in s.scan("t", limit=1)] == [b"a"]
    assert list(s.scan("missing")) == []


def test_the_leader_checks_conditions_against_pending_changes_and_reads_only_acknowledged_ones():
    leader = Leader(TableState())
    first, results = leader.prepare([Op("put", "t", b"k", b"1", expect=ABSENT)])
    assert results == [0] and leader.state.get("t", b"k") is None and leader.current("t", b"k") == (b"1", 0)
    with pytest.raises(VersionMismatch):
        leader.prepare([Op("put", "t", b"k", b"x", expect=ABSENT)])  # pending already created it
    second, results = leader.prepare([Op("put", "t", b"k", b"2", expect=0)])
    assert results == [1]
    leader.acknowledged(first)
    assert leader.state.get("t", b"k") == (b"1", 0) and leader.current("t", b"k") == (b"2", 1)
    leader.acknowledged(second)
    assert leader.state.get("t", b"k") == (b"2", 1) and leader._pending == {}


def test_a_transaction_is_all_or_nothing_and_later_ops_see_earlier_ones():
    leader = Leader(TableState())
    es, results = leader.prepare([Op("put", "t", b"a", b"1"), Op("put", "t", b"a", b"2", expect=0),
                                  Op("check", "t", b"a", expect=1), Op("delete", "t", b"b")])
    assert results == [0, 1, 1, None] and es == [Put("t", b"a", b"1", 0), Put("t", b"a", b"2", 1)]
    leader.acknowledged(es)
    with pytest.raises(VersionMismatch):
        leader.prepare([Op("put", "t", b"c", b"x"), Op("check", "t", b"a", expect=0)])
    assert leader.current("t", b"c") is None and leader._pending == {}  # nothing registered
    es, results = leader.prepare([Op("delete", "t", b"a", expect=1), Op("put", "t", b"a", b"again")])
    assert results == [None, 0]  # as ZooKeeper: created again, it starts at version 0


@pytest.mark.parametrize("op", [Op("get", "t", b"k"), Op("put", "", b"k"), Op("put", "a/b", b"k"),
                                Op("put", "t", b"k" * 70_000), Op("check", "t", b"k"),
                                Op("put", "t", b"k", expect=-2), Op("put", "t", b"k", expect=1 << 63)])
def test_malformed_ops_are_refused(op):
    with pytest.raises(BadRequest):
        Leader(TableState()).prepare([op])


@given(st.lists(st.builds(Op, st.sampled_from(["put", "delete", "check"]), tables, keys, st.binary(max_size=30),
                          st.sampled_from([None, ABSENT, 0])), min_size=1, max_size=6))
def test_the_size_bound_known_before_deciding_is_at_least_the_changes_size(ops):
    try:
        effects, _ = Leader(TableState()).prepare(ops)
    except (VersionMismatch, BadRequest):
        return
    assert len(change.encode(effects)) <= change.size_bound(ops)
