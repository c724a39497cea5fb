"""The tree keeps its paths sorted (DataTree's SortedList beside the dict) and a snapshot walks
them instead of sorting: whatever order znodes were created and deleted in, the bytes are those
of the same tree restored, and every parent precedes its children."""

from __future__ import annotations

import random

from metastore.core import paths
from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.tree import DataTree
from metastore.core.tree_fork import fork
from metastore.core.txn import Create, Delete, Transaction, apply
from metastore.wire.snapshot_codec import FrozenTree, decode_snapshot, encode_tree


def test_creates_and_deletes_in_any_order_encode_as_the_restored_tree():
    rng = random.Random(5)
    tree = DataTree()
    zxid = 0x1_0000_0000
    parents = [f"/p{i}" for i in rng.sample(range(40), 40)]
    for p in parents:
        zxid += 1
        apply(tree, zxid, Transaction(zxid, Create(p, b"", OPEN_ACL_UNSAFE, 0, tree.parent_cversion("/") + 1)))
    live = []
    for _ in range(3000):
        zxid += 1
        if live and rng.random() < 0.3:
            path = live.pop(rng.randrange(len(live)))
            body = Delete(path)
        else:
            parent = rng.choice(parents)
            path = f"{parent}/{rng.randrange(10**6):06d}"
            if path in live:
                continue
            live.append(path)
            body = Create(path, b"x", OPEN_ACL_UNSAFE, 0, tree.parent_cversion(parent) + 1)
        apply(tree, zxid, Transaction(zxid, body))
    frozen = FrozenTree.of(tree)
    assert frozen.order == sorted(tree._nodes) and paths.CONFIG in frozen.order
    restored = decode_snapshot(frozen.to_bytes())
    assert list(restored._order) == sorted(restored._nodes) == frozen.order
    assert encode_tree(restored) == frozen.to_bytes() == encode_tree(fork(tree))
