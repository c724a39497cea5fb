"""The tree snapshot's format versions (metastore/wire/snapshot_stream.py): the encoder writes
version 4, the decoder also reads versions 1 to 3 (a node's old snapshot files, a SNAP from a
leader that still writes them); the ACL table of versions 2 to 4 is one per tree: sorted by
encoding, every entry used; versions 1 and 2 list znodes sorted by path, versions 3 and 4 in the
tree's own order, which must put every parent before its children; version 4 alone holds null
data (data length 0xFFFFFFFF), apart from empty data."""

from __future__ import annotations

import struct

import pytest

from metastore.core import paths
from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Id, Perm, encode_acl
from metastore.core.ephemeral_owner import CONTAINER_OWNER, ttl_owner
from metastore.core.tree import DataTree
from metastore.core.txn import Create, CreateSession, Transaction, apply
from metastore.errors import DecodeError
from metastore.wire.snapshot_codec import decode_snapshot, encode_tree
from metastore.wire.snapshot_stream import _RECORD, NULL_DATA_LENGTH, SNAPSHOT_VERSION, SnapshotDecoder, _acl_end

SESSION = 0x0100_0000_0000_0001
IP_ACL = (ACL(Perm.ALL, Id("ip", "10.0.0.0/8")),)
DIGEST_ACL = (ACL(Perm.READ, Id("digest", "u:x")),)


def sample(order=1) -> DataTree:
    creates = [("/a", b"data", OPEN_ACL_UNSAFE, 0), ("/b", b"", IP_ACL, CONTAINER_OWNER),
               ("/c", b"x" * 300, DIGEST_ACL, 0), ("/b/e", b"", IP_ACL, SESSION), ("/t", b"", READ_ACL_UNSAFE, ttl_owner(9))]
    tree = DataTree()
    apply(tree, 0x1_0000_0001, Transaction(1, CreateSession(SESSION, 5000)))
    for zxid, (path, data, acl, owner) in enumerate(creates[::order], 0x1_0000_0002):
        if order == -1 and path == "/b/e":
            continue  # its parent comes later in this order
        apply(tree, zxid, Transaction(zxid, Create(path, data, acl, owner, tree.parent_cversion(paths.parent_of(path)) + 1)))
    return tree


def version_1(tree: DataTree) -> bytes:
    """Version 1's layout, as the encoder wrote it before version 2 (docs/metastore_tree.md): ACL
    table in order of first use; each znode: path, data, then the fixed fields."""
    last_zxid, nodes, sessions, digest, _ = tree.contents()
    ordered = sorted(p for p in nodes if p != paths.CONFIG)
    table: list[tuple] = []
    records = []
    for path in ordered:
        node = nodes[path]
        if node.acl not in table:
            table.append(node.acl)
        name = path.encode()
        records.append(struct.pack(">I", len(name)) + name + struct.pack(">I", len(node.data)) + node.data
                       + struct.pack(">IQQQqqiiiQ", table.index(node.acl), node.czxid, node.mzxid, node.pzxid,
                                     node.ctime, node.mtime, node.version, node.cversion, node.aversion, node.owner))
    out = struct.pack(">4sBQQ", b"QZNT", 1, last_zxid, digest) + struct.pack(">I", len(table))
    out += b"".join(encode_acl(acl) for acl in table) + struct.pack(">I", len(sessions))
    out += b"".join(struct.pack(">Qi", s, sessions[s]) for s in sorted(sessions))
    return out + struct.pack(">I", len(records)) + b"".join(records)


def fed(data: bytes, piece: int) -> DataTree:
    decoder = SnapshotDecoder()
    for at in range(0, len(data), piece):
        decoder.feed(data[at:at + piece])
    return decoder.finish()


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 20])
def test_a_version_1_snapshot_loads_as_the_same_tree(piece):
    tree = sample()
    old = version_1(tree)
    assert old[4] == 1 and old != encode_tree(tree)
    restored = fed(old, piece)
    assert same_tree(restored, tree) and encode_tree(restored)[4] == SNAPSHOT_VERSION == 4
    assert restored.digest() == tree.digest() == restored.recompute_digest()
    assert restored.ephemerals(SESSION) == ["/b/e"] and restored.containers() == ["/b"] and restored.ttl_nodes() == ["/t"]
    for path in ("/a", "/b/e", "/c", "/t", paths.CONFIG):
        assert restored.get(path) == tree.get(path) and restored.acl(path) == tree.acl(path)


def version_2(tree: DataTree) -> bytes:
    """Version 2: version 3's layout with the znodes sorted by path (a tree restored from version 1
    holds them so)."""
    in_path_order = decode_snapshot(version_1(tree))
    assert list(in_path_order._nodes)[:-1] == sorted(p for p in in_path_order._nodes if p != paths.CONFIG)
    new = encode_tree(in_path_order)
    return new[:4] + b"\x02" + new[5:]


