"""The pure parts of the metastore client: states, watches, outstanding requests, backoff.

No sockets, no clock, no trio (STYLE.md habit 1): metastore/client/__init__.py is the
trio driver that feeds these with replies and notifications and turns their
answers into I/O. Randomness (host order, backoff jitter) comes from a
`random.Random` the caller passes in (habit 3).

The rules implemented here are those of ZooKeeper's Java client
(`ClientCnxn`, `ZKWatchManager`):

- Replies to ordinary requests arrive in the order the requests were sent;
  a reply whose xid is not the oldest outstanding one is a protocol violation.
- A one-shot watch is registered on the client only once the reply that set
  it has arrived (`exists` on a missing node sets an *exist* watch, on an
  existing node a *data* watch, as ExistsWatchRegistration does).
- On reconnect the client re-registers every watch it holds with
  SetWatches2, relative to the last zxid it has seen, and the server fires
  at once those that a change after that zxid has already triggered.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from metastore.errors import MetastoreError
from metastore.wire.jute_defs import EventType
from metastore.wire.jute_records import SetWatches2

# --- connection states ---------------------------------------------------------------


class State(enum.Enum):
    """The client's view of its session (kazoo's KazooState, plus CONNECTING)."""

    CONNECTING = "connecting"  # start() has not established the session yet
    CONNECTED = "connected"    # a server holds our session and answers us
    SUSPENDED = "suspended"    # the connection broke; the session may live on: trying the servers
    LOST = "lost"              # the session is over (expired, closed, auth failed): terminal


# Every legal transition (h11's habit: the rules are data). Anything else is a bug.
TRANSITIONS: frozenset[tuple[State, State]] = frozenset({
    (State.CONNECTING, State.CONNECTED), (State.CONNECTING, State.LOST),
    (State.CONNECTED, State.SUSPENDED), (State.CONNECTED, State.LOST),
    (State.SUSPENDED, State.CONNECTED), (State.SUSPENDED, State.LOST),
})


def check_transition(old: State, new: State) -> None:
    assert (old, new) in TRANSITIONS, f"illegal client state transition {old.name} -> {new.name}"


# --- versions ----------------------------------------------------------------------


class AnyVersion(enum.Enum):
    """The type of ANY_VERSION (STYLE.md habit 5): "whatever the version is"."""

    ANY = "any"

    def __repr__(self) -> str:
        return "ANY_VERSION"


ANY_VERSION = AnyVersion.ANY
Version = int | AnyVersion


def wire_version(version: Version) -> int:
    """The version as the wire carries it: -1 for ANY_VERSION."""
    if version is ANY_VERSION:
        return -1
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a version is an int >= 0 or ANY_VERSION, got {version!r}")
    return version


# --- watches -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A znode event, as the server reported it."""

    type: EventType
    path: str


class WatchKind(enum.Enum):
    """The client's watch tables (ZKWatchManager's). EXIST is kept apart from DATA because
    SetWatches2 carries them apart: a missing node under a data watch fires NodeDeleted,
    an existing node under an exist watch fires NodeCreated."""

    DATA = "data"
    EXIST = "exist"
    CHILD = "child"
    PERSISTENT = "persistent"
    PERSISTENT_RECURSIVE = "persistent_recursive"


ONE_SHOT = (WatchKind.DATA, WatchKind.EXIST, WatchKind.CHILD)

# Which one-shot tables an event empties for its path (ZKWatchManager.materialize).
_ONE_SHOT_FIRED: dict[EventType, tuple[WatchKind, ...]] = {
    EventType.NODE_CREATED: (WatchKind.DATA, WatchKind.EXIST),
    EventType.NODE_DATA_CHANGED: (WatchKind.DATA, WatchKind.EXIST),
    EventType.NODE_DELETED: (WatchKind.DATA, WatchKind.EXIST, WatchKind.CHILD),
    EventType.NODE_CHILDREN_CHANGED: (WatchKind.CHILD,),
}

S = TypeVar("S")  # a sink: whatever the driver delivers events to


def ancestors(path: str) -> Iterator[str]:
    """"/a/b" -> "/a/b", "/a", "/"."""
    yield path
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        yield path


