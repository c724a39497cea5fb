"""Watches, as ZooKeeper defines them: one-shot data, exists and child watches, and
persistent (optionally recursive) watches added with addWatch.

Pure: connections are opaque integer ids; `trigger` returns who must be told what.
Watches live on the node that holds the client's connection (as in ZooKeeper);
a client that moves to another node re-registers them with setWatches.

Memory: a watch is one id in a set keyed by path and one (kind, path) entry in its
connection's set: about WATCH_BYTES (measured with tracemalloc on CPython 3.11) plus
its path's own string, which a watch of any length may bring. Nothing in the protocol
bounds how many watches a client sets (an exists watch needs no znode), so the manager
counts each watch as `watch_cost(path)` and refuses one that would take its connection
past `WatchLimits.per_connection_bytes` or the node past `total_bytes`
(WatchLimitExceeded; docs/operations.md, "Memory bounds"). A trigger touches only the
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
from metastore.core import paths
from metastore.core.txn import CloseSession, Create, Delete, Multi, Reconfig, SetData


WATCH_BYTES = 450  # one watch's set slots, tuple and ids beside its path (tracemalloc: 340 to 400)


def watch_cost(path: str) -> int:
    """The bytes one watch on `path` is counted as: WATCH_BYTES plus the path's UTF-8 bytes."""
    return WATCH_BYTES + len(path.encode())


@dataclass(frozen=True, slots=True)
class WatchLimits:
    """The bytes of watches one connection, and all connections of a node, may hold (each watch
    counted as `watch_cost`): `max_watch_bytes_per_connection` and `max_watch_bytes` in cluster.toml."""

    per_connection_bytes: int = 64 << 20  # about 140,000 watches of 30-byte paths
    total_bytes: int = 512 << 20  # about 1.1 million


class WatchLimitExceeded(Exception):
    """A new watch would take its connection or the node past its WatchLimits; nothing was added.
    `setting` names the cluster.toml key of the bound that was hit."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


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
        elif isinstance(op, Reconfig):  # /zookeeper/config's data changes on every node
            out.append(WatchEvent(paths.CONFIG, EventType.NODE_DATA_CHANGED, acl_of(paths.CONFIG),
                                  acl_of(paths.ZOOKEEPER)))
    return tuple(out)


def _no_ids(conn: int) -> Sequence[Id]:
    return ()


class WatchManager:
    """Watches by connection id. `auth_of(conn)` gives a connection's ids (its address,
    addAuth's digests, a certificate's x509 id, super) when its events are delivered."""

    def __init__(self, auth_of: Callable[[int], Sequence[Id]] = _no_ids, limits: WatchLimits = WatchLimits()) -> None:
        self._auth_of = auth_of
        self.limits = limits
        self._by_kind: dict[WatchKind, defaultdict[str, set[int]]] = {k: defaultdict(set) for k in WatchKind}
        self._by_conn: defaultdict[int, set[tuple[WatchKind, str]]] = defaultdict(set)
        self._bytes_by_conn: dict[int, int] = {}  # watch_cost of each connection's watches
        self.total_bytes = 0  # of every connection's
        self.refused = 0  # watches refused at a bound

    def add(self, conn: int, path: str, kind: WatchKind) -> None:
        """Set a watch (setting one it holds already costs nothing); WatchLimitExceeded at a bound."""
        self.add_many(conn, ((path, kind),))

    def add_many(self, conn: int, watches: Iterable[tuple[str, WatchKind]]) -> None:
        """Set every watch, or none if together they would pass a bound (WatchLimitExceeded)."""
        held = self._by_conn.get(conn, ())
        new = {(kind, path): None for path, kind in watches if (kind, path) not in held}
        cost = sum(watch_cost(path) for _, path in new)
        self._admit(conn, len(new), cost)
        for kind, path in new:
            self._by_kind[kind][path].add(conn)
            self._by_conn[conn].add((kind, path))
        if new:
            self._bytes_by_conn[conn] = self._bytes_by_conn.get(conn, 0) + cost
            self.total_bytes += cost

    def _admit(self, conn: int, count: int, cost: int) -> None:
        mine = self._bytes_by_conn.get(conn, 0)
        for held, limit, setting, whose in (
                (mine, self.limits.per_connection_bytes, "max_watch_bytes_per_connection", "this connection"),
                (self.total_bytes, self.limits.total_bytes, "max_watch_bytes", "this node's connections")):
            if count and held + cost > limit:
                self.refused += count
                raise WatchLimitExceeded(
                    f"{count} watch(es) of {cost} bytes would take {whose} past {setting} ({limit} bytes; "
                    f"{held} held, each watch counted as {WATCH_BYTES} + its path's bytes): remove watches "
                    "first (removeWatches, or let one-shot watches fire)", setting)

    def bytes_of(self, conn: int) -> int:
        """The bytes of watches `conn` holds, as the limits count them."""
        return self._bytes_by_conn.get(conn, 0)

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
        self.total_bytes -= self._bytes_by_conn.pop(conn, 0)
        for kind, path in self._by_conn.pop(conn, set()):
            watchers = self._by_kind[kind].get(path)
            if watchers is not None:
                watchers.discard(conn)
                if not watchers:
                    del self._by_kind[kind][path]

    def count(self) -> int:
        return sum(len(s) for table in self._by_kind.values() for s in table.values())

    def summary(self) -> dict[str, int]:
        """ZooKeeper's wchs: connections holding watches, distinct paths watched, watches."""
        paths = set()
        for table in self._by_kind.values():
            paths.update(table)
        return {"connections": len(self._by_conn), "paths": len(paths), "watches": self.count()}

    def _discard(self, kind: WatchKind, path: str, conn: int) -> None:
        watchers = self._by_kind[kind][path]
        watchers.discard(conn)
        if not watchers:
            del self._by_kind[kind][path]
        self._forget(conn, kind, path)

    def _forget(self, conn: int, kind: WatchKind, path: str) -> None:
        """Drop (kind, path) from `conn`'s own set, and its cost from the counts."""
        conns = self._by_conn.get(conn)
        if conns is None or (kind, path) not in conns:
            return
        conns.discard((kind, path))
        cost = watch_cost(path)
        self._bytes_by_conn[conn] -= cost
        self.total_bytes -= cost
        if not conns:
            del self._by_conn[conn]
            del self._bytes_by_conn[conn]

    def _fire_one_shot(self, kind: WatchKind, path: str) -> set[int]:
        watchers = self._by_kind[kind].pop(path, set())
        for conn in watchers:
            self._forget(conn, kind, path)
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
