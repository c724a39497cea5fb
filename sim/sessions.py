"""Session expiry in the simulator: each node's `SessionExpiry`, driven as the daemon drives it.

The real service (metastore/edge/service.py, MetastoreService) listens to its driver: RoleChanged
-> `stopped`; a delivered SessionCreated / SessionClosed -> `created` / `closed`; SessionsTouched
-> `touched`; LeaderTicked -> `ticked`, and each session that returns is closed by a CLOSE_SESSION
envelope from HOUSEKEEPING submitted at that node (`_submit_internal`). `SimSessions` does the
same for every node of a sim.cluster.SimCluster built with `expire_sessions=True`, on the core's
ticks, so expiry is decided in simulated ms exactly as a node decides it. A restarted node is a
new process with a fresh SessionExpiry. Clients' activity reaches it as the service reports it:
`SimCluster.touch(node, ...)` is `driver.touch`, the core event TouchSessions.

The requests a test needs to own sessions and ephemerals are here too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.prep import HOUSEKEEPING
from metastore.core.sessions import SessionExpiry
from metastore.core.state_machine import Applied
from metastore.core.txn import SessionClosed, SessionCreated
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.wire.jute_defs import CreateMode, OpCode
from sim.client_ops import client_request, path_of


def create_session_request(timeout_ms: int, *, origin: int, time_ms: int = 0) -> bytes:
    """The CREATE_SESSION envelope a node hands Zab for a client that connected to it (the
    timeout already negotiated); submit it under the new session's id."""
    return E.encode_envelope(E.Envelope(E.CREATE_SESSION, origin, time_ms, (), struct.pack(">i", timeout_ms)))


def create_ephemeral_request(key: str, value: str = "", *, origin: int, time_ms: int = 0) -> bytes:
    """A client's create of the ephemeral znode `path_of(key)`, owned by the session it is
    submitted under (which must be on `origin`, or the leader refuses it: SessionMoved)."""
    body = jute.CreateRequest(path_of(key), value.encode(), OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL)
    return client_request(OpCode.CREATE, body, origin, time_ms)


def close_session_request(time_ms: int = 0) -> bytes:
    """The leader's own closeSession of an expired session (submitted under that session)."""
    return E.encode_envelope(E.Envelope(E.CLOSE_SESSION, HOUSEKEEPING, time_ms, (), b""))


@dataclass(frozen=True, slots=True)
class Expiration:
    """Node `node`, leading, found `session_id` expired at simulated ms `at` and submitted its close."""
    at: int
    node: int
    session_id: int


class SimSessions:
    """Every node's SessionExpiry. `submit(node, request, session_id)` hands a request to a node
    (SimCluster.submit); `now()` is the simulated clock, used only to stamp `expirations`."""

    def __init__(self, submit: Callable[[int, bytes, int], object], now: Callable[[], int], tick_ms: int) -> None:
        self._submit = submit
        self._now = now
        self._tick_ms = tick_ms
        self.expiry: dict[int, SessionExpiry] = {}
        self.expirations: list[Expiration] = []

    def restarted(self, node: int) -> None:
        self.expiry[node] = SessionExpiry(self._tick_ms)

    def role_changed(self, node: int) -> None:
        self.expiry[node].stopped()

    def delivered(self, node: int, applied: object) -> None:
        if not isinstance(applied, Applied):
            return
        result = applied.result
        if isinstance(result, SessionCreated):  # opened through any node: the leader tracks it
            self.expiry[node].created(result.session_id, result.timeout_ms)
        elif isinstance(result, SessionClosed):
            self.expiry[node].closed(result.session_id)

    def touched(self, node: int, session_ids: tuple[int, ...]) -> None:
        self.expiry[node].touched(session_ids)

    def leader_ticked(self, node: int, now_ms: int, sessions: Callable[[], dict[int, int]]) -> None:
        """The established leader `node` ticked: close the sessions whose deadline it passed
        (one whose close does not commit is expired again after its timeout)."""
        for session_id in self.expiry[node].ticked(now_ms, sessions):
            at = self._now()
            self.expirations.append(Expiration(at, node, session_id))
            self._submit(node, close_session_request(at), session_id)
