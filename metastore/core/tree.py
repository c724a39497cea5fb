"""The znode tree: ZooKeeper's DataTree as a pure, deterministic state machine.

Mutations are the effects of committed transactions (metastore/core/txn.py applies
them) and take only the transaction's zxid and time, so every node applying the
same transactions holds the same tree. Stat semantics follow ZooKeeper
(DataTree, DataNode.copyStat, EphemeralType); docs/metastore_tree.md has the
table. In short: the stored cversion counts children ever created (it names
sequential children) and clients see 2 * cversion - numChildren; ephemeralOwner
also marks containers and TTL nodes, which clients see as 0.

Precondition failures raise the error a client would get (NoNode, NodeExists,
...) before anything changes, so the leader can check requests against a tree
holding its view of the future; a transaction's absolute values (parent
cversion, resulting version) that do not match raise TxnConflict. savepoint()
and rollback() undo a half-applied multi in O(its changes).

digest() is O(1): a sum of per-znode and per-session hashes kept up to date (tree_digest.py).
freeze() is a copy-on-write view (an O(n) copy of references, then each znode is copied the first
time it changes), its znodes in the dict's order, every parent first; snapshot_codec.py has its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from metastore.core import paths
from metastore.core.ephemeral_owner import EphemeralType, client_owner, ephemeral_type, is_session_id, ttl_of
from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, encode_acl
from metastore.errors import (BadArguments, BadVersion, NoChildrenForEphemerals, NoNode, NodeExists,
                              NotEmpty, SessionExpired, TxnConflict)
from metastore.core.stat import Stat
from metastore.core.tree_digest import ZnodeData, data_hash, node_hash, session_hash

_U64 = (1 << 64) - 1


def i32(value: int) -> int:
    """Wrap to a Java int, as ZooKeeper's counters do."""
    return ((value + 0x8000_0000) & 0xFFFF_FFFF) - 0x8000_0000


def next_version(version: int) -> int:
    """The version after `version` (PrepRequestProcessor.checkAndIncVersion): wraps, never -1."""
    following = i32(version + 1)
    return 0 if following == -1 else following


_NO_CHILDREN: frozenset[str] = frozenset()
_JAVA_TRIM = "".join(map(chr, range(33)))  # what Java's String.trim() strips
# /zookeeper/config holds each node's own view of the ensemble (set_config_node), not
# replicated state: no transaction may change it or create under it. (Its READ-only ACL
# already refuses that to clients; ZooKeeper would let a super user change its ACL.)
_CONFIG_IS_LOCAL = "/zookeeper/config is the node's configuration, not replicated data"

# A snapshot's znode: path, data, acl, czxid, mzxid, pzxid, ctime, mtime, version,
# internal cversion, aversion, ephemeral owner.
NodeRecord = tuple[str, ZnodeData, tuple[ACL, ...], int, int, int, int, int, int, int, int, int]
# What a snapshot encodes: last_zxid, nodes by path, sessions, digest, ACL table (contents()).
TreeView = tuple[int, "dict[str, Node]", dict[int, int], int, list[tuple[bytes, tuple[ACL, ...]]]]


class Node:
    """One znode (null data is None). Owned by its DataTree: read it, never change it (the tree copies on write).
    `hash` and `data_hash` are None on a znode restored without them until it first changes."""

    __slots__ = ("data", "acl", "czxid", "mzxid", "pzxid", "ctime", "mtime", "version", "cversion", "aversion",
                 "owner", "children", "data_hash", "hash", "epoch")

    def __init__(self, data: ZnodeData, acl: tuple[ACL, ...], zxid: int, time_ms: int, owner: int, epoch: int) -> None:
        self.data = data
        self.acl = acl
        self.czxid = self.mzxid = self.pzxid = zxid
        self.ctime = self.mtime = time_ms
        self.version = self.cversion = self.aversion = 0
        self.owner = owner
        self.children: set[str] | frozenset[str] = _NO_CHILDREN
        self.data_hash = data_hash(data)
        self.hash = 0
        self.epoch = epoch

    def copy(self, epoch: int) -> Node:
        twin = Node.__new__(Node)
        for name in Node.__slots__:
            setattr(twin, name, getattr(self, name))
        if self.children:
            twin.children = set(self.children)
        twin.epoch = epoch
        return twin

    def stat(self) -> Stat:
        n = len(self.children)
        return Stat(self.czxid, self.mzxid, self.ctime, self.mtime, self.version, i32(2 * self.cversion - n),
                    self.aversion, client_owner(self.owner), len(self.data or b""), n, self.pzxid)  # null: 0


