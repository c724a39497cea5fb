"""metastore/core/tree_fork.py: a fork shares the tree's znodes, and each side's changes stay its
own (the leader's view of the future against the committed tree), over random write histories."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metastore.core.acl import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE
from metastore.core.tree import DataTree
from metastore.core.tree_fork import fork
from metastore.errors import ZooKeeperError

PATHS = ["/a", "/a/b", "/a/c", "/d", "/d/e"]
OPS = st.lists(st.tuples(st.sampled_from(["create", "set", "delete", "acl", "session", "ephemeral"]),
                         st.sampled_from(PATHS), st.binary(max_size=8)), max_size=25)


def run(tree: DataTree, ops, zxid: int) -> int:
    """Apply `ops` as a leader would, skipping the ones that do not fit; returns the last zxid."""
    for kind, path, data in ops:
        zxid += 1
        try:
            if kind == "create":
                parent = path.rsplit("/", 1)[0] or "/"
                tree.create(path, data, OPEN_ACL_UNSAFE, 0, tree.parent_cversion(parent) + 1, zxid, zxid)
            elif kind == "set":
                tree.set_data(path, data, tree.exists(path).version + 1 if path in tree else 0, zxid, zxid)
            elif kind == "delete":
                tree.delete(path, zxid)
            elif kind == "acl":
                tree.set_acl(path, READ_ACL_UNSAFE, tree.exists(path).aversion + 1 if path in tree else 0)
            elif kind == "session":
                if tree.session_timeout(0x1000 + len(data)) is not None:
                    raise KeyError("open")
                tree.create_session(0x1000 + len(data), 1000)
            else:
                tree.create_session(0x2000, 1000) if tree.session_timeout(0x2000) is None else None
                parent = (path + "x").rsplit("/", 1)[0] or "/"
                tree.create(path + "x", data, OPEN_ACL_UNSAFE, 0x2000, tree.parent_cversion(parent) + 1, zxid, zxid)
        except (ZooKeeperError, KeyError, AttributeError):
            zxid -= 1
    tree.last_zxid = zxid
    return zxid


def contents(tree: DataTree) -> dict:
    return {p: (tree.get(p), tree.acl(p)[0], tuple(sorted(tree.children(p)))) for p in ["/", *PATHS, "/ax", "/dx"]
            if p in tree}


@given(OPS, OPS, OPS)
def test_a_fork_and_its_tree_change_apart_and_each_equals_a_tree_that_had_only_its_own_changes(common, mine, theirs):
    tree, alone_mine, alone_theirs = DataTree(), DataTree(), DataTree()
    zxid = 0
    for t in (tree, alone_mine, alone_theirs):
        zxid = run(t, common, 0)
    twin = fork(tree)
    run(twin, theirs, zxid)
    run(tree, mine, zxid)
    run(alone_mine, mine, zxid)
    run(alone_theirs, theirs, zxid)
    assert contents(tree) == contents(alone_mine) and tree.digest() == alone_mine.digest()
    assert contents(twin) == contents(alone_theirs) and twin.digest() == alone_theirs.digest()
    assert tree.digest() == tree.recompute_digest() and twin.digest() == twin.recompute_digest()
