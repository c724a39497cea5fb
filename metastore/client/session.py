"""The trio driver of a metastore session: connections, reconnects, states, the pipeline.

`SessionDriver` is the engine under MetaClient (metastore/client/__init__.py, which
adds the operations). The rules live in pure modules (client/core.py: states,
watch tables, the pipeline of outstanding requests, backoff; jute: the
bytes); this module does the I/O: one task keeps the session (connects to a
server, replays auth and watches, reconnects to the next server with backoff
when the connection breaks), and each connection has a reader (replies in
order, notifications, the read timeout), a writer (coalesces frames) and a
pinger. Callers' tasks only encode, enqueue and wait.
"""

from __future__ import annotations

import logging
import random
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from typing import Any, Self

import trio

from metastore.wire import jute
from metastore.wire import jute_records as J
from metastore.client.core import (Backoff, HostRing, Pipeline, ProtocolViolation, State, WatchEvent, WatchTable, Xids,
                                   check_transition)
from metastore.client.watches import Sink, WatchArm
from metastore.errors import AuthFailed, ConnectionLoss, SessionExpired, ZooKeeperError, error_for_code
from metastore.wire.jute_defs import (DEFAULT_MAX_BUFFER_BYTES, DEFAULT_MAX_FRAME_BYTES, PASSWORD_BYTES, Err, EventType,
                                 JuteError, KeeperState, OpCode, Xid)
from edge.sockets import METASTORE_CLIENT_TLS

log = logging.getLogger("quire.metastore.client")

RECEIVE_BYTES = 1 << 16
WRITE_BATCH_FRAMES = 256  # frames coalesced into one send
STATE_HISTORY = 256  # transitions kept for states() iterators that fall behind
_NO_PASSWORD = b"\0" * PASSWORD_BYTES
_IO_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)

class _Call:
    """One request from a caller's task: its outcome arrives through the reader task."""

    __slots__ = ("opcode", "path", "arm", "slots", "done", "header", "body", "error")

    def __init__(self, opcode: int, path: str | None, arm: WatchArm | None, slots: trio.Semaphore | None) -> None:
        self.opcode, self.path, self.arm, self.slots = opcode, path, arm, slots
        self.done = trio.Event()
        self.header: J.ReplyHeader | None = None
        self.body: object = None
        self.error: BaseException | None = None

    def finish(self, header: J.ReplyHeader, body: object) -> None:
        self.header, self.body = header, body
        self._end()

    def fail(self, error: BaseException) -> None:
        if self.arm is not None:
            self.arm.sink._unreserve()
        self.error = error
        self._end()

    def _end(self) -> None:
        if self.slots is not None:
            self.slots.release()
            self.slots = None
        self.done.set()

    async def outcome(self) -> tuple[J.ReplyHeader, object]:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.header is not None
        return self.header, self.body


class _Connection:
    """One TCP connection to one server, for as long as it lasts."""

    def __init__(self, stream: trio.SocketStream, host: tuple[str, int], frames: jute.FrameReader,
                 leftover: list[bytes], queue_frames: int) -> None:
        self.stream, self.host, self.frames, self.leftover = stream, host, frames, leftover
        self.pipeline: Pipeline[_Call] = Pipeline()
        self.auth_calls: deque[_Call] = deque()  # auth replies may overtake others: their own queue
        self.out_send, self.out_recv = trio.open_memory_channel[bytes](queue_frames)
        self.scope = trio.CancelScope()
        self.closed = False
        self.ping_queued = False
        self.opened_at = trio.current_time()

    def send(self, payload: bytes) -> None:
        self.out_send.send_nowait(jute.frame(payload))

    def name(self) -> str:
        return f"{self.host[0]}:{self.host[1]}"


class _AttemptFailed(Exception):
    """This server did not take us (down, no quorum, behind our last zxid): try the next."""


