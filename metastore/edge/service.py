"""The client port (trio edge): ZooKeeper's client protocol over TCP, sessions,
watches, and the leader's session expiry.

Each connection's requests are answered in the order sent (ZooKeeper's FIFO
client order); writes are handed to Zab as they arrive, so a client can
pipeline them. A connection's requests wait in a queue; the head is answered
as soon as its outcome is known (a read at once, a write when the driver
settles it, from the driver's own pass), so a write's reply costs no task switch. Reads are served from this node's tree. Watch notifications for
a transaction are queued before the reply to any request that could see its
effect: the driver tells the service of each delivery inline (PeerDriver.listen),
before any other task can read the tree.
"""

from __future__ import annotations

import secrets
import itertools
import logging
import time
from dataclasses import dataclass
from functools import partial

import trio

from edge.sockets import open_listeners
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.core import cluster_secret as CS
from metastore.edge.client_conn import Connection, Job, receive_exactly
from metastore.edge.edge_guard import CLIENT_FAULTS, ClientLimits, ClientRefused, check_auth, check_reply
from metastore.core.acl import SUPER_SCHEME, Id, digest_auth_ids
from metastore.edge.four_letter import answer_four_letter_word
from metastore.edge.handshake import SessionHandshake, now_ms
from metastore.edge.request_latency import RequestLatency
from metastore.wire.jute_defs import Err, KeeperState, OpCode, UnknownOpcode, Xid
from metastore.core.prep import HOUSEKEEPING
from metastore.edge.sasl_edge import SaslEdge, SaslSettings
from metastore.core.responses import READ_OPS, WRITE_OPS, read_reply, write_reply
from metastore.core.sessions import SessionExpiry
from metastore.core.state_machine import Applied, MetastoreStateMachine
from metastore.core.txn import SessionClosed, SessionCreated
from metastore.core.watches import WatchLimitExceeded, WatchManager
from metastore.edge.watch_requests import set_watches, watch_request
from zab.core.actions import Role
from zab.edge.driver import Pending, PeerDriver
from zab.errors import NoLeader, OutcomeUnknown
from edge.sockets import ConnectionCounts, peer_address
from edge.outbox import ByteBudget

log = logging.getLogger("quire.metastore")

RECEIVE_BYTES = 1 << 16
PIPELINE_MAX = 1_000  # requests of one connection started but not yet answered
CONTAINER_CHECK_ROUNDS = 20  # maintenance rounds between container/TTL sweeps


@dataclass(frozen=True)
class MetastoreConfig:
    node_id: int
    host: str
    port: int
    min_session_timeout_ms: int = 2_000
    max_session_timeout_ms: int = 60_000
    session_secret: bytes = b""  # optional, mixed with the cluster secret (metastore.core.cluster_secret)
    four_letter_words: frozenset[str] = frozenset({"ruok", "srvr", "stat", "mntr", "conf", "envi", "isro", "cons",
                                                   "wchs", "dump"})
    tick_ms: int = 50
    limits: ClientLimits = ClientLimits()
    tls: object = None  # TLS only when set, as ZooKeeper's secureClientPort (clusterd/daemon/tls_streams.py ServerTls)
    super_digest: str | None = None  # "user:base64(sha1)": addAuth of its password gives the super id (acl.py)
    sasl: SaslSettings = SaslSettings()  # SASL users and enforced authentication (metastore/edge/sasl_edge.py)
    read_only_mode: bool = False  # ZooKeeper's readonlymode.enabled (metastore/edge/handshake.py)