def version_3(tree: DataTree) -> bytes:
    """Version 3: version 4 for a tree without null data."""
    assert all(node.data is not None for node in tree._nodes.values())
    new = encode_tree(tree)
    return new[:4] + b"\x03" + new[5:]


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_a_version_3_snapshot_loads_as_the_same_tree(piece):
    tree = sample()
    restored = fed(version_3(tree), piece)
    assert same_tree(restored, tree) and encode_tree(restored) == encode_tree(tree)


def null_and_empty() -> DataTree:
    """/n holds null data (a client's create(path, None)), /e empty data."""
    tree = DataTree()
    apply(tree, 0x1_0000_0001, Transaction(7, Create("/n", None, OPEN_ACL_UNSAFE, 0, 1)))
    apply(tree, 0x1_0000_0002, Transaction(8, Create("/e", b"", OPEN_ACL_UNSAFE, 0, 2)))
    return tree


def test_a_version_4_snapshot_as_docs_metastore_tree_md_lays_it_out():
    """The bytes, field by field, of the znodes a client made with create("/n", None) and
    create("/e", b""): /n's data length is 0xFFFFFFFF and no data follows; /e's is 0."""
    tree = null_and_empty()
    acl = encode_acl(OPEN_ACL_UNSAFE)
    expected = b"QZNT" + bytes([4]) + struct.pack(">QQ", 0x1_0000_0002, tree.digest())
    expected += struct.pack(">I", 1) + acl + struct.pack(">I", 0) + struct.pack(">I", 5)
    # The system znodes, all-zero but for the root: pzxid of its last child's create, stored cversion 2.
    for name, pzxid, cversion in [(b"/", 0x1_0000_0002, 2), (b"/zookeeper", 0, 0), (b"/zookeeper/quota", 0, 0)]:
        expected += struct.pack(">IIIQQQqqiiiQ", len(name), 0, 0, 0, 0, pzxid, 0, 0, 0, cversion, 0, 0) + name
    expected += struct.pack(">IIIQQQqqiiiQ", 2, 0xFFFF_FFFF, 0, 0x1_0000_0001, 0x1_0000_0001, 0x1_0000_0001,
                            7, 7, 0, 0, 0, 0) + b"/n"  # null data: the marker, no bytes
    expected += struct.pack(">IIIQQQqqiiiQ", 2, 0, 0, 0x1_0000_0002, 0x1_0000_0002, 0x1_0000_0002,
                            8, 8, 0, 0, 0, 0) + b"/e"  # empty data: length 0
    assert encode_tree(tree) == expected
    restored = fed(expected, 5)
    assert restored.get("/n")[0] is None and restored.get("/e")[0] == b""
    assert restored.get("/n")[1].data_length == restored.get("/e")[1].data_length == 0  # as ZooKeeper's Stat
    assert restored.digest() == tree.digest() == restored.recompute_digest()


def test_null_data_and_empty_data_have_different_digests():
    """ZooKeeper's digest skips null data; ours tells it from empty, so that a replica that
    turned one into the other shows a different digest (docs/metastore_tree.md, "Digest")."""
    tree, other = null_and_empty(), DataTree()
    apply(other, 0x1_0000_0001, Transaction(7, Create("/n", b"", OPEN_ACL_UNSAFE, 0, 1)))
    apply(other, 0x1_0000_0002, Transaction(8, Create("/e", b"", OPEN_ACL_UNSAFE, 0, 2)))
    assert tree.digest() != other.digest()
    assert {p: n.data for p, n in tree._nodes.items() if p in ("/n", "/e")} == {"/n": None, "/e": b""}


def test_the_null_marker_is_a_length_before_version_4():
    """In a version 3 snapshot the marker is a data length of 4 GiB: the snapshot is truncated."""
    new = encode_tree(null_and_empty())
    assert NULL_DATA_LENGTH.to_bytes(4, "big") in new
    with pytest.raises(DecodeError, match="truncated"):
        decode_snapshot(new[:4] + b"\x03" + new[5:])


def same_tree(a: DataTree, b: DataTree) -> bool:
    """The same znodes, whatever order each tree holds them in (what the digest covers, and the ACLs)."""
    return (a.digest() == b.digest() and set(a._nodes) == set(b._nodes)
            and all(a.get(p) == b.get(p) and a.acl(p) == b.acl(p) for p in a._nodes))


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 20])
def test_a_version_2_snapshot_loads_as_the_same_tree(piece):
    tree = sample()
    old = version_2(tree)
    restored = fed(old, piece)
    assert same_tree(restored, tree) and encode_tree(restored)[4] == SNAPSHOT_VERSION


