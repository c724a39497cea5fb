"""Session expiry, decided by the leader (pure: time is an input, in milliseconds).

Every node reports the sessions its clients used (pings, requests) to the leader;
the leader keeps one deadline per session and, when it passes, submits a
closeSession transaction that deletes the session's ephemerals everywhere. A new
leader gives every known session a full timeout from the moment it took over, as
ZooKeeper does: nobody can prove a session idle across a leader change.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class SessionTracker:
    """Session deadlines in buckets, as ZooKeeper's ExpiryQueue keeps them: each session sits in the
    bucket of its deadline, and the heap holds each bucket's deadline once. A touch moves a session
    between buckets, so memory stays one entry per session however often clients are heard of (a
    heap entry per touch held sessions x timeout / tick entries: 600 per session with 30 s and 50 ms)."""

    def __init__(self) -> None:
        self._timeout_ms: dict[int, int] = {}
        self._deadline_ms: dict[int, int] = {}
        self._buckets: dict[int, set[int]] = {}  # deadline -> the sessions due then
        self._heap: list[int] = []  # the buckets' deadlines, each once

    def __len__(self) -> int:
        return len(self._timeout_ms)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._timeout_ms

    def add(self, session_id: int, timeout_ms: int, now_ms: int) -> None:
        self._timeout_ms[session_id] = timeout_ms
        self.touch(session_id, now_ms)

    def reset(self, sessions: dict[int, int], now_ms: int) -> None:
        """Leadership began: every session in the replicated state gets a full timeout."""
        self._timeout_ms, self._deadline_ms, self._buckets, self._heap = {}, {}, {}, []
        for session_id, timeout_ms in sessions.items():
            self.add(session_id, timeout_ms, now_ms)

    def touch(self, session_id: int, now_ms: int) -> None:
        timeout = self._timeout_ms.get(session_id)
        if timeout is None:
            return
        deadline = now_ms + timeout
        if deadline > self._deadline_ms.get(session_id, -1):
            self._unfile(session_id)
            self._file(session_id, deadline)

    def _file(self, session_id: int, deadline: int) -> None:
        self._deadline_ms[session_id] = deadline
        bucket = self._buckets.get(deadline)
        if bucket is None:
            bucket = self._buckets[deadline] = set()
            heapq.heappush(self._heap, deadline)
        bucket.add(session_id)

    def _unfile(self, session_id: int) -> None:
        # An emptied bucket stays (its deadline is in the heap) until expired() reaches it.
        bucket = self._buckets.get(self._deadline_ms.pop(session_id, -1))
        if bucket is not None:
            bucket.discard(session_id)

    def remove(self, session_id: int) -> None:
        self._timeout_ms.pop(session_id, None)
        self._unfile(session_id)

    def expired(self, now_ms: int) -> list[int]:
        """Sessions whose deadline has passed; they stay tracked until `remove`d (their
        closeSession commits), so a failed submission is retried on the next call."""
        out = []
        while self._heap and self._heap[0] <= now_ms:
            for session_id in sorted(self._buckets.pop(heapq.heappop(self._heap), ())):
                out.append(session_id)
                del self._deadline_ms[session_id]
                self._file(session_id, now_ms + self._timeout_ms[session_id])
        return out

    def deadline(self, session_id: int) -> int | None:
        return self._deadline_ms.get(session_id)


class SessionExpiry:
    """The leader's session expiry on the leader's own clock: the Zab core's ticks (LeaderTicked),
    not the wall clock nor the process's, so the simulator decides it exactly as a node does.

    `ticked` with each established leader's tick returns the sessions to close; `stopped` when the
    role changes. The first tick of a leadership gives every session of the tree a full timeout
    (SessionTracker.reset). A creation or touch between two ticks counts at the next tick's time:
    deadlines are rounded up to tick-sized steps, as ZooKeeper's ExpiryQueue rounds them, so a
    session never expires before its timeout has passed since it was last heard of."""

    def __init__(self, tick_ms: int) -> None:
        self.tracker = SessionTracker()
        self.tracking = False
        self.now_ms = 0
        self._tick_ms = tick_ms

    def stopped(self) -> None:
        self.tracking = False

    def ticked(self, now_ms: int, sessions: Callable[[], dict[int, int]]) -> list[int]:
        """`sessions()`: the tree's sessions and their timeouts, read only when tracking begins."""
        self.now_ms = now_ms
        if not self.tracking:
            self.tracker.reset(sessions(), now_ms)
            self.tracking = True
        return self.tracker.expired(now_ms)

    def created(self, session_id: int, timeout_ms: int) -> None:
        if self.tracking:  # else the first tick's reset finds it in the tree
            self.tracker.add(session_id, timeout_ms, self.now_ms + self._tick_ms)

    def closed(self, session_id: int) -> None:
        self.tracker.remove(session_id)

    def touched(self, session_ids: Iterable[int]) -> None:
        for session_id in session_ids:
            self.tracker.touch(session_id, self.now_ms + self._tick_ms)
