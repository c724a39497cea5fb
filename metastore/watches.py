"""Watches, as ZooKeeper defines them: one-shot data, exists and child watches, and
persistent (optionally recursive) watches added with addWatch.

Pure: connections are opaque integer ids; `trigger` returns who must be told what.
Watches live on the node that holds the client's connection (as in ZooKeeper);
a client that moves to another node re-registers them with setWatches.

Memory: a watch is one id in a set keyed by path; there is no object per watch,
so millions of watches cost a few dozen bytes each. A trigger touches only the
sets of the changed path, its parent, and (for recursive watches) its ancestors.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Iterator

from metastore.jute_defs import EventType


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


class WatchManager:
    def __init__(self) -> None:
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

    def trigger(self, path: str, event: EventType) -> list[tuple[int, EventType, str]]:
        """The notifications a change to `path` causes, one per (connection, event, path).

        Applies ZooKeeper's rules: created/deleted/data-changed fire data watches on the
        path; deleted also fires child watches on it; created/deleted fire the parent's
        child watches as NodeChildrenChanged. Persistent watches fire without being
        removed; recursive ones fire for the path and all its descendants, never for
        child-list changes. Each connection hears about one (event, path) at most once.
        """
        out: dict[tuple[int, EventType, str], None] = {}

        def tell(conns: Iterable[int], ev: EventType, at: str) -> None:
            for c in conns:
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
