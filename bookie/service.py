"""The bookie service (trio edge): the bookie wire protocol (bookie/protocol.py) over TCP,
served from a BookieStorage.

One task per connection reads; every ADD decoded from one socket read goes to
`storage.join_adds` in one synchronous call, which starts the journal write at
once if the disk is free; the answers leave from the batch's completion
callback, so an add costs no task of its own and the connection keeps reading
while the journal fsyncs (the storage group-commits across calls and
connections). Reads, fences and explicit LACs of one socket read are served in
order by one task; READ_LAC is answered at once, and so is an explicit LAC that
comes before any other of those in its socket read and need not wait (its
ledger's key is bound here); a long poll is answered from the step that raises
its ledger's LAC (storage.watch_lac: an add's LAC field, an explicit LAC), its
task only bounding the wait by the poll's timeout. An answer leaves at once, from the step that completes it, when
nothing is queued before it (edge/sockets.py); otherwise answers are queued
and leave in one send per wakeup of the connection's writer. Either way they
leave in whatever order they complete (responses carry their request's id).

Bounds: at most `max_in_flight` requests per connection are being served; more
are answered OVERLOADED at once. A client that does not read its answers is cut
off once `max_outgoing_bytes` are queued for it. A malformed frame is answered
BAD_REQUEST (when its request id is readable) and closes that connection only.

Storage failures: a stored copy that cannot be read is answered CORRUPT (the
reader asks another replica); a journal that cannot be written (StorageError
from an add's batch, fence, write_lac) stops the service, and with it the node:
the bookie must restart and recover from its journal rather than keep answering.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import trio

from bookie import protocol as P
from bookie.errors import BookieError, EntryCorrupt, EntryTooLarge, NoSuchEntry, Overloaded, StorageError
from bookie.service_config import BookieServiceConfig
from bookie.service_connection import BookieConnection, ThreadAnswer
from edge import metrics
from edge.outbox import ByteBudget
from edge.sockets import ConnectionCounts, peer_host

if TYPE_CHECKING:
    from bookie.storage import BookieStorage

log = logging.getLogger("quire.bookie.service")

FLUSH_BEFORE_CLOSE_S = 1.0  # how long a BAD_REQUEST answer may take to leave before the connection closes


class BookieService:
    """Serves one BookieStorage on host:port. `await nursery.start(service.run)`.

    The storage's own background work (checkpoints, disk checks, compaction) is the
    caller's to run (clusterd starts `storage.run`)."""

    def __init__(self, storage: BookieStorage, host: str, port: int, config: BookieServiceConfig | None = None,
                 *, tls: Any = None) -> None:
        self.storage = storage
        # TLS with client certificates when set: `async accept(stream)` does the handshake, None
        # when it refused (clusterd/daemon/tls_streams.py ServerTls).
        self.tls = tls
        self.host = host
        self.port = port
        self.cfg = config or BookieServiceConfig()
        self.connections: dict[int, BookieConnection] = {}
        self._ids = itertools.count(1)
        # Node-wide bounds over every connection (each connection has its own too): answers queued
        # for clients that do not read, and the bytes of adds waiting for their fsync.
        self._answers_budget = ByteBudget(self.cfg.max_outgoing_bytes_total)
        self.in_flight_bytes_total = 0
        self.stats: Counter[str] = Counter()
        self._fatal: StorageError | None = None  # a batch of adds failed to reach the disk: stop serving
        self._fatal_event = trio.Event()
        self._closed = trio.Event()  # set and replaced whenever a connection closes
        self._connections = ConnectionCounts(self.cfg.max_connections_per_address, self.cfg.max_connections,
                                             per_address_setting="bookie_max_connections_per_address",
                                             total_setting="bookie_max_connections")

    async def wait_connections_at_most(self, count: int) -> None:
        """Return once at most `count` client connections are open."""
        while len(self.connections) > count:
            await self._closed.wait()

    async def listen(self) -> list[trio.SocketListener]:
        """Bind the port (OSError if it is in use); pass the result to run()."""
        return await trio.open_tcp_listeners(self.port, host=self.host)

    async def run(self, listeners: list[trio.SocketListener] | None = None, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started once the port is bound."""
        if listeners is None:
            listeners = await self.listen()
        if self.port == 0:  # tests bind an ephemeral port: report which
            self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            nursery.start_soon(self._stop_on_storage_failure)
            task_status.started()

    async def _stop_on_storage_failure(self) -> None:
        """Raise the StorageError of a failed batch of adds (they have no task of their own to raise it)."""
        await self._fatal_event.wait()
        assert self._fatal is not None
        raise self._fatal

    def statistics(self) -> dict[str, Any]:
        """Counters of the service and the storage's own statistics, for /status."""
        stats = {"connections_open": len(self.connections), **self.stats}
        # Frame assembly's copying work, so a test can check it stays linear in the bytes received.
        stats["frame_bytes_copied"] = self.stats["frame_bytes_copied"] + sum(
            c.splitter.bytes_copied for c in self.connections.values() if c.splitter is not None)
        storage_stats = getattr(self.storage, "statistics", None)
        if storage_stats is not None:
            stats["storage"] = storage_stats()
        return stats

    # -- connections --------------------------------------------------------------------
    async def _handle(self, stream: trio.SocketStream) -> None:
        """Admit a new connection (or close it at once, over a connection limit) and serve it.
        The handshake deadline starts here: a stream wrapper (TLS) goes between admission and
        _serve_connection, bounded by the same deadline."""
        address = peer_host(stream)
        if address is None:  # reset before it was served
            await stream.aclose()
            return
        refused = self._connections.admit(address)
        if refused is not None:
            self.stats["connections_refused"] += 1
            log.info("event=connection_refused address=%s reason=%r", address, refused)
            await stream.aclose()
            return
        try:
            deadline = trio.current_time() + self.cfg.handshake_timeout_ms / 1000
            if self.tls is not None:
                accepted = None
                with trio.move_on_at(deadline):  # the TLS handshake counts against the same deadline
                    accepted = await self.tls.accept(stream)  # None: refused, closed and logged by the TLS layer
                if accepted is None:
                    await trio.aclose_forcefully(stream)
                    return
                stream = accepted
            await self._serve_connection(stream, deadline)
        finally:
            self._connections.release(address)

    async def _serve_connection(self, stream: trio.SocketStream, handshake_deadline: float) -> None:
        conn = BookieConnection(next(self._ids), stream, self.cfg.max_outgoing_bytes, self._answers_budget)
        self.connections[conn.id] = conn
        self.stats["connections"] += 1
        try:
            async with trio.open_nursery() as nursery:
                conn.scope = nursery.cancel_scope
                nursery.start_soon(conn.write_loop)
                await self._read_loop(conn, nursery, handshake_deadline)
                if conn.closing and conn.out.queued_bytes:  # a bad frame: let its BAD_REQUEST answer leave first
                    conn.out.close()
                    with trio.move_on_after(FLUSH_BEFORE_CLOSE_S):
                        await conn.drained.wait()
                nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
            # The nursery wraps a reset peer in an ExceptionGroup: catch it there, or one client's
            # reset would take the whole node down.
            log.info("event=connection_lost conn=%s error=%r", conn.id, group.exceptions[0])
        finally:
            conn.closing, conn.scope = True, None
            conn.out.abort()  # under its lock: the worker thread never writes to a closed (or reused) descriptor
            del self.connections[conn.id]
            self._closed.set()
            self._closed = trio.Event()
            if conn.splitter is not None:
                self.stats["frame_bytes_copied"] += conn.splitter.bytes_copied
            self.stats["slow_readers_cut_off"] += conn.cut_off
            await stream.aclose()

    async def _read_loop(self, conn: BookieConnection, nursery: trio.Nursery, handshake_deadline: float) -> None:
        """Read and dispatch frames until the peer closes, sends a bad frame or times out: until its
        first whole frame, by the handshake deadline; after it, only while a frame is incomplete."""
        splitter = conn.splitter = P.FrameSplitter(self.cfg.max_frame_bytes)
        read_timeout_s, shaken = self.cfg.read_timeout_ms / 1000, False
        with trio.CancelScope(deadline=handshake_deadline) as timer:
            while True:
                data = await conn.stream.receive_some(self.cfg.receive_bytes)
                if not data:
                    return
                try:
                    bodies = splitter.feed(data)
                except P.DecodeError as e:
                    self._bad_request(conn, e)
                    return
                if not self._dispatch(conn, nursery, bodies):
                    return
                if splitter.error is not None:  # after good frames of the same read, served above
                    self._bad_request(conn, splitter.error)
                    return
                shaken = shaken or bool(bodies)
                if shaken:
                    timer.deadline = trio.current_time() + read_timeout_s if splitter.pending_bytes else math.inf
        self.stats["timeouts"] += 1
        log.warning("event=connection_timeout conn=%s phase=%s pending_bytes=%s action=close", conn.id,
                    "frame" if shaken else "handshake", splitter.pending_bytes)

    def _bad_request(self, conn: BookieConnection, e: P.DecodeError) -> None:
        self.stats["bad_frames"] += 1
        log.warning("event=bad_frame conn=%s error=%r action=close", conn.id, e)
        if e.request_id is not None:
            conn.send(P.encode_response(P.Response(e.request_id, P.Kind.ADD, P.Status.BAD_REQUEST,
                                                   message=f"{e}; closing the connection")))
        conn.closing = True

    def _dispatch(self, conn: BookieConnection, nursery: trio.Nursery, bodies: list[bytes]) -> bool:
        """Start every request of one socket read; False once the connection must close."""
        self.storage.settle()  # an add answered from the worker thread is indexed before anything after it
        adds: list[tuple[int, int, bytes, bytes, bool]] = []  # storage.add_fields tuples
        add_ids: list[int] = []
        ordered: list[P.Request] = []
        ok = True
        for body in bodies:
            try:
                if body[1:2] == _ADD_CODE:  # the hot path: no request object
                    rid, ledger, entry, key, data, recovery = P.decode_add(body)
                    if not self._admit_add(conn, rid, ledger, len(data)):
                        continue
                    adds.append((ledger, entry, key, data, recovery))
                    add_ids.append(rid)
                    conn.in_flight += 1
                    conn.in_flight_bytes += len(data)
                    self.in_flight_bytes_total += len(data)
                    continue
                req = P.decode_request(body)
            except P.DecodeError as e:
                self._bad_request(conn, e)
                ok = False
                break
            self.stats["requests"] += 1
            if conn.in_flight >= self.cfg.max_in_flight:
                self.stats["overloaded"] += 1
                conn.fail(req, _KIND[type(req)], Overloaded(
                    f"{conn.in_flight} requests in flight on this connection (max_in_flight); retry later"))
                continue
            if isinstance(req, P.ReadLac):
                self._read_lac(conn, req)
                continue
            if isinstance(req, P.WriteLac) and not ordered and self._write_lac_now(conn, req):
                continue
            elif isinstance(req, P.LongPoll):
                nursery.start_soon(self._long_poll, conn, req)
            else:
                ordered.append(req)
            conn.in_flight += 1
        if adds:
            self._add_batch(conn, add_ids, adds)
        if ordered:
            nursery.start_soon(self._serve_in_order, conn, ordered)
        return ok

    def _admit_add(self, conn: BookieConnection, rid: int, ledger_id: int, size: int) -> bool:
        """Whether a decoded ADD may go to the storage (else it is answered OVERLOADED or TOO_LARGE)."""
        self.stats["requests"] += 1
        if conn.in_flight >= self.cfg.max_in_flight:
            self.stats["overloaded"] += 1
            conn.fail_ids(rid, ledger_id, P.Kind.ADD, Overloaded(
                f"{conn.in_flight} requests in flight on this connection (max_in_flight); retry later"))
            return False
        if conn.in_flight_bytes and conn.in_flight_bytes + size > self.cfg.max_in_flight_bytes:
            self.stats["overloaded"] += 1
            conn.fail_ids(rid, ledger_id, P.Kind.ADD, Overloaded(
                f"{conn.in_flight_bytes} bytes of adds in flight on this connection (max_in_flight_bytes); "
                "retry later"))
            return False
        total = self.in_flight_bytes_total
        if total and total + size > self.cfg.max_in_flight_bytes_total:
            self.stats["overloaded"] += 1
            conn.fail_ids(rid, ledger_id, P.Kind.ADD, Overloaded(
                f"{total} bytes of adds in flight on this bookie (max_in_flight_bytes_total); retry later"))
            return False
        if size > self.cfg.max_entry_bytes:
            conn.fail_ids(rid, ledger_id, P.Kind.ADD, EntryTooLarge(
                f"entry of {size} bytes exceeds max_entry_bytes={self.cfg.max_entry_bytes}"))
            return False
        return True

    # -- requests -----------------------------------------------------------------------
    def _add_batch(self, conn: BookieConnection, add_ids: list[int], adds: list[tuple]) -> None:
        """Admit the adds of one socket read and put them in the storage's open batch (its write starts
        at once if the disk is free); they are answered when that batch is durable, by its callback."""
        self.stats["adds"] += len(adds)
        nbytes = sum(len(add[3]) for add in adds)
        ok = P.encode_add_ok  # encoded now: the writer's thread may send it right after the fsync
        answer = ThreadAnswer(conn, b"".join([ok(rid, add[0], add[1]) for rid, add in zip(add_ids, adds)]))
        try:
            outcomes, batch = self.storage.join_adds(adds, answer.send_from_thread)
        except BookieError as e:  # the whole batch refused (e.g. read-only)
            outcomes, batch = [e] * len(adds), None
        except BaseException:
            conn.in_flight -= len(adds)
            conn.in_flight_bytes -= nbytes
            self.in_flight_bytes_total -= nbytes
            raise
        if batch is None:
            self._answer_adds(conn, add_ids, adds, nbytes, outcomes, None)
        elif outcomes.count(None) == len(outcomes):  # every add accepted: answered from the writer's thread
            started = time.perf_counter() if metrics.ENABLED else None
            batch.on_done(functools.partial(self._answered_adds, conn, len(adds), nbytes, answer, started))
        else:
            batch.on_done(functools.partial(self._answer_adds, conn, add_ids, adds, nbytes, outcomes))

    def _answered_adds(self, conn: BookieConnection, count: int, nbytes: int, answer: ThreadAnswer,
                       started: float | None, error: StorageError | None) -> None:
        if started is not None:  # one observation for the adds of one socket read: they share a latency
            metrics.BOOKIE_ADD_SECONDS.observe(time.perf_counter() - started)
        conn.in_flight -= count
        conn.in_flight_bytes -= nbytes
        self.in_flight_bytes_total -= nbytes
        if error is not None:
            self._storage_failed(error)
        elif answer.claim_for_loop():
            conn.send(answer.data)

    def _answer_adds(self, conn: BookieConnection, add_ids: list[int], adds: list[tuple], nbytes: int,
                     outcomes: list[BookieError | None], error: StorageError | None) -> None:
        conn.in_flight -= len(adds)
        conn.in_flight_bytes -= nbytes
        self.in_flight_bytes_total -= nbytes
        if error is not None:
            self._storage_failed(error)
            return
        ok = P.encode_add_ok
        frames = [ok(rid, add[0], add[1]) for rid, add, outcome in zip(add_ids, adds, outcomes, strict=True)
                  if outcome is None]
        conn.send_many(frames)
        if len(frames) < len(adds):
            for rid, add, outcome in zip(add_ids, adds, outcomes):
                if outcome is not None:
                    self.stats["add_errors"] += 1
                    conn.fail_ids(rid, add[0], P.Kind.ADD, outcome)

    def _storage_failed(self, error: StorageError) -> None:
        """Not durable: no answer; the node stops (the clients see the connection go)."""
        if self._fatal is None:
            self._fatal = error
            self._fatal_event.set()

    async def _serve_in_order(self, conn: BookieConnection, requests: list[P.Request]) -> None:
        for req in requests:
            try:
                conn.answer(await self._serve_one(req))
            except BookieError as e:
                self.stats["errors"] += 1
                conn.fail(req, _KIND[type(req)], e)
            finally:
                conn.in_flight -= 1

    async def _serve_one(self, req: P.Request) -> P.Response:
        match req:
            case P.ReadEntry():
                self.stats["reads"] += 1
                if req.fence:
                    # Recovery reads fence too (FAULTS.md "Fencing is not enough"): the fence is
                    # durable before the entry is read, so the old writer cannot add behind it.
                    assert req.master_key is not None
                    await self.storage.fence(req.ledger_id, req.master_key)
                started = time.perf_counter()
                data = await self._read(req.ledger_id, req.entry_id)
                if metrics.ENABLED:
                    metrics.BOOKIE_READ_SECONDS.observe(time.perf_counter() - started)
                return P.Response(req.request_id, P.Kind.READ, P.Status.OK, req.ledger_id, req.entry_id, data=data)
            case P.Fence():
                self.stats["fences"] += 1
                lac = await self.storage.fence(req.ledger_id, req.master_key)
                return P.Response(req.request_id, P.Kind.FENCE, P.Status.OK, req.ledger_id, lac=lac)
            case P.WriteLac():
                await self.storage.write_lac(req.ledger_id, req.lac, req.master_key)
                return P.Response(req.request_id, P.Kind.WRITE_LAC, P.Status.OK, req.ledger_id)
        raise AssertionError(f"not an ordered request: {req!r}")

    async def _read(self, ledger_id: int, entry_id: int) -> bytes:
        try:
            data = self.storage.read(ledger_id, entry_id)
            if inspect.isawaitable(data):
                data = await data
        except StorageError as e:  # one unreadable file is this copy's problem, not the node's
            log.error("event=read_failed ledger=%s entry=%s error=%r", ledger_id, entry_id, e)
            raise EntryCorrupt(f"ledger {ledger_id} entry {entry_id}: this bookie cannot read its copy ({e}); "
                               "read it from another replica") from None
        return data

    def _read_lac(self, conn: BookieConnection, req: P.ReadLac) -> None:
        try:
            lac = self.storage.lac(req.ledger_id)
        except BookieError as e:
            conn.fail(req, P.Kind.READ_LAC, e)
            return
        conn.answer(P.Response(req.request_id, P.Kind.READ_LAC, P.Status.OK, req.ledger_id, lac=lac))

    def _write_lac_now(self, conn: BookieConnection, req: P.WriteLac) -> bool:
        """Serve an explicit LAC without a task when it need not wait (the ledger's key is bound here):
        long polls wake at once. False: serve it in order (it binds the key durably first)."""
        try:
            if not self.storage.write_lac_nowait(req.ledger_id, req.lac, req.master_key):
                return False
        except BookieError as e:
            self.stats["errors"] += 1
            conn.fail(req, P.Kind.WRITE_LAC, e)
            return True
        conn.answer(P.Response(req.request_id, P.Kind.WRITE_LAC, P.Status.OK, req.ledger_id))
        return True

    async def _long_poll(self, conn: BookieConnection, req: P.LongPoll) -> None:
        """Answer once the LAC passes previous_lac (with the entry after it, if stored here)
        or at the timeout with the current LAC. The answer leaves from the step that raises the LAC
        (storage.watch_lac): no wake-up of this task in between; the task only bounds the wait."""
        self.stats["long_polls"] += 1
        answered = trio.Event()

        def answer() -> None:
            if not answered.is_set():
                answered.set()
                self._answer_long_poll(conn, req)

        cancel = None
        try:
            with trio.move_on_after(min(req.timeout_ms, self.cfg.max_long_poll_ms) / 1000):
                cancel = self.storage.watch_lac(req.ledger_id, req.previous_lac, answer)
                await answered.wait()
            answer()  # the timeout: the current LAC
        finally:
            if cancel is not None:
                cancel()
            conn.in_flight -= 1

    def _answer_long_poll(self, conn: BookieConnection, req: P.LongPoll) -> None:
        """The long poll's answer: the LAC, and the entry after previous_lac if the LAC passed it and
        this bookie can read it (else the reader fetches it from another replica)."""
        try:
            lac = self.storage.lac(req.ledger_id)
            data = None
            if lac > req.previous_lac:
                try:
                    data = self.storage.read(req.ledger_id, req.previous_lac + 1)
                except (NoSuchEntry, EntryCorrupt):
                    data = None
                except StorageError as e:  # one unreadable file is this copy's problem, not the node's
                    log.error("event=read_failed ledger=%s entry=%s error=%r", req.ledger_id, req.previous_lac + 1, e)
                    data = None
            conn.answer(P.Response(req.request_id, P.Kind.LONG_POLL, P.Status.OK, req.ledger_id, lac=lac, data=data))
        except BookieError as e:
            conn.fail(req, P.Kind.LONG_POLL, e)


_ADD_CODE = bytes((P.Kind.ADD,))
_KIND: dict[type, P.Kind] = {P.AddEntry: P.Kind.ADD, P.ReadEntry: P.Kind.READ, P.ReadLac: P.Kind.READ_LAC,
                             P.LongPoll: P.Kind.LONG_POLL, P.WriteLac: P.Kind.WRITE_LAC, P.Fence: P.Kind.FENCE}
