"""A DataTree rebuilt from a snapshot's contents one znode at a time (issue 19: streamed restore).

A snapshot decoder (metastore/wire/snapshot_stream.py) hands each znode record to `add` as soon
as its bytes have arrived, so the tree grows while the snapshot streams in, from a file at start
or from a leader's SNAPCHUNKs, and no copy of the snapshot's bytes is ever held whole. `finish`
checks what only the whole can show (the system znodes are there) and either computes the digest,
which depends on every znode's final children, or takes the snapshot's (a node's restore:
docs/metastore_tree.md, "Snapshots"), leaving each znode to be hashed when it first changes.

This module is DataTree's friend: it fills the tree's private fields directly, as the tree's own
constructor would, rather than replay the records as transactions.
"""

from __future__ import annotations

from collections.abc import Sequence


from metastore.core import paths
from metastore.core.acl import ACL, encode_acl
from metastore.core.paths import _INVALID_CHAR
from metastore.core.ephemeral_owner import CONTAINER_OWNER, TTL_MASK, EphemeralType, ephemeral_type, is_session_id
from metastore.core.tree import _NO_CHILDREN, DataTree, Node, NodeRecord
from metastore.core.tree_digest import session_hash

_U64 = (1 << 64) - 1
_SPECIAL_NAMES = ("", ".", "..")