@pytest.mark.parametrize("old", [version_1, version_2])
def test_every_prefix_of_an_old_snapshot_is_refused(old):
    data = old(sample())
    for end in range(len(data)):
        with pytest.raises(DecodeError):
            decode_snapshot(data[:end])


def _records(data: bytes) -> tuple[bytes, list[bytes]]:
    """A version 2 or 3 snapshot cut into what comes before its znodes and their records."""
    (acls,) = struct.unpack_from(">I", data, 21)
    at = 25
    for _ in range(acls):
        at = _acl_end(data, at)
    (sessions,) = struct.unpack_from(">I", data, at)
    at += 4 + 12 * sessions + 4
    head, records = data[:at], []
    while at < len(data):
        path_len, data_len = struct.unpack_from(">II", data, at)
        records.append(data[at:at + _RECORD.size + path_len + data_len])
        at += _RECORD.size + path_len + data_len
    return head, records


def test_a_version_3_snapshot_keeps_the_trees_order_and_refuses_a_child_before_its_parent_or_a_repeat():
    """Version 4 keeps version 3's order (it only adds null data), so the encoder's bytes serve."""
    tree = sample()
    new = encode_tree(tree)
    assert new[4] == 4 and fed(version_3(tree), 7).get("/c") == tree.get("/c")
    count = len(tree._nodes) - 1
    head, records = _records(new)
    names = [r[_RECORD.size:_RECORD.size + struct.unpack_from(">I", r)[0]].decode() for r in records]
    assert names == [p for p in tree._nodes if p != paths.CONFIG] != sorted(names)  # creation order, not sorted
    assert encode_tree(decode_snapshot(new)) == new
    child = names.index("/b/e")
    swapped = records[:]
    swapped[child - 1], swapped[child] = swapped[child], swapped[child - 1]  # "/c" then "/b/e": fine
    assert decode_snapshot(head + b"".join(swapped)).get("/b/e") == tree.get("/b/e")
    parent = names.index("/b")
    early = records[:parent] + [records[child]] + [r for i, r in enumerate(records) if i >= parent and i != child]
    with pytest.raises(DecodeError, match="no parent"):
        decode_snapshot(head + b"".join(early))
    twice = head[:-4] + struct.pack(">I", count + 1) + b"".join(records) + records[names.index("/a")]
    with pytest.raises(DecodeError, match="twice"):
        decode_snapshot(twice)


def test_a_version_2_snapshot_out_of_path_order_is_refused():
    old = version_2(sample())
    head, records = _records(old)
    records[1], records[2] = records[2], records[1]  # "/a" and "/b": siblings, parents fine, order not
    with pytest.raises(DecodeError, match="out of order"):
        decode_snapshot(head + b"".join(records))


def test_the_acl_table_is_sorted_by_encoding_whatever_order_acls_came_in():
    forward, backward = sample(1), sample(-1)
    forward_acls = [acl for _, acl in forward.contents()[4]]
    assert forward_acls == sorted(forward_acls, key=encode_acl)
    assert set(forward_acls) == {OPEN_ACL_UNSAFE, IP_ACL, DIGEST_ACL, READ_ACL_UNSAFE}
    backward_acls = [acl for _, acl in backward.contents()[4]]
    assert [a for a in forward_acls if a in backward_acls] == backward_acls


def test_the_config_nodes_acl_is_in_the_table_only_when_a_znode_holds_it():
    tree = DataTree()
    apply(tree, 0x1_0000_0001, Transaction(1, Create("/a", b"", OPEN_ACL_UNSAFE, 0, 1)))
    assert [acl for _, acl in tree.contents()[4]] == [OPEN_ACL_UNSAFE]
    assert decode_snapshot(encode_tree(tree)).acl(paths.CONFIG)[0] == READ_ACL_UNSAFE


def test_an_acl_table_out_of_order_repeated_or_unused_is_refused():
    tree = sample()
    good = encode_tree(tree)
    table = [encoded for encoded, _ in tree.contents()[4]]
    start = 25  # after the header and the table's count
    assert good[start:start + sum(map(len, table))] == b"".join(table)
    swapped = good[:start] + table[1] + table[0] + b"".join(table[2:]) + good[start + sum(map(len, table)):]
    with pytest.raises(DecodeError, match="order"):
        decode_snapshot(swapped)
    repeated = good[:21] + struct.pack(">I", len(table) + 1) + table[0] + good[start:]
    with pytest.raises(DecodeError, match="order"):
        decode_snapshot(repeated)
    unused = encode_acl((ACL(Perm.ALL, Id("world", "anyone")), ACL(Perm.READ, Id("ip", "1.2.3.4"))))
    assert unused > table[-1]  # so that only its being unused is wrong
    extra = good[:21] + struct.pack(">I", len(table) + 1) + b"".join(table) + unused + good[start + sum(map(len, table)):]
    with pytest.raises(DecodeError, match="used by no znode"):
        decode_snapshot(extra)
