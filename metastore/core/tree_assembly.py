"""A DataTree rebuilt from a snapshot's contents one znode at a time (issue 19: streamed restore).

A snapshot decoder (metastore/wire/snapshot_stream.py) hands each znode record to `add` as soon
as its bytes have arrived, so the tree grows while the snapshot streams in, from a file at start
or from a leader's SNAPCHUNKs, and no copy of the snapshot's bytes is ever held whole. `finish`
checks what only the whole can show (the system znodes are there) and computes the indexes and
the digest, which depend on every znode's final children.

This module is DataTree's friend: it fills the tree's private fields directly, as the tree's own
constructor would, rather than replay the records as transactions.
"""

from __future__ import annotations

from metastore.core import paths
from metastore.core.acl import encode_acl
from metastore.core.paths import _INVALID_CHAR
from metastore.core.tree import (_NO_CHILDREN, CONTAINER_OWNER, TTL_MASK, DataTree, EphemeralType, Node, NodeRecord,
                                 _data_hash, _node_hash, _session_hash, ephemeral_type, is_session_id)

_U64 = (1 << 64) - 1
_SPECIAL_NAMES = ("", ".", "..")


class TreeAssembler:
    """Records in path order in, one DataTree out. ValueError (or BadArguments from path
    validation) as soon as a record breaks the tree's invariants.

    Per znode this is the cost of a restart and of a SNAP (a million znodes: seconds of Python),
    so the common case takes the short way: a path is checked by its last name only (its parent,
    already in the tree, was checked whole), an owner of 0 needs no classification, and a
    record's ACL list is interned once per distinct list object, not hashed per znode."""

    def __init__(self, last_zxid: int, sessions: dict[int, int]) -> None:
        for session_id in sessions:
            if not is_session_id(session_id):
                raise ValueError(f"{session_id:#x} is not a session id")
        tree = self._tree = DataTree()
        tree._nodes, tree._acls, tree._digest = {}, {}, 0
        tree.last_zxid, tree._sessions = last_zxid, dict(sessions)
        self._previous = ""
        self.records = 0

    def add(self, record: NodeRecord) -> None:
        """One znode, after every znode whose path sorts before it."""
        self.add_fields(*record)

    def add_fields(self, path: str, data: bytes, acl: tuple, czxid: int, mzxid: int, pzxid: int, ctime: int,
                   mtime: int, version: int, cversion: int, aversion: int, owner: int) -> None:
        """`add` without the record tuple (the snapshot decoder's call)."""
        previous = self._previous
        if path <= previous and previous:
            raise ValueError(f"{path!r} out of order")
        self._previous = path
        nodes = self._tree._nodes
        if path == paths.ROOT:
            parent = None
        else:
            parent = self._parent(path, nodes)
        if owner and ephemeral_type(owner) is EphemeralType.NORMAL and owner not in self._tree._sessions:
            raise ValueError(f"{path!r} belongs to no session")
        node = Node.__new__(Node)
        node.data, node.acl, node.owner = data, acl, owner
        node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime = czxid, mzxid, pzxid, ctime, mtime
        node.version, node.cversion, node.aversion = version, cversion, aversion
        node.children = _NO_CHILDREN
        node.data_hash = _data_hash(data)
        node.hash = node.epoch = 0
        nodes[path] = node
        if parent is not None:
            if not parent.children:
                parent.children = set()
            parent.children.add(path[path.rindex("/") + 1:])  # type: ignore[union-attr]
        self.records += 1

    def _parent(self, path: str, nodes: dict[str, Node]) -> Node:
        """The parent of a path other than the root, checking the path: the parent was checked
        whole when it was added, so only the last name is left (and "//x" looks like a child of
        the root: refused by where its last slash is)."""
        i = path.rfind("/")
        name = path[i + 1:]
        if i == 1 or i < 0 or name in _SPECIAL_NAMES or _INVALID_CHAR.search(name) is not None:
            paths.validate_path(path)  # the reason, in ZooKeeper's words
            raise ValueError(f"{path!r} is not a valid path")
        if path == paths.CONFIG:
            raise ValueError(f"{path} is not part of a snapshot")
        parent = nodes.get(path[:i] or paths.ROOT)
        if parent is None:
            paths.validate_path(path)
            raise ValueError(f"{path!r} has no parent")
        if parent.owner and ephemeral_type(parent.owner) is EphemeralType.NORMAL:
            raise ValueError(f"{path!r} is the child of an ephemeral")
        return parent

    def finish(self) -> DataTree:
        """The tree, with its indexes, interned ACLs, /zookeeper/config and digest (DataTree._insert's
        work for every znode, in one loop)."""
        tree = self._tree
        nodes = tree._nodes
        if not {paths.ROOT, paths.ZOOKEEPER, paths.QUOTA} <= nodes.keys():
            raise ValueError("a system znode is missing")
        acls, by_object = tree._acls, {}
        digest = 0
        for path, node in nodes.items():
            acl = node.acl
            entry = by_object.get(id(acl))
            if entry is None:  # the decoder hands the same list object for the same ACL index
                key = tuple(acl)
                entry = acls.get(key)
                if entry is None:
                    entry = acls[key] = [key, encode_acl(key), 0]
                by_object[id(acl)] = entry
            entry[2] += 1
            node.acl = entry[0]
            owner = node.owner
            if owner:
                if owner == CONTAINER_OWNER:
                    tree._containers.add(path)
                elif owner & TTL_MASK == TTL_MASK:
                    tree._ttls.add(path)
                else:
                    tree._ephemerals.setdefault(owner, set()).add(path)
            node.hash = _node_hash(path, node, entry[1], node.data_hash)
            digest += node.hash
        tree._digest = digest
        tree._install_config_node()
        tree._digest = (tree._digest + sum(_session_hash(s, t) for s, t in tree._sessions.items())) & _U64
        return tree
