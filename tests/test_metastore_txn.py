"""Metastore transactions: the byte layout, what apply returns for each record, and
the shapes the decoder refuses (docs/metastore_tree.md)."""

from __future__ import annotations

import struct

import pytest

from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, Id, Perm
from metastore.errors import DecodeError, TxnConflict
from metastore.wire.snapshot_codec import encode_tree
from metastore.core.ephemeral_owner import CONTAINER_OWNER
from metastore.core.tree import DataTree
from metastore.core.txn import (AlreadyApplied, Check, CheckResult, CloseSession, Create, CreateResult, CreateSession,
                           Delete, DeleteResult, Error, ErrorResult, Multi, MultiResult, SessionCreated, SetACL,
                           SetData, SetDataResult, Transaction, apply)
from metastore.wire.txn_codec import decode_txn, encode_txn

SESSION = 0x0100_0000_0000_0001
ZXID = 0x2_0000_0001


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def test_the_create_layout_is_pinned():
    txn = Transaction(1_700_000_000_123, Create("/a", b"hi", OPEN_ACL_UNSAFE, SESSION, 1))
    expected = (b"\x01" + struct.pack(">q", 1_700_000_000_123)            # format version, time_ms
                + b"\x01" + u32(2) + b"/a" + u32(2) + b"hi"                  # OpCode.create, path, data
                + u32(1) + struct.pack(">i", 31) + u32(5) + b"world" + u32(6) + b"anyone"   # ACL list
                + struct.pack(">Q", SESSION) + struct.pack(">i", 1))         # ephemeral owner, parent cversion
    assert encode_txn(txn) == expected
    assert decode_txn(expected) == txn


def test_the_other_layouts_are_pinned():
    head = b"\x01" + struct.pack(">q", 5)
    cases = {
        Delete("/a"): b"\x02" + u32(2) + b"/a",
        SetData("/a", b"x", 3): b"\x05" + u32(2) + b"/a" + u32(1) + b"x" + struct.pack(">i", 3),
        SetACL("/a", (), 2): b"\x07" + u32(2) + b"/a" + u32(0) + struct.pack(">i", 2),
        CreateSession(SESSION, 30_000): b"\xf6" + struct.pack(">Qi", SESSION, 30_000),
        CloseSession(SESSION, ("/e",)): b"\xf5" + struct.pack(">Q", SESSION) + u32(1) + u32(2) + b"/e",
        Error(-101): b"\xff" + struct.pack(">i", -101),
        Multi((Check("/a", 0), Error(0))): None,  # mixed: refused, see below
        Multi((Check("/a", 4),)): b"\x0e" + u32(1) + b"\x0d" + u32(2) + b"/a" + struct.pack(">i", 4),
    }
    for body, tail in cases.items():
        if tail is None:
            continue
        assert encode_txn(Transaction(5, body)) == head + tail, body
        assert decode_txn(head + tail) == Transaction(5, body)


@pytest.mark.parametrize("body, why", [
    (Check("/a", 0), "a check outside a multi"),
    (Error(0), "an Error transaction with code 0"),
    (Multi((Delete("/a"), Error(-101))), "a multi mixing ops and errors"),
    (Multi((Multi(()),)), "a nested multi"),
    (Multi((CreateSession(SESSION, 1),)), "a session inside a multi"),
    (Multi((SetACL("/a", (), 1),)), "setACL inside a multi (ZooKeeper's multi has none)"),
    (CloseSession(SESSION, ("/b", "/a")), "unsorted ephemerals"),
    (CloseSession(SESSION, ("/a", "/a")), "repeated ephemerals"),
    (CloseSession(0, ()), "session id 0"),
    (CreateSession(CONTAINER_OWNER, 1), "a session id that reads as a container"),
    (CreateSession(SESSION, 0), "a zero timeout"),
    (Create("/", b"", (), 0, 1), "creating the root"),
    (Create("/a/", b"", (), 0, 1), "an invalid path"),
    (Create("/a", b"", (), 0xFF01_0000_0000_0001, 1), "a reserved owner encoding"),
    (Delete("/"), "deleting the root"),
])
def test_the_decoder_refuses(body, why):
    with pytest.raises(DecodeError):
        decode_txn(encode_txn(Transaction(0, body)))