class WatchTable(Generic[S]):
    """The watches a session holds, by kind and path; each path keeps its sinks in
    registration order. Sinks are opaque to this class."""

    def __init__(self) -> None:
        self._tables: dict[WatchKind, dict[str, list[S]]] = {k: {} for k in WatchKind}

    def add(self, kind: WatchKind, path: str, sink: S) -> None:
        sinks = self._tables[kind].setdefault(path, [])
        if sink not in sinks:
            sinks.append(sink)

    def discard(self, kind: WatchKind, path: str, sink: S) -> bool:
        """Forget one registration; True if it was the last sink on (kind, path)."""
        sinks = self._tables[kind].get(path)
        if not sinks or sink not in sinks:
            return False
        sinks.remove(sink)
        if not sinks:
            del self._tables[kind][path]
            return True
        return False

    def targets(self, event: WatchEvent) -> list[S]:
        """The sinks an event goes to, each once, in a stable order; one-shot watches it
        fires are removed. Persistent watches hear every event on their path
        (children changes included); recursive ones every event on their path or
        below, except children changes (ZooKeeper's rules)."""
        out: dict[int, S] = {}

        def take(sinks: Iterable[S]) -> None:
            for s in sinks:
                out.setdefault(id(s), s)

        for kind in _ONE_SHOT_FIRED.get(event.type, ()):
            take(self._tables[kind].pop(event.path, ()))
        take(self._tables[WatchKind.PERSISTENT].get(event.path, ()))
        if event.type != EventType.NODE_CHILDREN_CHANGED:
            recursive = self._tables[WatchKind.PERSISTENT_RECURSIVE]
            for at in ancestors(event.path):
                take(recursive.get(at, ()))
        return list(out.values())

    def paths(self, kind: WatchKind) -> tuple[str, ...]:
        return tuple(self._tables[kind])

    def clear(self) -> list[S]:
        """Forget everything; every sink, each once (the session is over)."""
        out: dict[int, S] = {}
        for table in self._tables.values():
            for sinks in table.values():
                for s in sinks:
                    out.setdefault(id(s), s)
            table.clear()
        return list(out.values())

    def __len__(self) -> int:
        return sum(len(sinks) for table in self._tables.values() for sinks in table.values())

    def set_watches(self, relative_zxid: int, max_path_bytes: int = 128 << 10) -> list[SetWatches2]:
        """The SetWatches2 requests that re-register every watch after a reconnect, each
        naming at most about max_path_bytes of paths (ClientCnxn splits them the same way,
        so that no frame outgrows jute.maxbuffer)."""
        kinds = (WatchKind.DATA, WatchKind.EXIST, WatchKind.CHILD, WatchKind.PERSISTENT,
                 WatchKind.PERSISTENT_RECURSIVE)
        batches: list[SetWatches2] = []
        current: dict[WatchKind, list[str]] = {k: [] for k in kinds}
        size = 0
        for kind in kinds:
            for path in self._tables[kind]:
                if size and size + len(path) + 4 > max_path_bytes:
                    batches.append(_set_watches2(relative_zxid, current))
                    current, size = {k: [] for k in kinds}, 0
                current[kind].append(path)
                size += len(path.encode()) + 4
        if size:
            batches.append(_set_watches2(relative_zxid, current))
        return batches


def _set_watches2(relative_zxid: int, paths: dict[WatchKind, list[str]]) -> SetWatches2:
    return SetWatches2(relative_zxid, tuple(paths[WatchKind.DATA]), tuple(paths[WatchKind.EXIST]),
                       tuple(paths[WatchKind.CHILD]), tuple(paths[WatchKind.PERSISTENT]),
                       tuple(paths[WatchKind.PERSISTENT_RECURSIVE]))


# --- requests in flight ------------------------------------------------------------


class ProtocolViolation(MetastoreError):
    """The server broke the client protocol (a reply out of order, a malformed frame):
    the driver drops the connection, as after any I/O error."""


T = TypeVar("T")


@dataclass(slots=True)
class Outstanding(Generic[T]):
    """A request on the wire, waiting for its reply."""

    xid: int
    opcode: int
    call: T


class Pipeline(Generic[T]):
    """The requests one connection has in flight, oldest first. The server answers them
    in order, so a reply must be for the oldest one."""

    def __init__(self) -> None:
        self._queue: deque[Outstanding[T]] = deque()

    def push(self, xid: int, opcode: int, call: T) -> None:
        self._queue.append(Outstanding(xid, opcode, call))

    def pop_reply(self, xid: int) -> Outstanding[T]:
        if not self._queue:
            raise ProtocolViolation(f"reply with xid {xid} while no request is outstanding")
        head = self._queue[0]
        if head.xid != xid:
            raise ProtocolViolation(f"reply with xid {xid}, but the oldest request outstanding has xid {head.xid}")
        return self._queue.popleft()

    def drain(self) -> list[Outstanding[T]]:
        out = list(self._queue)
        self._queue.clear()
        return out

    def __len__(self) -> int:
        return len(self._queue)


class Xids:
    """Ordinary request xids: 1, 2, ... wrapping before 2**31 (negative xids are special)."""

    def __init__(self) -> None:
        self._next = 1

    def next(self) -> int:
        xid = self._next
        self._next = 1 if xid >= 0x7FFF_FFFF else xid + 1
        return xid


# --- reconnecting --------------------------------------------------------------------


class HostRing:
    """The servers in a shuffled order (as ZooKeeper's StaticHostProvider), tried in turn."""

    def __init__(self, hosts: Sequence[tuple[str, int]], rng: random.Random) -> None:
        if not hosts:
            raise ValueError("a metastore client needs at least one (host, port)")
        self._hosts = list(hosts)
        rng.shuffle(self._hosts)
        self._index = -1

    def next(self) -> tuple[str, int]:
        self._index = (self._index + 1) % len(self._hosts)
        return self._hosts[self._index]

    def __len__(self) -> int:
        return len(self._hosts)


class Backoff:
    """Bounded, jittered exponential backoff: delays in [d/2, d] with d doubling from
    min_s up to max_s; reset() after a success."""

    def __init__(self, rng: random.Random, min_s: float, max_s: float) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"backoff needs 0 < min_s <= max_s, got {min_s}, {max_s}")
        self._rng, self._min_s, self._max_s = rng, min_s, max_s
        self._current = min_s

    def next_delay_s(self) -> float:
        delay = self._current * self._rng.uniform(0.5, 1.0)
        self._current = min(self._current * 2, self._max_s)
        return delay

    def reset(self) -> None:
        self._current = self._min_s