class DataTree:
    """Znodes by path, sessions, and the indexes derived from them (ephemerals, containers, TTLs)."""

    def __init__(self) -> None:
        self.last_zxid = 0
        self._nodes: dict[str, Node] = {}
        self._sessions: dict[int, int] = {}
        self._ephemerals: dict[int, set[str]] = {}
        self._containers: set[str] = set()
        self._ttls: set[str] = set()
        self._acls: dict[tuple[ACL, ...], list] = {}  # interned ACL -> [acl, encoded, references]
        self._digest = 0
        self._epoch = 0
        self._undo: list[tuple] | None = None  # (undo function, *args) while a savepoint is open
        # Bytes of every znode's path and data: ZooKeeper's approximate data size (mntr), kept as
        # the tree changes so that a monitor's scrape costs no walk of a large tree.
        self.data_bytes = 0
        self._install_system_nodes()

    def _install_system_nodes(self) -> None:
        # DataTree's constructor: "/", "/zookeeper", "/zookeeper/quota", all-zero stats, open ACLs;
        # addConfigNode: "/zookeeper/config", READ_ACL_UNSAFE set with aversion -1.
        for path in (paths.ROOT, paths.ZOOKEEPER, paths.QUOTA):
            self._insert(path, Node(b"", OPEN_ACL_UNSAFE, 0, 0, 0, self._epoch))
            if path != paths.ROOT:
                self._rehash(*self._link(path))
        self._install_config_node()

    def _install_config_node(self) -> None:
        config = Node(b"", READ_ACL_UNSAFE, 0, 0, 0, self._epoch)
        config.aversion = -1
        self._insert(paths.CONFIG, config)
        self._rehash(*self._link(paths.CONFIG))

    def _link(self, path: str) -> tuple[str, Node]:
        """Add `path` to its parent's children; returns the parent, for the caller to rehash."""
        parent_path, name = paths.split(path)
        parent = self._writable(parent_path)
        if not parent.children:
            parent.children = set()
        parent.children.add(name)  # type: ignore[union-attr]
        return parent_path, parent

    def _unlink(self, path: str) -> tuple[str, Node]:
        parent_path, name = paths.split(path)
        parent = self._writable(parent_path)
        parent.children.remove(name)  # type: ignore[union-attr]
        if not parent.children:
            parent.children = _NO_CHILDREN
        return parent_path, parent

    # -- queries -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, path: str) -> bool:
        return path in self._nodes

    def node(self, path: str) -> Node | None:
        """The znode at `path` (read only), or None."""
        return self._nodes.get(path)

    def _existing(self, path: str) -> Node:
        node = self._nodes.get(path)
        if node is None:
            raise NoNode(path)
        return node

    def exists(self, path: str) -> Stat | None:
        node = self._nodes.get(path)
        return None if node is None else node.stat()

    def get(self, path: str) -> tuple[bytes, Stat]:
        node = self._existing(path)
        return node.data, node.stat()

    def children(self, path: str) -> list[str]:
        """Child names, sorted (ZooKeeper returns them in no particular order)."""
        return sorted(self._existing(path).children)

    def acl(self, path: str) -> tuple[tuple[ACL, ...], Stat]:
        node = self._existing(path)
        return node.acl, node.stat()

    def parent_cversion(self, path: str) -> int:
        """The internal create counter of `path`: the number a sequential child created now gets."""
        return self._existing(path).cversion

    def all_children_number(self, path: str) -> int:
        """Number of descendants at every depth (getAllChildrenNumber)."""
        if path == paths.ROOT:
            self._existing(path)
            return len(self._nodes) - 1
        count, stack = 0, [path]
        while stack:
            parent = stack.pop()
            for name in self._existing(parent).children:
                count += 1
                stack.append(paths.join(parent, name))
        return count

    def ephemerals(self, session_id: int, prefix: str = "/") -> list[str]:
        """The session's ephemerals whose path starts with `prefix` (a plain string prefix), sorted."""
        owned = self._ephemerals.get(session_id, ())
        trimmed = prefix.strip(_JAVA_TRIM)
        if trimmed in ("", "/"):
            return sorted(owned)
        return sorted(p for p in owned if p.startswith(prefix))

    def sessions(self) -> dict[int, int]:
        """Session id -> negotiated timeout (ms), a copy."""
        return dict(self._sessions)

    def session_timeout(self, session_id: int) -> int | None:
        return self._sessions.get(session_id)

    def containers(self) -> list[str]:
        return sorted(self._containers)

    def ttl_nodes(self) -> list[str]:
        return sorted(self._ttls)

    def container_candidates(self, now_ms: int, max_never_used_ms: int = 0) -> list[str]:
        """Containers and TTL nodes due for deletion (ContainerManager.getCandidates), sorted: an
        empty container once it ever had a child (or, with max_never_used_ms > 0, once unmodified for
        longer); an empty TTL node once unmodified for longer than its TTL."""
        due = []
        for path in self._containers:
            node = self._nodes[path]
            if not node.children and (node.cversion > 0 or 0 < max_never_used_ms < now_ms - node.mtime):
                due.append(path)
        for path in self._ttls:
            node = self._nodes[path]
            if not node.children and now_ms - node.mtime > ttl_of(node.owner):
                due.append(path)
        return sorted(due)

    def digest(self) -> int:
        """The tree digest, a u64, maintained incrementally (O(1))."""
        return self._digest

    def recompute_digest(self) -> int:
        """The digest computed from scratch (O(size of the tree)); equals digest() unless there is a bug."""
        total = sum(node_hash(p, n, encode_acl(n.acl), data_hash(n.data)) for p, n in self._nodes.items())
        total += sum(session_hash(s, t) for s, t in self._sessions.items())
        return total & _U64

    # -- internal bookkeeping ------------------------------------------------------
    def _intern(self, acl: Sequence[ACL]) -> tuple[ACL, ...]:
        key = tuple(acl)
        entry = self._acls.get(key)
        if entry is None:
            entry = self._acls[key] = [key, encode_acl(key), 0]
        entry[2] += 1
        return entry[0]

    def _release(self, acl: tuple[ACL, ...]) -> None:
        entry = self._acls[acl]
        entry[2] -= 1
        if entry[2] == 0:
            del self._acls[acl]

    def _rehash(self, path: str, node: Node) -> None:
        old = node.hash
        self._materialize(path, node)
        self._digest = (self._digest - old + node.hash) & _U64

    def _materialize(self, path: str, node: Node) -> None:
        """Hash a znode restored without its hashes (metastore/core/tree_assembly.py) as it is, so
        that the digest can take it out when it changes or goes."""
        if node.data_hash is None:
            node.data_hash = data_hash(node.data)
        node.hash = node_hash(path, node, self._acls[node.acl][1], node.data_hash)

    def _writable(self, path: str) -> Node:
        node = self._nodes[path]
        if node.hash is None:
            self._materialize(path, node)
        if node.epoch != self._epoch:  # shared with a frozen view: copy before changing
            node = self._nodes[path] = node.copy(self._epoch)
        return node

    def _insert(self, path: str, node: Node) -> None:
        node.acl = self._intern(node.acl)
        self._nodes[path] = node
        self.data_bytes += len(path) + len(node.data or b"")
        kind = ephemeral_type(node.owner)
        if kind is EphemeralType.CONTAINER:
            self._containers.add(path)
        elif kind is EphemeralType.TTL:
            self._ttls.add(path)
        elif kind is EphemeralType.NORMAL:
            self._ephemerals.setdefault(node.owner, set()).add(path)
        self._rehash(path, node)

    def _remove(self, path: str) -> Node:
        node = self._nodes.pop(path)
        self.data_bytes -= len(path) + len(node.data or b"")
        if node.hash is None:
            self._materialize(path, node)
        self._digest = (self._digest - node.hash) & _U64
        self._release(node.acl)
        kind = ephemeral_type(node.owner)
        if kind is EphemeralType.CONTAINER:
            self._containers.discard(path)
        elif kind is EphemeralType.TTL:
            self._ttls.discard(path)
        elif kind is EphemeralType.NORMAL:
            owned = self._ephemerals[node.owner]
            owned.discard(path)
            if not owned:
                del self._ephemerals[node.owner]
        return node

    # -- mutations (transaction effects) -----------------------------------------
    def create(self, path: str, data: ZnodeData, acl: Sequence[ACL], owner: int, parent_cversion: int,
               zxid: int, time_ms: int) -> Stat:
        """Create a znode; the parent's internal cversion must become `parent_cversion` (old + 1)."""
        parent_path = paths.split(path)[0]
        parent = self._nodes.get(parent_path)
        if parent is None:
            raise NoNode(path)
        if parent_path == paths.CONFIG:
            raise BadArguments(path, _CONFIG_IS_LOCAL)
        if path in self._nodes:
            raise NodeExists(path)
        if ephemeral_type(parent.owner) is EphemeralType.NORMAL:
            raise NoChildrenForEphemerals(path)
        if ephemeral_type(owner) is EphemeralType.NORMAL and owner not in self._sessions:
            raise SessionExpired(path, f"session {owner:#x} does not exist")
        if parent_cversion != i32(parent.cversion + 1):
            raise TxnConflict(f"create {path!r}: parent cversion {parent.cversion} + 1 != {parent_cversion}")
        if self._undo is not None:
            self._undo.append((self._undo_create, path, parent.cversion, parent.pzxid))
        parent_path, parent = self._link(path)
        parent.cversion = parent_cversion
        parent.pzxid = zxid
        self._rehash(parent_path, parent)
        node = Node(data, tuple(acl), zxid, time_ms, owner, self._epoch)
        self._insert(path, node)
        return node.stat()

    def delete(self, path: str, zxid: int) -> None:
        """Delete a childless znode; the parent's pzxid becomes `zxid`."""
        if path in paths.SPECIAL:
            raise BadArguments(path, "a system znode cannot be deleted")
        node = self._existing(path)
        if node.children:
            raise NotEmpty(path)
        if self._undo is not None:
            self._undo.append((self._undo_delete, path, node, self._nodes[paths.split(path)[0]].pzxid))
        parent_path, parent = self._unlink(path)
        parent.pzxid = zxid
        self._rehash(parent_path, parent)
        self._remove(path)

    def set_data(self, path: str, data: ZnodeData, version: int, zxid: int, time_ms: int) -> Stat:
        """Replace the data; `version` is the resulting version (the current one's successor)."""
        current = self._existing(path)
        if path == paths.CONFIG:
            raise BadArguments(path, _CONFIG_IS_LOCAL)
        if version != next_version(current.version):
            raise TxnConflict(f"setData {path!r}: version {current.version} is not followed by {version}")
        if self._undo is not None:
            self._undo.append((self._restore_data, path, current.data, current.data_hash, current.version,
                               current.mzxid, current.mtime))
        self._restore_data(path, data, data_hash(data), version, zxid, time_ms)
        return self._nodes[path].stat()

    def _restore_data(self, path: str, data: ZnodeData, data_hash: bytes, version: int, mzxid: int, mtime: int) -> None:
        node = self._writable(path)
        self.data_bytes += len(data or b"") - len(node.data or b"")
        node.data, node.data_hash, node.version, node.mzxid, node.mtime = data, data_hash, version, mzxid, mtime
        self._rehash(path, node)

    def set_acl(self, path: str, acl: Sequence[ACL], aversion: int) -> Stat:
        """Replace the ACL; `aversion` is the resulting ACL version (the current one's successor)."""
        current = self._existing(path)
        if path == paths.CONFIG:
            raise BadArguments(path, _CONFIG_IS_LOCAL)
        if aversion != next_version(current.aversion):
            raise TxnConflict(f"setACL {path!r}: aversion {current.aversion} is not followed by {aversion}")
        if self._undo is not None:
            self._undo.append((self._restore_acl, path, current.acl, current.aversion))
        self._restore_acl(path, acl, aversion)
        return self._nodes[path].stat()

    def _restore_acl(self, path: str, acl: Sequence[ACL], aversion: int) -> None:
        node = self._writable(path)
        old = node.acl
        node.acl = self._intern(acl)
        self._release(old)
        node.aversion = aversion
        self._rehash(path, node)

    def check_version(self, path: str, version: int) -> None:
        """BadVersion unless the znode is at `version` (a multi's check op)."""
        if self._existing(path).version != version:
            raise BadVersion(path)

    def create_session(self, session_id: int, timeout_ms: int) -> None:
        assert self._undo is None, "sessions change outside savepoints (a multi has no session ops)"
        if not is_session_id(session_id):
            raise BadArguments(None, f"{session_id:#x} is not a valid session id")
        if session_id in self._sessions:
            raise TxnConflict(f"session {session_id:#x} already exists")
        self._sessions[session_id] = timeout_ms
        self._digest = (self._digest + session_hash(session_id, timeout_ms)) & _U64

    def close_session(self, session_id: int, ephemerals: Sequence[str], zxid: int) -> tuple[str, ...]:
        """End a session: delete exactly its ephemerals (which the transaction lists), each as a delete."""
        assert self._undo is None, "sessions change outside savepoints (a multi has no session ops)"
        timeout_ms = self._sessions.get(session_id)
        if timeout_ms is None:
            raise SessionExpired(None, f"session {session_id:#x} does not exist")
        owned = self._ephemerals.get(session_id, set())
        if set(ephemerals) != owned or len(ephemerals) != len(owned):
            raise TxnConflict(f"closeSession {session_id:#x} lists {sorted(ephemerals)}, owns {sorted(owned)}")
        deleted = tuple(sorted(owned))
        for path in deleted:
            self.delete(path, zxid)
        del self._sessions[session_id]
        self._digest = (self._digest - session_hash(session_id, timeout_ms)) & _U64
        return deleted

    def set_config_node(self, data: bytes, config_version: int, time_ms: int) -> None:
        """This node's view of the ensemble configuration (/zookeeper/config), as ZooKeeper
        installs it at startup: version -1, mzxid = the config version. Not replicated state:
        outside the digest and the snapshot."""
        node = self._writable(paths.CONFIG)
        self.data_bytes += len(data or b"") - len(node.data or b"")
        node.data, node.data_hash = data, data_hash(data)
        node.version, node.mzxid, node.mtime = -1, config_version, time_ms

    # -- savepoints: undo a half-applied multi -------------------------------------
    def savepoint(self) -> tuple[int, int]:
        """Start (or nest) recording undo information for znode changes; returns the token
        for rollback() or release(). Session changes are not allowed meanwhile."""
        if self._undo is None:
            self._undo = []
        return len(self._undo), self.last_zxid

    def rollback(self, savepoint: tuple[int, int]) -> None:
        """Undo every znode change since `savepoint` (O(changes)); digest and indexes follow."""
        mark, last_zxid = savepoint
        log, self._undo = self._undo, None
        assert log is not None and len(log) >= mark, "rollback without a matching savepoint"
        while len(log) > mark:
            undo, *args = log.pop()
            undo(*args)
        self.last_zxid = last_zxid
        self._undo = log if mark else None

    def release(self, savepoint: tuple[int, int]) -> None:
        """Keep the changes since `savepoint`; the outermost release stops recording."""
        if savepoint[0] == 0:
            self._undo = None

    def _undo_create(self, path: str, parent_cversion: int, parent_pzxid: int) -> None:
        self._remove(path)
        parent_path, parent = self._unlink(path)
        parent.cversion, parent.pzxid = parent_cversion, parent_pzxid
        self._rehash(parent_path, parent)

    def _undo_delete(self, path: str, node: Node, parent_pzxid: int) -> None:
        parent_path, parent = self._link(path)
        parent.pzxid = parent_pzxid
        self._rehash(parent_path, parent)
        node = node.copy(self._epoch)  # childless: cheap; the old object may be in a frozen view
        node.hash = 0
        self._insert(path, node)

    # -- snapshots ---------------------------------------------------------------
    def freeze(self) -> TreeView:
        """A consistent view at last_zxid, as contents() gives it: an O(n) copy of references, after
        which each znode is copied the first time it changes, so the view stays as it was
        (metastore/wire/snapshot_codec.py encodes it, later and on another thread)."""
        self._epoch += 1
        last_zxid, nodes, sessions, digest, acls = self.contents()
        return last_zxid, dict(nodes), dict(sessions), digest, acls

    def contents(self) -> TreeView:
        """(last_zxid, nodes, sessions, digest, ACL table) as they are, not copied: to encode at once.
        The nodes dict holds every parent before its children (a znode is created under an existing
        parent, and deleted only once childless): the order a snapshot writes them in. The table has every ACL list a znode other than /zookeeper/config (no snapshot's)
        holds, as (its encoding, the interned list those znodes refer to), sorted by the encoding."""
        config_acl = self._nodes[paths.CONFIG].acl
        return self.last_zxid, self._nodes, self._sessions, self._digest, sorted(
            (entry[1], entry[0]) for entry in self._acls.values() if entry[2] > (entry[0] is config_acl))
