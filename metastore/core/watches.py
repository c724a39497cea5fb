"""Watches, as ZooKeeper defines them: one-shot data, exists and child watches, and
persistent (optionally recursive) watches added with addWatch.

Pure: connections are opaque integer ids; `trigger` returns who must be told what.
Watches live on the node that holds the client's connection (as in ZooKeeper);
a client that moves to another node re-registers them with setWatches.

Memory: a watch is one id in a set keyed by path; there is no object per watch,
so millions of watches cost a few dozen bytes each. A trigger touches only the
sets of the changed path, its parent, and (for recursive watches) its ancestors.

ACLs: as in ZooKeeper 3.9.2 and later (the fix of CVE-2024-23944), a connection
hears of an event only if it may READ the znode the event names, checked with the
ACL that znode had when the event happened (a deleted node's last ACL; the
parent's for NodeChildrenChanged) and the connection's ids at delivery. Without it
a persistent recursive watch on "/" would list every path created anywhere. A
one-shot watch whose event is withheld is spent all the same, as in ZooKeeper.
Events re-sent by setWatches on a reconnect are not filtered (ZooKeeper passes no
ACL there either): they name paths the client had already been allowed to watch.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from metastore.core.acl import ACL, Id, Perm, check
from metastore.wire.jute_defs import EventType
from metastore.core.tree import DataTree
from metastore.core.txn import CloseSession, Create, Delete, Multi, SetData


class WatchKind(enum.IntEnum):
    DATA = 1        # getData / exists (ZooKeeper keeps exists watches with data watches)
    CHILD = 2       # getChildren
    PERSISTENT = 3
    PERSISTENT_RECURSIVE = 4


def _ancestors(path: str) -> Iterator[str]:
    """"/a/b/c" -> "/a/b/c", "/a/b", "/a", "/"."""
    yield path
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        yield path


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


@dataclass(slots=True, unsafe_hash=True)
class WatchEvent:
    """A change that fires watches, with the ACLs that decide who may hear of it."""
    path: str
    type: EventType
    acl: tuple[ACL, ...]         # the node's, when the event happened
    parent_acl: tuple[ACL, ...]  # its parent's (NodeChildrenChanged names the parent)


def watch_events(tree: DataTree, body: object) -> tuple[WatchEvent, ...]:
    """The events a transaction body causes, read from `tree` BEFORE the body is applied
    (a deleted znode's ACL is gone after). A multi's ops see the ones before them: a
    node it creates has the ACL of its Create op (a multi holds no setACL)."""
    acls: dict[str, tuple[ACL, ...]] = {}

    def acl_of(path: str) -> tuple[ACL, ...]:
        if path in acls:
            return acls[path]
        node = tree.node(path)
        return () if node is None else node.acl  # () only for a body that will not apply anyway

    out: list[WatchEvent] = []
    ops = body.ops if isinstance(body, Multi) else (body,)
    if isinstance(body, CloseSession):
        ops = tuple(Delete(p) for p in sorted(body.ephemerals))
    for op in ops:
        if isinstance(op, Create):
            acls[op.path] = op.acl
            out.append(WatchEvent(op.path, EventType.NODE_CREATED, op.acl, acl_of(parent_of(op.path))))
        elif isinstance(op, Delete):
            out.append(WatchEvent(op.path, EventType.NODE_DELETED, acl_of(op.path), acl_of(parent_of(op.path))))
        elif isinstance(op, SetData):
            out.append(WatchEvent(op.path, EventType.NODE_DATA_CHANGED, acl_of(op.path), acl_of(parent_of(op.path))))
    return tuple(out)


def _no_ids(conn: int) -> Sequence[Id]:
    return ()


class WatchManager:
    """Watches by connection id. `auth_of(conn)` gives a connection's ids (its address,
    addAuth's digests, a certificate's x509 id, super) when its events are delivered."""

    def __init__(self, auth_of: Callable[[int], Sequence[Id]] = _no_ids) -> None:
        self._auth_of = auth_of
        self._by_kind: dict[WatchKind, defaultdict[str, set[int]]] = {k: defaultdict(set) for k in WatchKind}
        self._by_conn: defaultdict[int, set[tuple[WatchKind, str]]] = defaultdict(set)

    def add(self, conn: int, path: str, kind: WatchKind) -> None:
        self._by_kind[kind][path].add(conn)
        self._by_conn[conn].add((kind, path))

    def remove(self, conn: int, path: str, kind: WatchKind) -> bool:
        """Remove one watch; False if there was none."""
        watchers = self._by_kind[kind].get(path)
        if not watchers or conn not in watchers:
            return False
        self._discard(kind, path, conn)
        return True

    def has(self, conn: int, path: str, kind: WatchKind) -> bool:
        return conn in self._by_kind[kind].get(path, ())

    def drop_connection(self, conn: int) -> None:
        for kind, path in self._by_conn.pop(conn, set()):
            watchers = self._by_kind[kind].get(path)
            if watchers is not None:
                watchers.discard(conn)
                if not watchers:
                    del self._by_kind[kind][path]

    def count(self) -> int:
        return sum(len(s) for table in self._by_kind.values() for s in table.values())

    def _discard(self, kind: WatchKind, path: str, conn: int) -> None:
        watchers = self._by_kind[kind][path]
        watchers.discard(conn)
        if not watchers:
            del self._by_kind[kind][path]
        conns = self._by_conn.get(conn)
        if conns is not None:
            conns.discard((kind, path))
            if not conns:
                del self._by_conn[conn]

    def _fire_one_shot(self, kind: WatchKind, path: str) -> set[int]:
        watchers = self._by_kind[kind].pop(path, set())
        for conn in watchers:
            conns = self._by_conn.get(conn)
            if conns is not None:
                conns.discard((kind, path))
                if not conns:
                    del self._by_conn[conn]
        return watchers

    def trigger(self, path: str, event: EventType, acl: Sequence[ACL] = (),
                parent_acl: Sequence[ACL] = ()) -> list[tuple[int, EventType, str]]:
        """The notifications a change to `path` causes, one per (connection, event, path).

        Applies ZooKeeper's rules: created/deleted/data-changed fire data watches on the
        path; deleted also fires child watches on it; created/deleted fire the parent's
        child watches as NodeChildrenChanged. Persistent watches fire without being
        removed; recursive ones fire for the path and all its descendants, never for
        child-list changes. Each connection hears about one (event, path) at most once,
        and only if it may READ the node named: `acl` is the node's, `parent_acl` its
        parent's (an empty ACL allows everyone, as in `check`).
        """
        out: dict[tuple[int, EventType, str], None] = {}
        readable: dict[tuple[int, bool], bool] = {}

        def tell(conns: Iterable[int], ev: EventType, at: str) -> None:
            for c in conns:
                key = (c, at == path)
                if key not in readable:
                    readable[key] = check(acl if at == path else parent_acl, Perm.READ, self._auth_of(c))
                if readable[key]:
                    out.setdefault((c, ev, at))

        tell(self._fire_one_shot(WatchKind.DATA, path), event, path)
        if event is EventType.NODE_DELETED:
            tell(self._fire_one_shot(WatchKind.CHILD, path), event, path)
        tell(self._by_kind[WatchKind.PERSISTENT].get(path, ()), event, path)
        for ancestor in _ancestors(path):
            tell(self._by_kind[WatchKind.PERSISTENT_RECURSIVE].get(ancestor, ()), event, path)
        if event in (EventType.NODE_CREATED, EventType.NODE_DELETED) and path != "/":
            parent = parent_of(path)
            changed = EventType.NODE_CHILDREN_CHANGED
            tell(self._fire_one_shot(WatchKind.CHILD, parent), changed, parent)
            tell(self._by_kind[WatchKind.PERSISTENT].get(parent, ()), changed, parent)
        return list(out)