class SessionDriver:
    """One session with the metastore, kept across servers until it is closed or expires."""


    def __init__(self, hosts: Sequence[tuple[str, int]], *, session_timeout_ms: int = 10_000,
                 auth: Sequence[tuple[str, bytes | str]] = (), start_timeout_s: float = 30.0,
                 reconnect_wait_s: float | None = None, max_in_flight: int = 1024,
                 backoff_s: tuple[float, float] = (0.05, 1.0), max_data_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
                 rng: random.Random | None = None, tls: Any = None) -> None:
        # tls: TLS on every connection when set, an object with `async wrap(stream, host)` that does
        # the handshake (clusterd.daemon.tls_streams.ClientTls); a refusal is an OSError, tried as a failed connect.
        self._tls = tls if tls is not None else METASTORE_CLIENT_TLS.get()
        self._rng = rng or random.Random()
        self._hosts = HostRing(hosts, self._rng)
        self._requested_timeout_ms = session_timeout_ms
        self._auth: list[tuple[str, bytes]] = [(scheme, credential_bytes(c)) for scheme, c in auth]
        self._start_timeout_s = start_timeout_s
        # How long a request waits for a connection while SUSPENDED (default: the session timeout).
        self._reconnect_wait_s = reconnect_wait_s
        self._max_in_flight = max_in_flight
        self._backoff_s = backoff_s
        self._max_data_bytes = max_data_bytes
        self._slots = trio.Semaphore(max_in_flight)
        self._xids = Xids()
        self._watches: WatchTable[Sink] = WatchTable()
        self._state = State.CONNECTING
        self._state_changed = trio.Event()
        self._history: deque[State] = deque([State.CONNECTING], maxlen=STATE_HISTORY)
        self._transitions = 0
        self._lost: tuple[type[ZooKeeperError], str] | None = None
        self._session_id = 0
        self._passwd = _NO_PASSWORD
        self._timeout_ms = 0
        self._last_zxid = 0  # ZooKeeper's lastZxid: the newest zxid of an ordinary reply
        self._seen_zxid = 0  # also counting ping replies: only for ConnectRequest.last_zxid_seen
        self._conn: _Connection | None = None
        self._scope = trio.CancelScope()
        self._helpers: trio.Nursery | None = None
        self._task_status: trio.TaskStatus | None = None
        self._started = self._running = self._closing = False
        self._stack: AsyncExitStack | None = None
        self._stats: Counter[str] = Counter()

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        nursery = await stack.enter_async_context(trio.open_nursery())
        try:
            await self.start(nursery)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            # Our tasks are done: the nursery exits at once and the body's exception, if
            # any, propagates unwrapped (it never entered the nursery's exception group).
            assert self._stack is not None
            await self._stack.aclose()

    async def start(self, nursery: trio.Nursery) -> None:
        """Open the session (within start_timeout_s) and keep it in `nursery` until close()."""
        if self._started:
            raise RuntimeError("a MetaClient starts once; create another")
        self._started = True
        try:
            with trio.fail_after(self._start_timeout_s):
                await nursery.start(self._run)
        except trio.TooSlowError:
            self._lose(ConnectionLoss, f"no server took the session within {self._start_timeout_s:g} s")
            raise ConnectionLoss(None, f"no server took the session within {self._start_timeout_s:g} s") from None

    async def close(self) -> None:
        """Close the session (its ephemerals go at once) and stop. Idempotent."""
        if self._state is State.LOST:
            return
        self._closing = True
        try:
            if self._state is State.CONNECTED:
                with trio.move_on_after(max(1.0, self._timeout_ms / 3000)):
                    try:
                        await self._call(OpCode.CLOSE_SESSION, None)
                    except ZooKeeperError:
                        pass  # the session ends anyway: it expires
        finally:
            self._lose(SessionExpired, "the client closed its session")
            self._scope.cancel()

    async def _run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        self._task_status, self._running = task_status, True
        try:
            with self._scope:
                async with trio.open_nursery() as helpers:
                    self._helpers = helpers
                    await self._keep_session()
                    helpers.cancel_scope.cancel()
        finally:
            self._running = False
            self._lose(SessionExpired, "the client stopped")  # no-op if already LOST
        if self._task_status is not None:
            raise self._lost_error()  # start() fails with the reason (AuthFailed, SessionExpired)

    # -- states ---------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._state

    @property
    def session_id(self) -> int:
        return self._session_id

    @property
    def session_timeout_ms(self) -> int:
        """The timeout the server granted (0 before the first connection)."""
        return self._timeout_ms

    @property
    def last_zxid(self) -> int:
        """The newest zxid seen in a reply: no server older than this will be used."""
        return self._last_zxid

    @property
    def server(self) -> tuple[str, int] | None:
        """The server of the current connection (None unless CONNECTED)."""
        return self._conn.host if self._conn is not None and self._state is State.CONNECTED else None

    @property
    def lost_reason(self) -> str | None:
        return self._lost[1] if self._lost else None

    async def wait_connected(self) -> None:
        """Return once CONNECTED; raise the reason if the session is LOST."""
        while self._state is not State.CONNECTED:
            if self._state is State.LOST:
                raise self._lost_error()
            await self._state_changed.wait()

    async def states(self) -> AsyncIterator[State]:
        """The current state, then every change in order, ending after LOST. (An iterator
        more than STATE_HISTORY changes behind skips to the oldest one kept.)"""
        seen = self._transitions
        yield self._state
        if self._state is State.LOST:
            return
        while True:
            changed = self._state_changed
            if seen == self._transitions:
                await changed.wait()
                continue
            behind = min(self._transitions - seen, len(self._history))
            seen = self._transitions
            for state in list(self._history)[-behind:]:
                yield state
                if state is State.LOST:
                    return

    def statistics(self) -> dict[str, object]:
        conn = self._conn
        return {"state": self._state.value, "session_id": self._session_id, "last_zxid": self._last_zxid,
                "server": conn.name() if conn else None, "in_flight": len(conn.pipeline) if conn else 0,
                "watches": len(self._watches), **self._stats}

    def _set_state(self, new: State) -> None:
        if new is self._state:
            return
        check_transition(self._state, new)
        log.info("event=client_state session=%#x from=%s to=%s", self._session_id, self._state.name, new.name)
        self._state = new
        self._history.append(new)
        self._transitions += 1
        self._state_changed.set()
        self._state_changed = trio.Event()

    def _lost_error(self, path: str | None = None) -> ZooKeeperError:
        assert self._lost is not None
        cls, reason = self._lost
        return cls(path, reason)

    def _lose(self, cls: type[ZooKeeperError], reason: str) -> None:
        """The session is over: fail everything waiting on it."""
        if self._state is State.LOST:
            return
        self._lost = (cls, reason)
        self._set_state(State.LOST)
        if self._conn is not None:
            self._break(self._conn, reason, lost=True)
        for sink in self._watches.clear():
            sink._fail(self._lost_error(getattr(sink, "path", None)))

    # -- the session task -------------------------------------------------------------------
    async def _keep_session(self) -> None:
        backoff = Backoff(self._rng, *self._backoff_s)
        delay_s = 0.0
        while self._state is not State.LOST and not self._closing:
            if delay_s:
                await trio.sleep(delay_s)
            host = self._hosts.next()
            try:
                conn = await self._open(host)
            except _AttemptFailed as e:
                self._stats["connect_failures"] += 1
                log.debug("event=connect_failed server=%s:%s error=%s", host[0], host[1], e)
                delay_s = backoff.next_delay_s()
                continue
            except SessionExpired as e:
                self._lose(SessionExpired, e.reason)
                return
            await self._serve(conn)
            self._stats["disconnects"] += 1
            # Straight to the next server after a long-lived connection; back off after a short one.
            if trio.current_time() - conn.opened_at > self._ping_interval_s():
                backoff.reset()
                delay_s = 0.0
            else:
                delay_s = backoff.next_delay_s()

    def _attempt_timeout_s(self) -> float:
        # ZooKeeper's connectTimeout: the session timeout shared among the servers.
        return max(1.0, self._requested_timeout_ms / 1000 / len(self._hosts))

    def _ping_interval_s(self) -> float:
        return (self._timeout_ms or self._requested_timeout_ms) / 3000

    def _read_timeout_s(self) -> float:
        # ZooKeeper's readTimeout: two thirds of the session timeout without a frame.
        return (self._timeout_ms or self._requested_timeout_ms) * 2 / 3000

    async def _open(self, host: tuple[str, int]) -> _Connection:
        """TCP connect and the ConnectRequest/ConnectResponse handshake."""
        request = J.ConnectRequest(0, max(self._last_zxid, self._seen_zxid), self._requested_timeout_ms,
                                   self._session_id, self._passwd, False)
        frames = jute.FrameReader(DEFAULT_MAX_FRAME_BYTES)
        try:
            with trio.fail_after(self._attempt_timeout_s()):
                stream = await trio.open_tcp_stream(*host)
                if self._tls is not None:
                    stream = await self._tls.wrap(stream, host[0])
                try:
                    await stream.send_all(jute.frame(jute.encode_connect_request(request)))
                    received: list[bytes] = []
                    while not received:
                        data = await stream.receive_some(RECEIVE_BYTES)
                        if not data:
                            raise _AttemptFailed("closed before answering (no quorum there, or behind our zxid)")
                        received = frames.feed(data)
                    response = jute.decode_connect_response(received.pop(0))
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (*_IO_ERRORS, trio.TooSlowError, JuteError) as e:
            raise _AttemptFailed(repr(e)) from None
        if response.time_out <= 0:
            await trio.aclose_forcefully(stream)
            raise SessionExpired(None, f"{host[0]}:{host[1]} says the session expired")
        if self._session_id and response.session_id != self._session_id:
            await trio.aclose_forcefully(stream)
            raise _AttemptFailed(f"asked for session {self._session_id:#x}, got {response.session_id:#x}")
        self._session_id, self._passwd, self._timeout_ms = response.session_id, response.passwd, response.time_out
        handshake_frames = len(self._auth) + len(self._watches) + 2
        return _Connection(stream, host, frames, received, self._max_in_flight + handshake_frames)

    async def _serve(self, conn: _Connection) -> None:
        """Run one connection: replay auth and watches, go CONNECTED, serve until it breaks."""
        handshake = []
        for scheme, credential in self._auth:
            call = _Call(OpCode.AUTH, None, None, None)
            conn.auth_calls.append(call)
            conn.send(jute.encode_request(J.RequestHeader(Xid.AUTH, OpCode.AUTH), J.AuthPacket(0, scheme, credential)))
            handshake.append(call)
        for request in self._watches.set_watches(self._last_zxid):
            call = _Call(OpCode.SET_WATCHES2, None, None, None)
            conn.pipeline.push(Xid.SET_WATCHES, OpCode.SET_WATCHES2, call)
            conn.send(jute.encode_request(J.RequestHeader(Xid.SET_WATCHES, OpCode.SET_WATCHES2), request))
            handshake.append(call)
        self._conn = conn  # not usable before CONNECTED, but _lose and _break must find it
        with conn.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, conn)
                nursery.start_soon(self._writer, conn)
                nursery.start_soon(self._pinger, conn)
                if await self._handshake_done(conn, handshake):
                    self._set_state(State.CONNECTED)
                    self._stats["connects"] += 1
                    if self._task_status is not None:
                        status, self._task_status = self._task_status, None
                        status.started()
                await trio.sleep_forever()  # until _break cancels conn.scope
        await trio.aclose_forcefully(conn.stream)

    async def _handshake_done(self, conn: _Connection, handshake: list[_Call]) -> bool:
        try:
            for payload in conn.leftover:
                self._on_frame(conn, payload)
        except (JuteError, ProtocolViolation) as e:
            self._break(conn, f"protocol violation: {e}")
            return False
        for call in handshake:
            await call.done.wait()
            if isinstance(call.error, ConnectionLoss):
                return False
            if call.error is not None or (call.header is not None and call.header.err != Err.OK):
                code = call.header.err if call.header is not None else Err.AUTH_FAILED
                self._lose(AuthFailed if code == Err.AUTH_FAILED else type(error_for_code(code)),
                           f"{conn.name()} refused the session's credentials or watches (error {code})")
                self._break(conn, "handshake refused")
                return False
        return True

    def _break(self, conn: _Connection, reason: str, *, lost: bool = False) -> None:
        """The connection is over: requests in flight fail with ConnectionLoss (or the
        session's end), never retried, since a write among them may have been applied."""
        if conn.closed:
            return
        conn.closed = True
        if self._conn is conn:
            self._conn = None
            if self._state is State.CONNECTED and not self._closing:
                self._set_state(State.SUSPENDED)
        log.info("event=connection_lost server=%s reason=%s", conn.name(), reason)
        calls = [o.call for o in conn.pipeline.drain()] + list(conn.auth_calls)
        conn.auth_calls.clear()
        for call in calls:
            call.fail(self._lost_error(call.path) if lost else
                      ConnectionLoss(call.path, f"connection to {conn.name()} lost with the request in flight "
                                                f"({reason}); it may or may not have taken effect"))
        conn.out_send.close()
        conn.scope.cancel()

    # -- connection tasks -----------------------------------------------------------------
    async def _reader(self, conn: _Connection) -> None:
        try:
            while not conn.closed:
                with trio.move_on_after(self._read_timeout_s()) as timer:
                    data = await conn.stream.receive_some(RECEIVE_BYTES)
                if timer.cancelled_caught:
                    return self._break(conn, f"nothing heard for {self._read_timeout_s():.2f} s")
                if not data:
                    return self._break(conn, "the server closed the connection")
                for payload in conn.frames.feed(data):
                    self._on_frame(conn, payload)
                    if conn.closed:
                        return
        except _IO_ERRORS as e:
            self._break(conn, repr(e))
        except (JuteError, ProtocolViolation) as e:
            log.warning("event=protocol_violation server=%s error=%s", conn.name(), e)
            self._break(conn, f"protocol violation: {e}")

    async def _writer(self, conn: _Connection) -> None:
        try:
            async for first in conn.out_recv:
                batch = [first]
                while len(batch) < WRITE_BATCH_FRAMES:
                    try:
                        batch.append(conn.out_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                conn.ping_queued = False
                await conn.stream.send_all(b"".join(batch))
        except _IO_ERRORS as e:
            self._break(conn, repr(e))

    async def _pinger(self, conn: _Connection) -> None:
        """A ping at once (its reply's zxid covers the creation of a new session: a server
        that has not applied it yet will refuse us instead of calling the session
        expired), then every third of the session timeout."""
        ping = jute.encode_request(J.RequestHeader(Xid.PING, OpCode.PING))
        while True:
            if not conn.ping_queued:  # one unsent ping is enough
                conn.ping_queued = True
                try:
                    conn.send(ping)
                except (trio.WouldBlock, trio.ClosedResourceError):
                    return
            await trio.sleep(self._ping_interval_s())

    def _on_frame(self, conn: _Connection, payload: bytes) -> None:
        xid = jute.reply_xid(payload)
        if xid == Xid.NOTIFICATION:
            self._on_notification(jute.decode_notification(payload))
            return
        if xid == Xid.PING:
            # Not lastZxid (as ZooKeeper's client): the server answers pings at once, so
            # notifications up to this zxid may still be queued behind the reply.
            self._seen_zxid = max(self._seen_zxid, jute.decode_reply(payload, OpCode.PING)[0].zxid)
            return
        if xid == Xid.AUTH:
            if not conn.auth_calls:
                raise ProtocolViolation("auth reply while no auth request is outstanding")
            call = conn.auth_calls.popleft()
            header, body = jute.decode_reply(payload, OpCode.AUTH)
        else:
            call = conn.pipeline.pop_reply(xid).call
            header, body = jute.decode_reply(payload, OpCode(call.opcode))
            if header.zxid > self._last_zxid:
                self._last_zxid = header.zxid
        arm = call.arm
        if arm is not None:
            kind = arm.kinds.get(header.err)
            if kind is None:
                arm.sink._unreserve()
            else:
                arm.sink._arm(kind, arm.path)
                self._watches.add(kind, arm.path, arm.sink)
        call.finish(header, body)

    def _on_notification(self, raw: J.WatcherEvent) -> None:
        self._stats["notifications"] += 1
        if raw.type == EventType.NONE:
            if raw.state == KeeperState.AUTH_FAILED:
                self._lose(AuthFailed, "the server refused the credentials")
            return
        try:
            event = WatchEvent(EventType(raw.type), raw.path)
        except ValueError:
            raise ProtocolViolation(f"notification of unknown event type {raw.type}") from None
        for sink in self._watches.targets(event):
            sink._deliver(event)

    # -- requests -----------------------------------------------------------------------
    async def _call(self, opcode: OpCode, body: object, path: str | None = None, arm: WatchArm | None = None,
                    *, xid: int | None = None, synced: bool = False) -> tuple[J.ReplyHeader, object]:
        """Send one request and await its reply. `synced`: a SYNC of `path` goes first on the same
        connection, with no await between the two, and the server answers a connection's
        requests in order: a linearizable read in one round trip instead of two."""
        await self._slots.acquire()
        try:
            conn = await self._wait_usable(path)
            if arm is not None:
                arm.sink._reserve()
            call = _Call(opcode, path, arm, self._slots)
        except BaseException:
            self._slots.release()
            raise
        try:
            if xid == Xid.AUTH:
                payload = jute.encode_request(J.RequestHeader(Xid.AUTH, opcode), body)
                conn.auth_calls.append(call)
            else:
                if synced:  # outside the slots: it travels with the request that holds one
                    sync, sync_xid = _Call(OpCode.SYNC, path, None, None), self._xids.next()
                    conn.pipeline.push(sync_xid, OpCode.SYNC, sync)
                    conn.send(jute.encode_request(J.RequestHeader(sync_xid, OpCode.SYNC), J.SyncRequest(path)))
                xid = self._xids.next()
                payload = jute.encode_request(J.RequestHeader(xid, opcode), body)
                conn.pipeline.push(xid, opcode, call)
        except BaseException as e:
            call.fail(e)
            raise
        conn.send(payload)
        self._stats["requests"] += 1 + synced
        if synced and (header := (await sync.outcome())[0]).err != Err.OK:
            raise error_for_code(header.err, path)
        return await call.outcome()

    async def _wait_usable(self, path: str | None) -> _Connection:
        if self._state is State.CONNECTED and self._conn is not None:
            return self._conn
        if not self._running:
            raise RuntimeError("the MetaClient is not running: use `async with` or start() first") \
                if self._state is not State.LOST else self._lost_error(path)
        wait_s = self._reconnect_wait_s
        if wait_s is None:
            wait_s = (self._timeout_ms or self._requested_timeout_ms) / 1000
        with trio.move_on_after(wait_s):
            while True:
                if self._state is State.LOST:
                    raise self._lost_error(path)
                if self._state is State.CONNECTED and self._conn is not None:
                    return self._conn
                await self._state_changed.wait()
        raise ConnectionLoss(path, f"not connected to any server within {wait_s:g} s")


def credential_bytes(credential: bytes | str) -> bytes:
    return credential.encode() if isinstance(credential, str) else bytes(credential)
