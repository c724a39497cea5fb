"""The client port's session handshake (trio edge): from a ConnectRequest to its ConnectResponse.

A new session is created through Zab (CREATE_SESSION) and given the password derived from the
cluster secret; a returning one is checked against the tree (after catching up with the leader
when this node may lag behind its creation, as ZooKeeper's followers ask the leader) and claimed
(CLAIM_SESSION: its old node's connection then gets SessionMoved).

Read-only mode (ZooKeeper's readonlymode.enabled; `read_only_mode` in cluster.toml, off by
default as in ZooKeeper): a node without an established leader serves the clients that asked for
it (the ConnectRequest's canBeReadOnly). A new session is local to this node: it cannot be
replicated, nothing commits. A returning one is checked against this node's tree, without a claim.
The ConnectResponse says read-only; writes and syncs get NotReadOnly (service.py). Once the node
is back under a leader it closes its read-only connections, and their clients reconnect read-write
(kazoo looks for a read-write server with `isro` meanwhile). As in ZooKeeper, a session created
read-only is unknown to the quorum: presented to a read-write node it has expired, and the client
starts a new one.
"""

from __future__ import annotations

import hmac
import logging
import struct
import time
from typing import TYPE_CHECKING

from metastore.core import cluster_secret as CS
from metastore.edge.client_conn import Connection
from metastore.edge.edge_guard import check_connect
from metastore.wire import envelope as E
from metastore.wire import jute
from zab.errors import NoLeader, OutcomeUnknown

if TYPE_CHECKING:
    from metastore.edge.service import MetastoreService

log = logging.getLogger("quire.metastore")

_EXPIRED = jute.ConnectResponse(0, 0, 0, b"\0" * 16, False)


def now_ms() -> int:
    """Wall-clock time, as envelopes carry it and znode times are (ZooKeeper's currentWallTime)."""
    return int(time.time() * 1000)