class TreeAssembler:
    """Records in, one DataTree out: every parent before its children, and with `path_order` (the
    snapshot versions before 3) sorted by path. ValueError (or BadArguments from path
    validation) as soon as a record breaks the tree's invariants.

    Per znode this is the cost of a restart and of a SNAP (a million znodes: seconds of Python),
    so the common case takes the short way: a path is checked by its last name only (its parent,
    already in the tree, was checked whole), the parent of the previous record is looked up once
    for all its siblings, an owner of 0 needs no classification, an ACL list is interned once
    per distinct list (`acl_entry`), and no znode is hashed unless the digest must be verified
    (`finish`)."""

    def __init__(self, last_zxid: int, sessions: dict[int, int], *, path_order: bool = False) -> None:
        for session_id in sessions:
            if not is_session_id(session_id):
                raise ValueError(f"{session_id:#x} is not a session id")
        tree = self._tree = DataTree()
        tree._nodes, tree._acls, tree._digest, tree.data_bytes = {}, {}, 0, 0
        self._path_order = path_order
        tree.last_zxid, tree._sessions = last_zxid, dict(sessions)
        self._previous = ""
        # The previous record's parent, by its path as the record's own prefix ("" for the root).
        self._parent_key: str | None = None
        self._parent_node: Node | None = None
        self.records = 0

    def acl_entry(self, acl: Sequence[ACL]) -> list:
        """The tree's interned entry for an ACL list, [acl, encoded, references]: what add_fields
        takes (a decoder asks once per list of its ACL table)."""
        key = tuple(acl)
        entry = self._tree._acls.get(key)
        if entry is None:
            entry = self._tree._acls[key] = [key, encode_acl(key), 0]
        return entry

    def add(self, record: NodeRecord) -> None:
        """One znode, after its parent (and with path_order, after every znode whose path sorts before it)."""
        path, data, acl, *fixed = record
        self.add_fields(path, data, self.acl_entry(acl), *fixed)

    def add_fields(self, path: str, data: bytes | None, acl: list, czxid: int, mzxid: int, pzxid: int, ctime: int,
                   mtime: int, version: int, cversion: int, aversion: int, owner: int) -> None:
        """`add` without the record tuple (the snapshot decoder's call), its ACL as acl_entry's."""
        if self._path_order:
            previous = self._previous
            if path <= previous and previous:
                raise ValueError(f"{path!r} out of order")
            self._previous = path
        elif path in self._tree._nodes:
            raise ValueError(f"{path!r} comes twice")
        # The short way, for a sibling of the previous record: only its last name is left to check.
        i = path.rfind("/")
        name = path[i + 1:]
        if (path[:i] == self._parent_key and i >= 0 and name not in _SPECIAL_NAMES
                and _INVALID_CHAR.search(name) is None):
            parent = self._parent_node
        else:
            parent = self._parent(path)
        node = Node.__new__(Node)
        node.data, node.acl, node.owner = data, acl[0], owner
        node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime = czxid, mzxid, pzxid, ctime, mtime
        node.version, node.cversion, node.aversion = version, cversion, aversion
        node.children = _NO_CHILDREN
        node.data_hash = node.hash = None  # computed when the znode first changes (DataTree._writable)
        node.epoch = 0
        acl[2] += 1
        if parent is not None:
            if not parent.children:
                parent.children = set()
            parent.children.add(name)  # type: ignore[union-attr]
        if owner:
            self._own(path, owner)
        self._tree._nodes[path] = node
        self._tree.data_bytes += len(path) + len(data or b"")
        self.records += 1

    def _own(self, path: str, owner: int) -> None:
        tree = self._tree
        if owner == CONTAINER_OWNER:
            tree._containers.add(path)
        elif owner & TTL_MASK == TTL_MASK:
            tree._ttls.add(path)
        else:
            if ephemeral_type(owner) is EphemeralType.NORMAL and owner not in tree._sessions:
                raise ValueError(f"{path!r} belongs to no session")
            tree._ephemerals.setdefault(owner, set()).add(path)

    def _parent(self, path: str) -> Node | None:
        """The parent of a path (None for the root) whose parent is not the previous record's,
        checking the path: the parent was checked whole when it was added, so only the last name
        is left (and "//x" looks like a child of the root: refused by where its last slash is).
        The parent is remembered for the siblings that follow, unless it is /zookeeper, the one
        whose child /zookeeper/config is refused by its whole path."""
        if path == paths.ROOT:
            return None
        i = path.rfind("/")
        name = path[i + 1:]
        if i == 1 or i < 0 or name in _SPECIAL_NAMES or _INVALID_CHAR.search(name) is not None:
            paths.validate_path(path)  # the reason, in ZooKeeper's words
            raise ValueError(f"{path!r} is not a valid path")
        if path == paths.CONFIG:
            raise ValueError(f"{path} is not part of a snapshot")
        parent = self._tree._nodes.get(path[:i] or paths.ROOT)
        if parent is None:
            paths.validate_path(path)
            raise ValueError(f"{path!r} has no parent")
        if parent.owner and ephemeral_type(parent.owner) is EphemeralType.NORMAL:
            raise ValueError(f"{path!r} is the child of an ephemeral")
        if path[:i] != paths.ZOOKEEPER:
            self._parent_key, self._parent_node = path[:i], parent
        return parent

    def finish(self, digest: int | None = None) -> DataTree:
        """The tree, with /zookeeper/config. Its digest: `digest` if given (the snapshot's own,
        when its bytes were checked whole by a CRC or a SHA-256 already: hashing every znode is a
        third of a restore), else computed from every znode, for the caller to compare."""
        tree = self._tree
        nodes = tree._nodes
        if not {paths.ROOT, paths.ZOOKEEPER, paths.QUOTA} <= nodes.keys():
            raise ValueError("a system znode is missing")
        for key, entry in tree._acls.items():
            if not entry[2]:  # an encoder writes only what some znode holds: one table per tree
                raise ValueError(f"the ACL table's {list(key)} is used by no znode")
        if digest is None:
            for path, node in nodes.items():
                tree._materialize(path, node)
            tree._digest = (sum(node.hash for node in nodes.values())
                            + sum(session_hash(s, t) for s, t in tree._sessions.items())) & _U64
            tree._install_config_node()  # rehashes /zookeeper for its new child, in the digest
        else:
            tree._install_config_node()
            tree._digest = digest & _U64  # the snapshot's, which counts /zookeeper/config already
        return tree
