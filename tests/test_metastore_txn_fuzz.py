"""The transaction and snapshot decoders under fuzzing.

Round trips: every record type encodes and decodes back to itself. Hostile input:
random bytes, every prefix of a valid encoding, mutations of valid encodings and
lying length or count fields give only DecodeError, never another exception, a
hang or a big allocation. Whatever the transaction decoder accepts is canonical:
it re-encodes to exactly the input bytes.
"""

from __future__ import annotations

import struct
import tracemalloc

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from metastore.core.acl import ACL, Id
from metastore.errors import DecodeError
from metastore.wire.snapshot_codec import decode_snapshot, encode_tree
from metastore.core.ephemeral_owner import CONTAINER_OWNER, ttl_owner
from metastore.core.tree import DataTree
from metastore.core.txn import (Check, CloseSession, Create, CreateSession, Delete, Error, Multi, SetACL, SetData,
                           Transaction)
from metastore.wire.txn_codec import decode_txn, encode_txn

FUZZ = settings(max_examples=200, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
ALLOCATION_LIMIT_BYTES = 1 << 20

i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
session_ids = st.integers(min_value=1, max_value=0xFEFF_FFFF_FFFF_FFFF).filter(lambda s: s != CONTAINER_OWNER)
segment = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Co", "Cc")), min_size=1, max_size=5) \
    .filter(lambda s: s not in (".", "..") and "/" not in s and not any(ord(c) > 0xFFEF for c in s))
znode_paths = st.lists(segment, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
blobs = st.binary(max_size=16)
ids = st.builds(Id, st.sampled_from(("world", "digest", "ip", "x")), st.text(max_size=8).filter(
    lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
acls = st.lists(st.builds(ACL, i32, ids), max_size=3).map(tuple)
owners = st.sampled_from((0, CONTAINER_OWNER, ttl_owner(1), ttl_owner(2**40 - 1))) | session_ids

datas = st.none() | blobs  # znode data: None is null data, kept apart from b""
creates = st.builds(Create, znode_paths, datas, acls, owners, i32)
ops = st.one_of(creates, st.builds(Delete, znode_paths), st.builds(SetData, znode_paths, datas, i32),
                st.builds(Check, znode_paths, i32))
errors = st.builds(Error, i32)
multis = st.builds(Multi, st.lists(ops, max_size=4).map(tuple) | st.lists(errors, max_size=4).map(tuple))
bodies = st.one_of(
    creates, st.builds(Delete, znode_paths), st.builds(SetData, znode_paths, datas, i32),
    st.builds(SetACL, znode_paths, acls, i32), st.builds(CreateSession, session_ids, st.integers(1, 2**31 - 1)),
    st.builds(CloseSession, session_ids, st.lists(znode_paths, max_size=3, unique=True).map(
        lambda ps: tuple(sorted(ps)))),
    st.builds(Error, i32.filter(bool)), multis,
)
txns = st.builds(Transaction, i64, bodies)


def clean(fn, data):
    """Only a result or DecodeError may come out."""
    try:
        return fn(data)
    except DecodeError as e:
        return e


@FUZZ
@given(txns)
def test_every_transaction_round_trips(txn):
    assert decode_txn(encode_txn(txn)) == txn


@FUZZ
@given(st.binary(max_size=200))
@example(b"\x01" + bytes(8) + b"\x0e" + b"\xff\xff\xff\xff")      # a multi claiming 4 billion ops
@example(b"\x01" + bytes(8) + b"\x01" + b"\x7f\xff\xff\xff")      # a path claiming 2 GiB
def test_random_bytes_are_refused_or_canonical(data):
    result = clean(decode_txn, data)
    if not isinstance(result, DecodeError):
        assert encode_txn(result) == data


@FUZZ
@given(txns)
def test_every_prefix_is_refused(txn):
    raw = encode_txn(txn)
    for end in range(len(raw)):
        assert isinstance(clean(decode_txn, raw[:end]), DecodeError)


@FUZZ
@given(txns, st.data())
def test_mutations_are_refused_or_canonical(txn, data):
    raw = bytearray(encode_txn(txn))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    result = clean(decode_txn, bytes(raw))
    if not isinstance(result, DecodeError):
        assert encode_txn(result) == bytes(raw)


@FUZZ
@given(txns, st.data())
def test_lying_lengths_allocate_nothing_big(txn, data):
    raw = bytearray(encode_txn(txn))
    at = data.draw(st.integers(0, max(0, len(raw) - 4)))
    raw[at:at + 4] = struct.pack(">I", data.draw(st.sampled_from((2**31, 2**32 - 1, 2**24))))
    tracemalloc.start()
    try:
        clean(decode_txn, bytes(raw))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT_BYTES


def _sample_snapshot() -> bytes:
    from metastore.core.txn import apply
    tree = DataTree()
    bodies = [CreateSession(0x0100_0000_0000_0001, 5000),
              Create("/a", b"data", (ACL(31, Id("world", "anyone")),), 0, 1),
              Create("/a/e", b"", (ACL(1, Id("ip", "10.0.0.0/8")),), 0x0100_0000_0000_0001, 1),
              Create("/c", b"", (ACL(31, Id("world", "anyone")),), CONTAINER_OWNER, 2),
              Create("/n", None, (ACL(31, Id("world", "anyone")),), 0, 3)]  # null data
    for zxid, body in enumerate(bodies, 1):
        apply(tree, zxid, Transaction(zxid, body))
    return encode_tree(tree)


SNAPSHOT = _sample_snapshot()


def test_every_snapshot_prefix_is_refused():
    for end in range(len(SNAPSHOT)):
        assert isinstance(clean(decode_snapshot, SNAPSHOT[:end]), DecodeError)


@FUZZ
@given(st.data())
def test_snapshot_mutations_are_refused_or_consistent(data):
    raw = bytearray(SNAPSHOT)
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    result = clean(decode_snapshot, bytes(raw))
    if not isinstance(result, DecodeError):  # e.g. last_zxid changed: not covered by the digest
        assert result.digest() == result.recompute_digest()
        assert encode_tree(result) == bytes(raw)


@FUZZ
@given(st.sampled_from([1, 2, 3, 4]), st.binary(max_size=120))
def test_random_snapshot_bytes_are_refused(version, data):
    assert isinstance(clean(decode_snapshot, b"QZNT" + bytes([version]) + data), DecodeError)
