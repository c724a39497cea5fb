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
from metastore.core.tree import DataTree, EphemeralType, Node, NodeRecord, _session_hash, ephemeral_type, is_session_id

_U64 = (1 << 64) - 1


class TreeAssembler:
    """Records in path order in, one DataTree out. ValueError (or BadArguments from path
    validation) as soon as a record breaks the tree's invariants."""

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
        path, owner = record[0], record[11]
        if path <= self._previous and self._previous:
            raise ValueError(f"{path!r} out of order")
        self._previous = path
        self._check_record(path, owner)
        node = Node(record[1], record[2], 0, 0, owner, 0)
        (node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime,
         node.version, node.cversion, node.aversion) = record[3:11]
        nodes = self._tree._nodes
        nodes[path] = node
        if path != paths.ROOT:
            parent = nodes[paths.split(path)[0]]
            if not parent.children:
                parent.children = set()
            parent.children.add(paths.basename(path))  # type: ignore[union-attr]
        self.records += 1

    def finish(self) -> DataTree:
        """The tree, with its indexes, interned ACLs, /zookeeper/config and digest."""
        tree = self._tree
        if not {paths.ROOT, paths.ZOOKEEPER, paths.QUOTA} <= tree._nodes.keys():
            raise ValueError("a system znode is missing")
        loaded, tree._nodes = tree._nodes, {}
        for path, node in loaded.items():
            tree._insert(path, node)
        tree._install_config_node()
        tree._digest = (tree._digest + sum(_session_hash(s, t) for s, t in tree._sessions.items())) & _U64
        return tree

    def _check_record(self, path: str, owner: int) -> None:
        paths.validate_path(path)
        if path == paths.CONFIG:
            raise ValueError(f"{path} is not part of a snapshot")
        if path == paths.ROOT:
            return
        parent = self._tree._nodes.get(paths.split(path)[0])
        if parent is None:
            raise ValueError(f"{path!r} has no parent")
        if ephemeral_type(parent.owner) is EphemeralType.NORMAL:
            raise ValueError(f"{path!r} is the child of an ephemeral")
        if ephemeral_type(owner) is EphemeralType.NORMAL and owner not in self._tree._sessions:
            raise ValueError(f"{path!r} belongs to no session")