def test_unknown_format_version_and_trailing_bytes_are_refused():
    good = encode_txn(Transaction(0, Delete("/a")))
    with pytest.raises(DecodeError, match="version"):
        decode_txn(b"\x02" + good[1:])
    with pytest.raises(DecodeError, match="trailing"):
        decode_txn(good + b"\0")


def commit(tree: DataTree, body, zxid: int = ZXID):
    return apply(tree, zxid, decode_txn(encode_txn(Transaction(1000, body))))


def test_apply_returns_what_the_client_is_told():
    tree = DataTree()
    assert commit(tree, CreateSession(SESSION, 4000)) == SessionCreated(SESSION, 4000)
    created = commit(tree, Create("/a", b"", OPEN_ACL_UNSAFE, 0, 1), ZXID + 1)
    assert isinstance(created, CreateResult) and created.stat.czxid == ZXID + 1
    assert commit(tree, Error(-110), ZXID + 2) == ErrorResult(-110)
    assert tree.last_zxid == ZXID + 2
    assert commit(tree, Delete("/a"), ZXID + 1) == AlreadyApplied(ZXID + 1)


def test_a_multi_applies_every_op_under_one_zxid():
    tree = DataTree()
    ops = (Create("/m", b"", OPEN_ACL_UNSAFE, 0, 1), SetData("/m", b"v", 1), Check("/m", 1),
           Create("/m/c", b"", (ACL(Perm.READ, Id("ip", "1.2.3.4")),), 0, 1), Delete("/m/c"))
    result = commit(tree, Multi(ops))
    assert [type(r) for r in result.results] == [CreateResult, SetDataResult, CheckResult, CreateResult,
                                                 DeleteResult]
    assert result.code == 0
    stat = tree.get("/m")[1]
    assert (stat.czxid, stat.mzxid, stat.pzxid, stat.version, stat.cversion) == (ZXID,) * 3 + (1, 2)


def test_a_failed_multi_changes_nothing_and_reports_each_op():
    tree = DataTree()
    before, digest = encode_tree(tree), tree.digest()
    failed = Multi((Error(0), Error(-101), Error(-2)))
    result = commit(tree, failed)
    assert result == MultiResult((ErrorResult(0), ErrorResult(-101), ErrorResult(-2)))
    assert result.code == -101
    assert tree.digest() == digest
    assert encode_tree(tree)[13:] == before[13:]  # only last_zxid (bytes 5..12) moved


def test_a_multi_that_does_not_fit_is_a_conflict_and_is_undone_first():
    tree = DataTree()
    commit(tree, Create("/keep", b"v", OPEN_ACL_UNSAFE, 0, 1))
    before, digest = encode_tree(tree), tree.digest()
    bad = Multi((Create("/x", b"", OPEN_ACL_UNSAFE, 0, 2), SetData("/keep", b"w", 1), Delete("/keep"),
                 Check("/x", 3)))
    with pytest.raises(TxnConflict):
        commit(tree, bad, ZXID + 1)
    assert encode_tree(tree) == before and tree.digest() == digest == tree.recompute_digest()


def test_equal_acl_bytes_decode_to_one_shared_tuple():
    a = decode_txn(encode_txn(Transaction(0, Create("/a", b"", OPEN_ACL_UNSAFE, 0, 1))))
    b = decode_txn(encode_txn(Transaction(0, SetACL("/b", OPEN_ACL_UNSAFE, 1))))
    assert a.body.acl is b.body.acl and a.body.acl == OPEN_ACL_UNSAFE