class MetastoreService:
    def __init__(self, driver: PeerDriver, sm: MetastoreStateMachine, config: MetastoreConfig) -> None:
        self.driver = driver
        self.sm = sm
        self.cfg = config
        # A connection's ids as they are when an event is delivered (addAuth may have added some).
        self.watches = WatchManager(auth_of=lambda c: self.connections[c].auth if c in self.connections else (),
                                    limits=config.limits.watches)
        self.expiry = SessionExpiry(config.tick_ms)  # on the leader's ticks (leader_ticked)
        self._housekeeping: trio.Nursery | None = None
        # The peer's role as the driver reports it (role_changed), never read from the core: serving
        # clients needs an established leader, and expiring sessions is the established leader's job.
        self._role: Role = Role.LOOKING
        self._broadcasting = False
        self.connections: dict[int, Connection] = {}
        self.by_session: dict[int, Connection] = {}
        self._conn_ids = itertools.count(1)
        self.reply_budget = ByteBudget(config.limits.reply_max_bytes)  # replies queued, all connections
        self._cxids = itertools.count(1)
        self._handshake = SessionHandshake(self)
        driver.listen(self)
        self.latency = RequestLatency()
        self.stats = {"requests": 0, "notifications": 0, "connections": 0, "connections_refused": 0,
                      "outstanding": 0, "outstanding_max": 0, "outstanding_bytes": 0, "outstanding_bytes_max": 0,
                      "throttled": 0, "cut_off": 0, "sessions_refused": 0, "packets_sent": 0}
        self._addresses = ConnectionCounts(config.limits.max_client_connections, config.limits.max_connections,
                                           per_address_setting="max_client_connections",
                                           total_setting="max_client_connections_total")
        self.sasl = SaslEdge(config.sasl)
        self._below_limit = trio.Event()  # set when outstanding requests drop below the global limit
        self._initializing_secret = False
        # The leader refuses what no client frame can hold (a forged, oversized envelope).
        sm.prep.max_data_bytes = config.limits.jute_max_buffer_bytes
        sm.prep.max_request_bytes = config.limits.max_frame_bytes

    # -- running -------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await open_listeners(self.cfg.port, self.cfg.host, "clients")
        try:
            async with trio.open_nursery() as nursery:
                self._housekeeping = nursery
                nursery.start_soon(self._maintain_sessions, nursery)
                nursery.start_soon(trio.serve_listeners, self._handle, listeners)
                task_status.started()
        finally:
            self._housekeeping = None

    # -- the driver's listener: runs inline, in delivery order -----------------------------
    def delivered(self, txn, applied: object) -> None:
        """Fire watches and track sessions. Inline with the delivery, so no read can see a
        change before its watch events are queued on the connections."""
        if not isinstance(applied, Applied):
            return
        for event in applied.events:
            for conn_id, ev, at in self.watches.trigger(event.path, event.type, event.acl, event.parent_acl):
                conn = self.connections.get(conn_id)
                if conn is not None:
                    self.stats["notifications"] += 1
                    conn.send(jute.encode_notification(jute.WatcherEvent(ev, KeeperState.SYNC_CONNECTED, at)))
        if isinstance(applied.result, SessionCreated):  # opened through any node: the leader tracks it
            self.expiry.created(applied.result.session_id, applied.result.timeout_ms)
            self._handshake.sessions_changed(1)
        if isinstance(applied.result, SessionClosed):
            self.expiry.closed(applied.result.session_id)
            self._handshake.sessions_changed(-1)
            conn = self.by_session.pop(applied.result.session_id, None)
            if conn is not None:
                conn.close()

    def sessions_touched(self, frm: int, session_ids: tuple[int, ...]) -> None:
        self.expiry.touched(session_ids)

    def role_changed(self, role: Role, leader: int | None, epoch: int, broadcasting: bool) -> None:
        self.expiry.stopped()
        self._handshake.sessions_changed(None)  # a sync may have replaced the tree: count again
        self._role, self._broadcasting = role, broadcasting
        # As ZooKeeper shuts its server down when the leader goes: read-write sessions leave a node
        # that lost its leader (reads here could be stale without the client knowing), read-only
        # ones leave a node under a leader again (handshake.py); their clients reconnect.
        for conn in [c for c in self.connections.values() if c.session_id and c.read_only == broadcasting]:
            conn.close()

    @property
    def broadcasting(self) -> bool:
        """Serving read-write: this node follows (or is) an established leader."""
        return self._broadcasting

    @property
    def serving_mode(self) -> str:
        """ZooKeeper's `isro` answer: "rw", "ro" (read-only mode) or "null" (not serving)."""
        return "rw" if self._broadcasting else "ro" if self.cfg.read_only_mode else "null"

    def next_cxid(self) -> int:
        return next(self._cxids)

    def leader_ticked(self, now_ms: int) -> None:
        """A tick of the established leader: close the sessions whose deadline it passed."""
        expired = self.expiry.ticked(now_ms, self.sm.tree.sessions)
        if self._housekeeping is not None:  # else not serving yet, or stopping
            for sid in expired:  # one not closed now is expired again after its timeout
                self._housekeeping.start_soon(self._submit_internal, E.CLOSE_SESSION, sid, b"")

    # -- sessions ---------------------------------------------------------------------
    async def _init_secret(self) -> None:
        """The first leader draws the cluster secret and commits it (metastore.core.cluster_secret)."""
        self._initializing_secret = True
        try:
            await self._submit_internal(E.INIT_SECRET, 0, secrets.token_bytes(CS.SECRET_BYTES))
        finally:
            self._initializing_secret = False

    def _envelope_auth(self, conn: Connection) -> tuple[tuple[str, str], ...]:
        """The ids a request carries to the leader. A super id this node granted travels as
        the token only nodes of this cluster can derive; the leader ignores any other."""
        secret = CS.read_secret(self.sm.tree)
        return tuple((i.scheme, CS.super_token(secret) if i.scheme == SUPER_SCHEME else i.id) for i in conn.auth
                     if i.scheme != SUPER_SCHEME or secret is not None)

    async def _maintain_sessions(self, nursery: trio.Nursery) -> None:
        """Every node reports its active sessions (the leader expires the silent ones on its
        ticks: leader_ticked); the leader draws the cluster secret and deletes empty containers."""
        period_s = max(self.cfg.tick_ms, 20) / 1000
        rounds = 0
        while True:
            await trio.sleep(period_s)
            active = [c.session_id for c in self.connections.values() if c.session_id and c.active]
            for c in self.connections.values():
                c.active = False
            if active:
                self.driver.touch(tuple(active))
            if self._role is not Role.LEADING or not self._broadcasting:
                continue
            if CS.read_secret(self.sm.tree) is None and not self._initializing_secret:
                nursery.start_soon(self._init_secret)
            rounds += 1
            if rounds % CONTAINER_CHECK_ROUNDS == 0:
                for path in self.sm.tree.container_candidates(now_ms()):
                    nursery.start_soon(self._submit_internal, E.DELETE_CONTAINER, 0, path.encode())

    async def _submit_internal(self, kind: int, session_id: int, payload: bytes) -> None:
        """Leader housekeeping: expire a session, delete an empty container or TTL node."""
        env = E.Envelope(kind, HOUSEKEEPING, now_ms(), (), payload)
        try:
            await self.driver.submit(session_id, next(self._cxids), E.encode_envelope(env))
        except (NoLeader, OutcomeUnknown) as e:
            log.info("event=housekeeping_retry kind=%s session=%#x error=%r", kind, session_id, e)

    # -- connections ---------------------------------------------------------------------
    async def _handle(self, stream: trio.SocketStream) -> None:
        host = peer_address(stream).rsplit(":", 1)[0]
        refused = self._addresses.admit(host)
        if refused is not None:
            self.stats["connections_refused"] += 1
            log.info("event=client_refused peer=%s reason=%r", host, refused)
            await stream.aclose()  # as ZooKeeper: the connection is closed at once, nothing is read
            return
        try:
            await self._handle_admitted(stream)
        finally:
            self._addresses.release(host)

    async def _handle_admitted(self, stream: trio.SocketStream) -> None:
        if self.cfg.tls is not None:
            stream = await self.cfg.tls.accept(stream)  # None: refused, closed and logged by the TLS layer
            if stream is None:
                return
        conn = Connection(next(self._conn_ids), stream, peer_address(stream), self.cfg.limits.outgoing_max_bytes,
                          budget=self.reply_budget)
        # As in ZooKeeper, every connection is authenticated by its address (the ip scheme).
        conn.auth.append(Id("ip", conn.host))
        if self.cfg.tls is not None:  # and by its certificate, as ZooKeeper's x509 scheme
            conn.auth.extend(self.cfg.tls.identities(stream))
        self.connections[conn.id] = conn
        self.stats["connections"] += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.run_writer, nursery.cancel_scope)
                await self._serve(conn)
                conn.close()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away (a reset arrives wrapped in the nursery's group): only it is affected
        finally:
            self.stats["cut_off"] += conn.cut_off
            self.stats["packets_sent"] += conn.sent
            self._finished(conn, len(conn.replies))  # a connection cut off leaves its requests unanswered
            del self.connections[conn.id]
            self.watches.drop_connection(conn.id)
            if self.by_session.get(conn.session_id) is conn:
                del self.by_session[conn.session_id]
            await stream.aclose()

    async def _serve(self, conn: Connection) -> None:
        reader = jute.FrameReader(self.cfg.limits.max_frame_bytes)
        try:
            # From accept to a whole ConnectRequest, the idle time before the first bytes included.
            with trio.fail_after(self.cfg.limits.handshake_timeout_ms / 1000):
                first = await receive_exactly(conn.stream, 4)
                if first is None:
                    return
                word = jute.four_letter_word(first)
                if word is not None:
                    if word in self.cfg.four_letter_words:
                        conn.send_raw(answer_four_letter_word(word, self).encode())
                    return
                frames = reader.feed(first)
                while not frames:
                    data = await conn.stream.receive_some(RECEIVE_BYTES)
                    if not data:
                        return
                    frames = reader.feed(data)
            if not await self._handshake.connect(conn, frames.pop(0)):
                return
        except trio.TooSlowError as e:
            log.info("event=client_dropped conn=%s peer=%s error=%r", conn.id, conn.peer, e)
            return
        except CLIENT_FAULTS as e:
            self._refused(conn, e, None, handshake=True)
            return
        with conn.scope:
            await self._read_requests(conn, reader, frames)
            while conn.replies:  # the client stopped sending: its writes in flight are still answered
                await self._wait_advanced(conn)

    async def _read_requests(self, conn: Connection, reader: jute.FrameReader, frames: list[bytes]) -> None:
        """Decode requests in order and start them; _advance answers them in that order."""
        try:
            while True:
                done = 0
                while done < len(frames):
                    # The requests of one read go to Zab together: one proposal write per peer
                    # and one log hand-off for all of them (_request never waits on anything),
                    # as many as the global outstanding limit lets start.
                    with self.driver.holding():
                        while done < len(frames) and self._below_limits():
                            job = await self._request(conn, frames[done])
                            done += 1
                            if job is None:
                                self._advance(conn)
                                return
                            if job is not True:
                                self._started(conn, job, len(frames[done - 1]))
                    self._advance(conn)
                    while len(conn.replies) >= PIPELINE_MAX:
                        await self._wait_advanced(conn)
                    await self._wait_below_limit()
                data = await conn.stream.receive_some(RECEIVE_BYTES)
                if not data:
                    return
                frames = reader.feed(data)
        except CLIENT_FAULTS as e:
            self._refused(conn, e, None)

    def _started(self, conn: Connection, job: Job, size: int) -> None:
        conn.replies.append(job)
        conn.reply_sizes.append(size)
        conn.reply_started.append((conn.request_op, conn.request_arrived))
        stats = self.stats
        stats["outstanding"] += 1
        stats["outstanding_bytes"] += size
        stats["outstanding_max"] = max(stats["outstanding_max"], stats["outstanding"])
        stats["outstanding_bytes_max"] = max(stats["outstanding_bytes_max"], stats["outstanding_bytes"])

    def _finished(self, conn: Connection, n: int, *, answered: bool = True) -> None:
        """`n` requests at the head of the connection's queue were answered (or dropped)."""
        for _ in range(n):
            conn.replies.popleft()
            self.stats["outstanding_bytes"] -= conn.reply_sizes.popleft()
            op, arrived = conn.reply_started.popleft()
            if answered:
                self.latency.observe(op, time.perf_counter() - arrived)
        self.stats["outstanding"] -= n
        if self._below_limits():
            self._below_limit.set()

    def _below_limits(self) -> bool:
        # One request is always let through, however large: a frame is bounded anyway.
        stats, limits = self.stats, self.cfg.limits
        return stats["outstanding"] < limits.global_outstanding_limit and (
            stats["outstanding_bytes"] < limits.global_outstanding_bytes or stats["outstanding"] == 0)

    async def _wait_below_limit(self) -> None:
        """ZooKeeper's globalOutstandingLimit, and its like in bytes: stop reading requests
        while too many, or too many bytes of them, are open."""
        while not self._below_limits():
            self.stats["throttled"] += 1
            if self._below_limit.is_set():
                self._below_limit = trio.Event()
            await self._below_limit.wait()

    def _advance(self, conn: Connection) -> None:
        """Answer the requests at the head of the queue whose outcome is known, in order;
        a write not yet settled stops it and calls this again when it is."""
        replies = conn.replies
        while replies:
            pending, answer = replies[0]
            if pending is not None and not pending.done():
                pending.notify(partial(self._advance, conn))
                break
            self._finished(conn, 1)
            if not answer():
                self._finished(conn, len(replies), answered=False)
                conn.scope.cancel()  # the connection ends here: stop reading requests too
                break
        conn.advanced.set()
        conn.advanced = trio.Event()

    async def _wait_advanced(self, conn: Connection) -> None:
        await conn.advanced.wait()

    def _refused(self, conn: Connection, e: Exception, xid: int | None, *, handshake: bool = False) -> None:
        """The client-port edge's one answer to input the core must not see (edge_guard):
        the refusal's reply, if it has one, then the connection ends."""
        log.info("event=client_refused conn=%s peer=%s error=%r", conn.id, conn.peer, e)
        code = getattr(e, "code", None)
        if code == Err.SESSION_EXPIRED and handshake:
            conn.send(jute.encode_connect_response(jute.ConnectResponse(0, 0, 0, b"\0" * 16, False)))
        elif code == Err.AUTH_FAILED:
            conn.send(jute.encode_reply(jute.ReplyHeader(Xid.AUTH, self.sm.last_zxid, Err.AUTH_FAILED)))
            conn.send(jute.encode_notification(jute.WatcherEvent(-1, KeeperState.AUTH_FAILED, None)))
        elif code is not None and xid is not None:
            self._reply(conn, xid, code)
        conn.close()

    # -- requests ------------------------------------------------------------------------
    async def _request(self, conn: Connection, payload: bytes) -> Job | bool | None:
        """Start one request: None closes the connection, True means already answered,
        a Job is answered in order by _advance. Writes and syncs are handed to Zab
        here, in the order they arrived, so one connection can pipeline them."""
        try:
            header, body = jute.decode_request(payload, self.cfg.limits.jute_max_buffer_bytes)
        except UnknownOpcode as e:
            log.info("event=unknown_opcode conn=%s error=%r", conn.id, e)
            return None
        conn.active = True
        conn.received += 1
        self.stats["requests"] += 1
        op = header.type
        conn.request_op, conn.request_arrived = op, time.perf_counter()
        if op == OpCode.SASL or not self.sasl.admits(conn, op):  # SASL, and enforce.auth before anything else
            return self.sasl.answer(conn, header, body)
        if op == OpCode.PING:
            conn.send(jute.encode_reply(jute.ReplyHeader(Xid.PING, self.sm.last_zxid, 0)))
            return True
        if op == OpCode.AUTH:
            return True if self._auth(conn, header, body) else None
        if conn.read_only and (op in WRITE_OPS or op == OpCode.SYNC):  # ZooKeeper's ReadOnlyRequestProcessor
            return None, partial(self._error_job, conn, header.xid, Err.NOT_READ_ONLY)
        if conn.read_only and op == OpCode.CLOSE_SESSION:  # a local session ends with its connection
            return None, partial(self._close_read_only, conn, header.xid)
        if op in WRITE_OPS or op in (OpCode.SYNC, OpCode.CLOSE_SESSION):
            return await self._start(conn, header, body, payload)
        if op in (OpCode.SET_WATCHES, OpCode.SET_WATCHES2):
            return None, partial(self._set_watches_job, conn, body)
        if op in READ_OPS:
            return None, partial(self._read_job, conn, header, body)
        if op in (OpCode.ADD_WATCH, OpCode.REMOVE_WATCHES, OpCode.CHECK_WATCHES):
            return None, partial(self._watch_job, conn, header, body)
        return None, partial(self._error_job, conn, header.xid, Err.UNIMPLEMENTED)

    async def _start(self, conn: Connection, header, body, payload: bytes) -> Job | None:
        op, cxid = header.type, next(self._cxids)
        try:
            if op == OpCode.SYNC:
                pending = await self.driver.start_sync(conn.session_id, cxid)
            elif op == OpCode.CLOSE_SESSION:
                # The client asked: answer it before closing (the delivery would close it first).
                if self.by_session.get(conn.session_id) is conn:
                    del self.by_session[conn.session_id]
                env = E.Envelope(E.CLOSE_SESSION, self.cfg.node_id, now_ms(), (), b"")
                pending = await self.driver.start_submit(conn.session_id, cxid, E.encode_envelope(env))
            else:
                env = E.Envelope(E.CLIENT, self.cfg.node_id, now_ms(), self._envelope_auth(conn), payload)
                # Decoded once: if this node leads, prepare() takes the request as decoded here.
                pending = await self.driver.start_submit(conn.session_id, cxid, E.encode_envelope(env),
                                                         (env, op, body))
        except NoLeader:
            return None  # ConnectionLoss for the client: it reconnects elsewhere
        return pending, partial(self._finish_job, conn, header, body, pending)

    def _finish_job(self, conn: Connection, header, body, pending: Pending) -> bool:
        try:
            result = pending.outcome()
        except (NoLeader, OutcomeUnknown) as e:
            log.info("event=request_lost conn=%s error=%r", conn.id, e)
            return False  # ConnectionLoss for the client: it reconnects and finds out
        if header.type == OpCode.SYNC:
            self._reply(conn, header.xid, 0, jute.SyncResponse(body.path))
            return True
        assert isinstance(result, Applied)
        if header.type == OpCode.CLOSE_SESSION:
            self._reply(conn, header.xid, 0, zxid=result.zxid)
            return False
        reply = write_reply(header.type, result.result, body)
        self._reply(conn, header.xid, reply.err, reply.body, zxid=result.zxid)
        return True

    def _read_job(self, conn: Connection, header, body) -> bool:
        reply = read_reply(self.sm.tree, header.type, body, conn.session_id, conn.auth,
                           max_reply_bytes=self.cfg.limits.max_frame_bytes)
        err = reply.err
        if reply.watch is not None and err in (0, Err.NO_NODE):
            try:
                self.watches.add(conn.id, reply.watch[0], reply.watch[1])
            except WatchLimitExceeded as e:  # the read is refused whole: a watch silently unset would be worse
                err = self._watch_refused(conn, e)
        self._reply(conn, header.xid, err, reply.body)
        return True

    def _set_watches_job(self, conn: Connection, body) -> bool:
        try:
            events = set_watches(self.watches, self.sm.tree, conn.id, body)
        except WatchLimitExceeded as e:
            self._watch_refused(conn, e)
            return False  # closed (watch_requests.py): the client re-sends them to a node with room
        for ev, path in events:  # the missed events first, then the answer, as before the split
            conn.send(jute.encode_notification(jute.WatcherEvent(ev, KeeperState.SYNC_CONNECTED, path)))
        conn.send(jute.encode_reply(jute.ReplyHeader(Xid.SET_WATCHES, self.sm.last_zxid, 0)))
        return True

    def _watch_job(self, conn: Connection, header, body) -> bool:
        try:
            err = watch_request(self.watches, conn.id, header.type, body)
        except WatchLimitExceeded as e:
            err = self._watch_refused(conn, e)
        self._reply(conn, header.xid, err, jute.ErrorResponse(0) if header.type == OpCode.ADD_WATCH else None)
        return True

    def _watch_refused(self, conn: Connection, e: WatchLimitExceeded) -> int:
        log.info("event=watch_refused conn=%s peer=%s setting=%s error=%s", conn.id, conn.peer, e.setting, e)
        return Err.QUOTA_EXCEEDED

    def _close_read_only(self, conn: Connection, xid: int) -> bool:
        self._reply(conn, xid, 0)
        return False

    def _error_job(self, conn: Connection, xid: int, err: int) -> bool:
        self._reply(conn, xid, err)
        return True

    def _reply(self, conn: Connection, xid: int, err: int, body: object = None, zxid: int | None = None) -> None:
        zxid = self.sm.last_zxid if zxid is None else zxid
        payload = jute.encode_reply(jute.ReplyHeader(xid, zxid, err), body if err == 0 else None)
        try:
            check_reply(payload, self.cfg.limits)
        except ClientRefused as e:  # a read of more than the client may take: an error, as ZooKeeper
            log.info("event=reply_refused conn=%s peer=%s xid=%s error=%r", conn.id, conn.peer, xid, e)
            payload = jute.encode_reply(jute.ReplyHeader(xid, zxid, e.code))
        conn.send(payload)

    def _auth(self, conn: Connection, header, body: jute.AuthPacket) -> bool:
        if body.scheme != "digest":
            conn.send(jute.encode_reply(jute.ReplyHeader(Xid.AUTH, self.sm.last_zxid, Err.AUTH_FAILED)))
            conn.send(jute.encode_notification(jute.WatcherEvent(-1, KeeperState.AUTH_FAILED, None)))
            return False
        for ident in digest_auth_ids(body.auth, self.cfg.super_digest):
            check_auth(conn.auth, ident)
            if ident not in conn.auth:
                conn.auth.append(ident)
        conn.send(jute.encode_reply(jute.ReplyHeader(Xid.AUTH, self.sm.last_zxid, 0)))
        return True