class SessionHandshake:
    """`connect(conn, payload)`: True once the connection serves a session, False to close it."""

    def __init__(self, service: MetastoreService) -> None:
        self.service = service
        cfg = service.cfg
        # The node id in the top 16 bits (edge_guard.is_session_id), then the start time: ids
        # issued before a restart are not issued again.
        self._next_session = (cfg.node_id << 48) | ((int(time.time() * 1000) << 8) & 0xFFFF_FFFF_FFFF)
        # Sessions in the tree, kept by sessions_changed; None: count the tree again when needed.
        self._sessions: int | None = None

    def sessions_changed(self, delta: int | None) -> None:
        """A delivery created (1) or closed (-1) a session; None: the tree may have been replaced
        (a role change: a SNAP may follow), so the next new session counts it again."""
        self._sessions = None if delta is None or self._sessions is None else self._sessions + delta

    def _room_for_a_session(self, conn: Connection) -> bool:
        """max_sessions: the tree holds fewer sessions than the bound (each costs every node memory
        until it expires, and a client can open them faster than they expire)."""
        s = self.service
        if self._sessions is None:
            self._sessions = len(s.sm.tree.sessions())  # O(sessions), once per role change
        if self._sessions < s.cfg.limits.max_sessions:
            return True
        s.stats["sessions_refused"] += 1
        log.info("event=session_refused conn=%s peer=%s sessions=%d max_sessions=%d: the connection is closed; "
                 "close unused sessions or raise max_sessions", conn.id, conn.peer, self._sessions,
                 s.cfg.limits.max_sessions)
        return False

    async def connect(self, conn: Connection, payload: bytes) -> bool:
        s = self.service
        req = jute.decode_connect_request(payload, s.cfg.limits.jute_max_buffer_bytes)
        check_connect(req)
        if not s.broadcasting:
            if s.cfg.read_only_mode and req.read_only:
                return self._connect_read_only(conn, req)
            return False  # no quorum here: the client tries another server
        if not await self._has_secret():
            log.info("event=client_deferred conn=%s reason=no_cluster_secret_yet", conn.id)
            return False
        if req.last_zxid_seen > s.sm.last_zxid:
            log.info("event=client_ahead session=%#x client_zxid=%#x our_zxid=%#x", req.session_id,
                     req.last_zxid_seen, s.sm.last_zxid)
            return False  # we are behind what the client has seen: it must pick another server
        if req.session_id == 0:
            if not self._room_for_a_session(conn):
                return False
            session_id, timeout = await self._create_session(req.time_out)
            if session_id == 0:
                return False
        else:
            session_id = req.session_id
            timeout = s.sm.tree.session_timeout(session_id) or 0
            if timeout == 0:
                # We may just lag behind the session's creation: catch up with the leader first.
                try:
                    await s.driver.sync(session_id, s.next_cxid())
                except (NoLeader, OutcomeUnknown):
                    return False
                timeout = s.sm.tree.session_timeout(session_id) or 0
            if timeout == 0 or not hmac.compare_digest(req.passwd, self.password(session_id)):
                conn.send(jute.encode_connect_response(_EXPIRED))
                return False
            if not await self._claim(session_id):
                return False
        self._accept(conn, session_id, timeout, read_only=False)
        return True

    def _connect_read_only(self, conn: Connection, req: jute.ConnectRequest) -> bool:
        s = self.service
        if CS.read_secret(s.sm.tree) is None or req.last_zxid_seen > s.sm.last_zxid:
            return False  # no password to give (this node never saw a leader), or behind the client
        if req.session_id == 0:
            self._next_session += 1
            session_id, timeout = self._next_session, self._negotiate(req.time_out)
        else:
            session_id, timeout = req.session_id, s.sm.tree.session_timeout(req.session_id) or 0
            if timeout == 0 or not hmac.compare_digest(req.passwd, self.password(session_id)):
                conn.send(jute.encode_connect_response(_EXPIRED))
                return False
        conn.read_only = True
        self._accept(conn, session_id, timeout, read_only=True)
        log.info("event=read_only_session conn=%s session=%#x", conn.id, session_id)
        return True

    def _accept(self, conn: Connection, session_id: int, timeout: int, *, read_only: bool) -> None:
        s = self.service
        old = s.by_session.get(session_id)
        if old is not None and old is not conn:
            old.close()  # the client moved here: its old connection must not act for it any more
        conn.session_id = session_id
        s.by_session[session_id] = conn
        s.expiry.touched((session_id,))
        conn.send(jute.encode_connect_response(
            jute.ConnectResponse(0, timeout, session_id, self.password(session_id), read_only)))

    def password(self, session_id: int) -> bytes:
        secret = CS.read_secret(self.service.sm.tree)
        assert secret is not None, "sessions are served only once the cluster secret is here (connect)"
        return CS.session_password(secret, self.service.cfg.session_secret, session_id)

    async def _has_secret(self) -> bool:
        """Whether the cluster secret is here, after catching up with the leader if needed
        (the first leader commits it right after it is elected)."""
        s = self.service
        if CS.read_secret(s.sm.tree) is None:
            try:
                await s.driver.sync(0, s.next_cxid())
            except (NoLeader, OutcomeUnknown):
                return False
        return CS.read_secret(s.sm.tree) is not None

    def _negotiate(self, requested_ms: int) -> int:
        cfg = self.service.cfg
        return max(cfg.min_session_timeout_ms, min(cfg.max_session_timeout_ms, requested_ms))

    async def _claim(self, session_id: int) -> bool:
        """Tell the leader the session's client is now here: later requests from its old
        node's connection get SessionMoved."""
        s = self.service
        env = E.Envelope(E.CLAIM_SESSION, s.cfg.node_id, now_ms(), (), b"")
        try:
            await s.driver.submit(session_id, s.next_cxid(), E.encode_envelope(env))
        except (NoLeader, OutcomeUnknown):
            return False
        return True

    async def _create_session(self, requested_ms: int) -> tuple[int, int]:
        s = self.service
        self._next_session += 1
        session_id, timeout = self._next_session, self._negotiate(requested_ms)
        env = E.Envelope(E.CREATE_SESSION, s.cfg.node_id, now_ms(), (), struct.pack(">i", timeout))
        try:
            await s.driver.submit(session_id, s.next_cxid(), E.encode_envelope(env))
        except (NoLeader, OutcomeUnknown):
            return 0, 0
        return session_id, timeout
