"""A snapshot (format version 3) lists the znodes in the tree's own order, the order of their
creation: whatever order znodes were created and deleted in, every parent precedes its children,
and the bytes are those of the same tree restored and of its fork."""

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
    order = {path: i for i, path in enumerate(frozen.nodes)}
    assert all(order[paths.parent_of(p)] < i for p, i in order.items() if p != "/")
    assert list(order) != sorted(order)  # the parents were created in a shuffled order
    restored = decode_snapshot(frozen.to_bytes())
    config = paths.CONFIG  # no snapshot's: the restore adds it last
    assert list(restored._nodes) == [p for p in frozen.nodes if p != config] + [config]
    assert encode_tree(restored) == frozen.to_bytes() == encode_tree(fork(tree))
