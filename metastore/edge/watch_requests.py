"""The client port's watch requests (setWatches, addWatch, removeWatches, checkWatches), on the
node's WatchManager (metastore/core/watches.py). Pure: the service (metastore/edge/service.py)
calls these from its request jobs and sends what they return.

Every way a client adds watches passes the manager's memory bounds (WatchLimits): a watch that
would pass one is refused whole, never half set. What the service answers then is its own:
QUOTA_EXCEEDED to a read or addWatch (the client learns its watch was not set), a closed
connection to a setWatches (ZooKeeper's clients do not read its answer, so an error there would
leave them believing their watches were set; reconnecting, they re-send them, to a node with room).
"""

from __future__ import annotations

from metastore.core.tree import DataTree
from metastore.core.responses import WATCH_KINDS_FOR_TYPE
from metastore.core.watches import WatchKind, WatchManager
from metastore.wire.jute_defs import Err, EventType, OpCode


def set_watches(watches: WatchManager, tree: DataTree, conn_id: int, req) -> list[tuple[EventType, str]]:
    """Re-register a reconnecting client's watches, ZooKeeper's rules: a watch whose znode changed
    after `relative_zxid` (or vanished, or appeared) is not set but fires at once. Returns those
    events, in order; raises WatchLimitExceeded, setting none, if the rest would pass a bound."""
    rel = req.relative_zxid
    events: list[tuple[EventType, str]] = []
    adds: list[tuple[str, WatchKind]] = []
    for paths, kind, changed_since, changed in (
            (req.data_watches, WatchKind.DATA, lambda s: s.mzxid, EventType.NODE_DATA_CHANGED),
            (req.child_watches, WatchKind.CHILD, lambda s: s.pzxid, EventType.NODE_CHILDREN_CHANGED)):
        for path in paths:
            stat = tree.exists(path)
            if stat is None:
                events.append((EventType.NODE_DELETED, path))
            elif changed_since(stat) > rel:
                events.append((changed, path))
            else:
                adds.append((path, kind))
    for path in req.exist_watches:
        if tree.exists(path) is not None:
            events.append((EventType.NODE_CREATED, path))
        else:
            adds.append((path, WatchKind.DATA))
    adds += [(path, WatchKind.PERSISTENT) for path in getattr(req, "persistent_watches", ())]
    adds += [(path, WatchKind.PERSISTENT_RECURSIVE) for path in getattr(req, "persistent_recursive_watches", ())]
    watches.add_many(conn_id, adds)
    return events


def watch_request(watches: WatchManager, conn_id: int, op: int, body) -> int:
    """addWatch, removeWatches or checkWatches: the error code to answer (0 for done, NO_WATCHER
    for nothing to remove or check); addWatch raises WatchLimitExceeded at a bound."""
    if op == OpCode.ADD_WATCH:
        kind = WatchKind.PERSISTENT_RECURSIVE if body.mode == 1 else WatchKind.PERSISTENT
        watches.add(conn_id, body.path, kind)
        return 0
    kinds = WATCH_KINDS_FOR_TYPE.get(body.type, ())
    if op == OpCode.CHECK_WATCHES:
        found = any(watches.has(conn_id, body.path, k) for k in kinds)
    else:
        found = any([watches.remove(conn_id, body.path, k) for k in kinds])
    return 0 if found else Err.NO_WATCHER
