"""The bookie client (trio edge): one pipelined TCP connection per bookie.

    async with BookiePool({1: ("127.0.0.1", 31811), 2: (...), 3: (...)}) as pool:
        await pool.client(1).add(ledger_id, 0, master_key, packaged_entry)
        pending = [pool.client(b).start_add(ledger_id, 1, master_key, entry) for b in (1, 2, 3)]
        for p in pending:
            await p.result()

Every request is sent on the bookie's one connection, opened lazily on the first
request and again after a loss; requests from any number of tasks are pipelined
and matched to their answers by request id (answers may come out of order).
Requests queued while a send is in progress leave together in one send; a
request that is the only one in flight (an add awaited at a time) is written to
the socket in the step that starts it (edge/sockets.py), not a scheduler
pass later by the connection's writer task.

`start_*` methods are synchronous: they queue the request and return a
PendingRequest at once, so one task can keep thousands in flight without a task
each (BookKeeper's one object per operation, without its callbacks). Await
`pending.result()`, or pass `sink=` a Completions queue that collects finished
requests for one task to drain. The `async` methods (`add`, `read`, ...) are
start + result.

Outcomes: the value, or a typed error of bookie/errors.py from the bookie's
status. BookieUnavailable means no answer: the connection could not be opened
(later requests fail at once until a short backoff passes), was lost with the
request in flight, or the request timed out. For an add that means "outcome
unknown".
"""

from __future__ import annotations

import collections
import itertools
import logging
import struct
from collections.abc import Iterable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import trio

from bookie import protocol as P
from bookie.errors import BookieError, BookieUnavailable
from edge.outbox import Outbox
from edge.sockets import BOOKIE_CLIENT_TLS

log = logging.getLogger("quire.bookie.client")

DEFAULT_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 3.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
SWEEP_S = 0.05  # how often deadlines are checked: timeouts fire up to this late
RECEIVE_BYTES = 1 << 18
FLUSH_BYTES = 1 << 16  # queued frames of one connection are written at once past this (see _flush_now)
LONG_POLL_GRACE_S = 5.0  # a long poll's deadline is its timeout plus this


class Completions:
    """A queue of finished PendingRequests, for one task driving many requests.

    Unbounded, but it only ever holds requests its owner started."""

    def __init__(self) -> None:
        self._done: collections.deque[PendingRequest] = collections.deque()
        self._event = trio.Event()

    def _put(self, pending: PendingRequest) -> None:
        self._done.append(pending)
        self._event.set()

    def _put_many(self, pendings: list[PendingRequest]) -> None:
        """Several finished at once (the answers of one socket read), in order."""
        for p in pendings:
            self._put(p)

    def __len__(self) -> int:
        return len(self._done)

    def get_nowait(self) -> list[PendingRequest]:
        """Every finished request queued so far (maybe none)."""
        out = list(self._done)
        self._done.clear()
        return out

    async def get(self) -> list[PendingRequest]:
        """Wait until at least one request finished; return all that did."""
        while not self._done:
            await self._event.wait()
            self._event = trio.Event()
        return self.get_nowait()


class PendingRequest:
    """One request sent (or queued) to a bookie, not necessarily answered yet.

    `tag` is the caller's: e.g. the (entry id, bookie id) a Completions consumer needs."""

    __slots__ = ("client", "request_id", "kind", "tag", "deadline", "_value", "error", "_done", "_event", "_sink")

    def __init__(self, client: BookieClient, request_id: int, kind: P.Kind, deadline: float, tag: Any = None,
                 sink: Completions | None = None) -> None:
        self.client = client  # client.bookie_id says which bookie (set by BookiePool)
        self.request_id = request_id
        self.kind = kind
        self.tag = tag
        self.deadline = deadline
        self._value: Any = None
        self.error: BookieError | None = None  # of a finished request (None: it succeeded, or is not finished)
        self._done = False
        self._event: trio.Event | None = None
        self._sink = sink

    @property
    def done(self) -> bool:
        return self._done

    def outcome(self) -> Any:
        """The value of a finished request, or raise its error."""
        assert self._done, "the request is still in flight: await result()"
        if self.error is not None:
            raise self.error
        return self._value

    async def result(self) -> Any:
        """Wait for the answer; return its value or raise its typed error."""
        if self._done:
            await trio.lowlevel.checkpoint()
        else:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        return self.outcome()

    def _finish(self, value: Any, error: BookieError | None) -> None:
        if self._done:
            return
        self._value, self.error, self._done = value, error, True
        if self._event is not None:
            self._event.set()
        if self._sink is not None:
            self._sink._put(self)

    def _succeed_quietly(self) -> Completions | None:
        """Finish with success (None) like _finish, but leave telling the sink to the caller, which
        collects the sinks of one socket read's answers and tells each once; returns the sink."""
        self._done = True
        if self._event is not None:
            self._event.set()
        return self._sink


class BookieClient:
    """The client of one bookie at host:port.

    `async with BookieClient(host, port) as c:`, or `c.start(nursery)` and
    `await c.aclose()` (BookiePool does that). `timeout_s` bounds each request
    unless the call gives its own."""

    def __init__(self, host: str, port: int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, max_frame_bytes: int = (64 << 20),
                 bookie_id: int | None = None, request_ids: Iterator[int] | None = None, tls: Any = None) -> None:
        self.tls = tls if tls is not None else BOOKIE_CLIENT_TLS.get()  # TLS when set: `async wrap(stream, host)` (clusterd.daemon.tls_streams.ClientTls); refused: OSError
        self.host, self.port = host, port
        self.bookie_id = bookie_id
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._nursery: trio.Nursery | None = None
        self._stack = AsyncExitStack()
        self._scope: trio.CancelScope | None = None  # the current connection's
        self._connecting = False
        self._connected = False
        self._closed = False
        self._retry_at = 0.0
        self._backoff_s = BACKOFF_MIN_S
        self._ids = request_ids if request_ids is not None else itertools.count(1)
        self._clock = 0.0  # trio time, refreshed by the sweeper: no clock read per request
        self._pending: dict[int, PendingRequest] = {}
        self._by_deadline: collections.deque[PendingRequest] = collections.deque()  # default timeouts: in order
        self._other_deadlines: list[PendingRequest] = []  # per-call timeouts and long polls
        # Requests started while connecting wait in it for the connection (edge/outbox.py).
        self._outbox = Outbox()
        self.stats: collections.Counter[str] = collections.Counter()

    def __repr__(self) -> str:
        return f"BookieClient({self.host}:{self.port})"

    # -- lifetime ------------------------------------------------------------------------
    def start(self, nursery: trio.Nursery) -> None:
        """Run the client's connection tasks in `nursery` (which must outlive the client's use)."""
        self._nursery = nursery

    async def __aenter__(self) -> BookieClient:
        self._stack = AsyncExitStack()
        self.start(await self._stack.enter_async_context(trio.open_nursery()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.aclose()
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()  # a connection attempt in progress, too
        finally:
            # Only our own tasks are in the nursery: the body's exception propagates unwrapped.
            await self._stack.aclose()

    async def aclose(self) -> None:
        """Fail every pending request (BookieUnavailable) and drop the connection."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        self._fail_all(f"the client of bookie {self.host}:{self.port} was closed")
        await trio.lowlevel.checkpoint()

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def statistics(self) -> dict[str, Any]:
        return {"address": f"{self.host}:{self.port}", "connected": self._connected, "in_flight": len(self._pending),
                "queued_frames": self._outbox.queued_frames, "sends": self._outbox.stats.writes, **self.stats}

    # -- requests: start_* queue and return at once -------------------------------------
    def start_add(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool = False, *,
                  timeout_s: float | None = None, tag: Any = None, sink: Completions | None = None) -> PendingRequest:
        """Queue an ADD of the packaged entry `data`; the result is None once the bookie has it on disk."""
        rid = next(self._ids)
        frame = P.encode_add(rid, ledger_id, entry_id, master_key, data, recovery)
        return self._submit(rid, P.Kind.ADD, frame, timeout_s, tag, sink)

    def start_read(self, ledger_id: int, entry_id: int, fence: bool = False, master_key: bytes | None = None, *,
                   timeout_s: float | None = None, tag: Any = None, sink: Completions | None = None) -> PendingRequest:
        """Queue a READ; the result is the packaged entry. fence=True (recovery reads) fences the
        ledger first and needs the master key."""
        if fence and (master_key is None or len(master_key) != P.MASTER_KEY_BYTES):
            raise ValueError("a fencing read needs the ledger's 32-byte master key")
        rid = next(self._ids)
        frame = P.encode_request(P.ReadEntry(rid, ledger_id, entry_id, fence, master_key if fence else None))
        return self._submit(rid, P.Kind.READ, frame, timeout_s, tag, sink)

    def start_read_lac(self, ledger_id: int, *, timeout_s: float | None = None, tag: Any = None,
                       sink: Completions | None = None) -> PendingRequest:
        rid = next(self._ids)
        return self._submit(rid, P.Kind.READ_LAC, P.encode_request(P.ReadLac(rid, ledger_id)), timeout_s, tag, sink)

    def start_long_poll(self, ledger_id: int, previous_lac: int, timeout_ms: int, *, tag: Any = None,
                        sink: Completions | None = None) -> PendingRequest:
        """Queue a LONG_POLL; the result is (lac, packaged entry previous_lac + 1 or None)."""
        rid = next(self._ids)
        frame = P.encode_request(P.LongPoll(rid, ledger_id, previous_lac, timeout_ms))
        return self._submit(rid, P.Kind.LONG_POLL, frame, timeout_ms / 1000 + LONG_POLL_GRACE_S, tag, sink)

    def start_write_lac(self, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float | None = None,
                        tag: Any = None, sink: Completions | None = None) -> PendingRequest:
        rid = next(self._ids)
        frame = P.encode_request(P.WriteLac(rid, ledger_id, lac, master_key))
        return self._submit(rid, P.Kind.WRITE_LAC, frame, timeout_s, tag, sink)

    def start_fence(self, ledger_id: int, master_key: bytes, *, timeout_s: float | None = None, tag: Any = None,
                    sink: Completions | None = None) -> PendingRequest:
        """Queue a FENCE; the result is the bookie's LAC of the ledger, once the fence is durable."""
        rid = next(self._ids)
        return self._submit(rid, P.Kind.FENCE, P.encode_request(P.Fence(rid, ledger_id, master_key)), timeout_s,
                            tag, sink)

    # -- requests: awaited ---------------------------------------------------------------
    async def add(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool = False, *,
                  timeout_s: float | None = None) -> None:
        """Store the packaged entry `data`; returns once it is durable on the bookie."""
        await self.start_add(ledger_id, entry_id, master_key, data, recovery, timeout_s=timeout_s).result()

    async def read(self, ledger_id: int, entry_id: int, fence: bool = False, master_key: bytes | None = None, *,
                   timeout_s: float | None = None) -> bytes:
        """The packaged entry (verify it with bookie.entry.Digester); NoSuchEntry if not stored here."""
        return await self.start_read(ledger_id, entry_id, fence, master_key, timeout_s=timeout_s).result()

    async def read_lac(self, ledger_id: int, *, timeout_s: float | None = None) -> int:
        """The bookie's last add confirmed of the ledger (-1 if none)."""
        return await self.start_read_lac(ledger_id, timeout_s=timeout_s).result()

    async def long_poll(self, ledger_id: int, previous_lac: int, timeout_ms: int) -> tuple[int, bytes | None]:
        """Wait until the bookie's LAC passes previous_lac, or timeout_ms: (lac, entry previous_lac + 1
        if the bookie stores it and the LAC passed, else None)."""
        return await self.start_long_poll(ledger_id, previous_lac, timeout_ms).result()

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float | None = None) -> None:
        """Record an explicit LAC (for readers of a writer that has gone quiet)."""
        await self.start_write_lac(ledger_id, lac, master_key, timeout_s=timeout_s).result()

    async def fence(self, ledger_id: int, master_key: bytes, *, timeout_s: float | None = None) -> int:
        """Fence the ledger on this bookie (no more non-recovery adds); returns its LAC here."""
        return await self.start_fence(ledger_id, master_key, timeout_s=timeout_s).result()

    # -- machinery -----------------------------------------------------------------------
    def _submit(self, rid: int, kind: P.Kind, frame: bytes, timeout_s: float | None, tag: Any,
                sink: Completions | None) -> PendingRequest:
        if not self._connected and not self._connecting:
            self._clock = trio.current_time()
        deadline = self._clock + (self.timeout_s if timeout_s is None else timeout_s)
        pending = PendingRequest(self, rid, kind, deadline, tag, sink)
        if self._closed or self._nursery is None:
            pending._finish(None, BookieUnavailable(f"the client of bookie {self.host}:{self.port} is not running"))
            return pending
        if not (self._connected or self._connecting):
            now = self._clock
            if now < self._retry_at:
                self.stats["fast_failures"] += 1
                pending._finish(None, BookieUnavailable(
                    f"bookie {self.host}:{self.port} is unreachable (retrying in {self._retry_at - now:.2f} s)"))
                return pending
            self._connecting = True
            self._nursery.start_soon(self._connection)
        self._pending[rid] = pending
        (self._by_deadline if timeout_s is None else self._other_deadlines).append(pending)
        # Written through only as the only request in flight (an add awaited one at a time), not by
        # the writer task a scheduler pass later; requests started together are sent together.
        outbox = self._outbox
        if outbox.idle and self._lone():
            outbox.send(frame)
        else:
            outbox.append(frame)
        if outbox.queued_bytes >= FLUSH_BYTES:
            # Handed to the kernel now, or the bookie would get a thousand appends of one step as one batch and the
            # two sides take turns (22,000 vs 19,250 entries/s, E=Qw=Qa=3 100 B against clusterd, A/B interleaved).
            outbox.push()
        return pending

    def _lone(self) -> bool:
        """Whether the request just submitted is the only one in flight, long polls aside (a tailing
        reader keeps one parked)."""
        pending = self._pending
        if len(pending) == 1:
            return True
        return len(pending) <= 4 and sum(p.kind is not P.Kind.LONG_POLL for p in pending.values()) == 1

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        self._outbox.detach()
        self._by_deadline.clear()
        self._other_deadlines.clear()
        for p in pending.values():
            p._finish(None, BookieUnavailable(f"{reason}; the request's outcome is unknown"))

    async def _connection(self) -> None:
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(self.host, self.port)
                if self.tls is not None:
                    stream = await self.tls.wrap(stream, self.host)
        except (OSError, trio.TooSlowError) as e:
            self._connecting = False
            self._retry_at = trio.current_time() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
            self.stats["connect_failures"] += 1
            self._fail_all(f"cannot connect to bookie {self.host}:{self.port}: {e!r}")
            return
        if self._closed:  # closed while connecting (e.g. the pool dropped a moved bookie)
            self._connecting = False
            await stream.aclose()
            return
        self._connecting, self._connected, self._backoff_s = False, True, BACKOFF_MIN_S
        self.stats["connects"] += 1
        reason = "the bookie closed the connection"
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._outbox.pump, stream)
                nursery.start_soon(self._sweeper)
                reason = await self._reader(stream)
                nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
            # Nurseries wrap errors in groups: a reset bookie must fail its requests, not the pool.
            reason = f"connection error {group.exceptions[0]!r}"
        finally:
            self._connected, self._scope = False, None
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self._fail_all(f"lost the connection to bookie {self.host}:{self.port} ({reason})")
            log.info("event=bookie_connection_lost bookie=%s:%s reason=%r", self.host, self.port, reason)

    async def _reader(self, stream: trio.SocketStream) -> str:
        """Match answers to pending requests until the connection ends; returns why."""
        splitter = P.FrameSplitter(self.max_frame_bytes)
        pending = self._pending
        add_ok_size, add_ok_code, rid_of = _ADD_OK_SIZE, _ADD_OK_CODE, _RID.unpack_from
        while True:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return "the bookie closed the connection"
            # Successful ADDs of this read: finished at once, their sinks told once per run of them
            # (one driver pass for many acks), before any other answer so that order is kept.
            acked: list[PendingRequest] = []
            sink: Completions | None = None
            try:
                for body in splitter.feed(data):
                    if len(body) == add_ok_size and body[:2] == add_ok_code and body[10] == 0:
                        # The hot path, a successful ADD: only the request id matters.
                        p = pending.pop(rid_of(body, 2)[0], None)
                        if p is None or p._done:
                            continue  # timed out already
                        if p.kind is not P.Kind.ADD:
                            pending[p.request_id] = p  # failed with the others as the connection ends
                            return f"protocol violation: an ADD answer to a {p.kind.name} request"
                        p_sink = p._succeed_quietly()
                        if p_sink is not None:
                            if p_sink is not sink and acked:
                                done, acked = acked, []
                                sink._put_many(done)
                            sink = p_sink
                            acked.append(p)
                        continue
                    if acked:
                        done, acked = acked, []
                        sink._put_many(done)
                    resp = P.decode_response(body)
                    p = pending.pop(resp.request_id, None)
                    if p is None:
                        continue  # timed out already
                    if resp.kind is not p.kind and resp.status is P.Status.OK:
                        pending[p.request_id] = p
                        return f"protocol violation: a {resp.kind.name} answer to a {p.kind.name} request"
                    _complete(p, resp)
                if splitter.error is not None:
                    raise splitter.error
            except P.DecodeError as e:
                return f"bad frame from the bookie: {e}"
            finally:
                if acked:  # the read's last run of acks, also when a bad frame or a violation ends it
                    done, acked = acked, []
                    sink._put_many(done)

    async def _sweeper(self) -> None:
        """Fail requests whose deadline passed (the connection stays: a slow disk is not a lost link)."""
        while True:
            await trio.sleep(SWEEP_S)
            self._clock = now = trio.current_time()
            queue = self._by_deadline
            while queue and (queue[0]._done or queue[0].deadline <= now):
                self._expire(queue.popleft())
            if self._other_deadlines:
                others = self._other_deadlines
                self._other_deadlines = [p for p in others if not p._done and p.deadline > now]
                for p in others:
                    self._expire(p)

    def _expire(self, p: PendingRequest) -> None:
        if not p._done and p.deadline <= trio.current_time():
            self._pending.pop(p.request_id, None)
            self.stats["timeouts"] += 1
            p._finish(None, BookieUnavailable(
                f"bookie {self.host}:{self.port} did not answer a {p.kind.name} in time; its outcome is unknown"))


_ADD_OK_SIZE = len(P.encode_response(P.Response(0, P.Kind.ADD, P.Status.OK, 0, 0))) - P.FRAME.size
_ADD_OK_CODE = bytes((P.VERSION, P.Kind.ADD | P.RESPONSE_BIT))
_RID = struct.Struct(">Q")


def _complete(p: PendingRequest, resp: P.Response) -> None:
    if resp.status is not P.Status.OK:
        p._finish(None, resp.error())
    elif resp.kind is P.Kind.ADD or resp.kind is P.Kind.WRITE_LAC:
        p._finish(None, None)
    elif resp.kind is P.Kind.READ:
        p._finish(resp.data, None)
    elif resp.kind is P.Kind.LONG_POLL:
        p._finish((resp.lac, resp.data), None)
    else:  # READ_LAC, FENCE
        p._finish(resp.lac, None)


class BookiePool:
    """One BookieClient per bookie id, their connection tasks in the pool's nursery.

    `async with BookiePool(addresses) as pool:`; `pool.client(bookie_id)`. Addresses
    come from the metastore's registrations (bookie.registration.list_bookies) or
    from the cluster config; `update()` replaces them (a moved bookie gets a new client)."""

    def __init__(self, addresses: dict[int, tuple[str, int]] | None = None, **client_options: Any) -> None:
        self._addresses: dict[int, tuple[str, int]] = dict(addresses or {})
        self._clients: dict[int, BookieClient] = {}
        self._options = client_options
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> BookiePool:
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            for c in list(self._clients.values()):
                await c.aclose()
            self._clients.clear()
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
        finally:
            await self._stack.aclose()
            self._nursery = None

    @property
    def bookies(self) -> list[int]:
        return sorted(self._addresses)

    def knows(self, bookie_id: int) -> bool:
        """Whether the pool has an address for the bookie (`bookie_id in pool.bookies`, cheaply)."""
        return bookie_id in self._addresses

    def address(self, bookie_id: int) -> tuple[str, int]:
        return self._addresses[bookie_id]

    def update(self, addresses: dict[int, tuple[str, int]] | Iterable[Any]) -> None:
        """Replace the known addresses: a dict id -> (host, port), or BookieInfo records."""
        if not isinstance(addresses, dict):
            addresses = {b.id: (b.host, b.port) for b in addresses}
        for bookie_id, client in list(self._clients.items()):
            if addresses.get(bookie_id) != (client.host, client.port):
                del self._clients[bookie_id]
                if self._nursery is not None:
                    self._nursery.start_soon(client.aclose)
        self._addresses = dict(addresses)

    def start_add(self, bookie_ids: Iterable[int], ledger_id: int, entry_id: int, master_key: bytes, data: bytes,
                  recovery: bool = False, *, tag: Any = None, sink: Completions | None = None) -> list[PendingRequest]:
        """Queue one ADD to each of `bookie_ids` (an entry's write quorum), encoded once.
        Each PendingRequest's `.client.bookie_id` says which bookie it went to."""
        rid = next(self._ids)
        frame = P.encode_add(rid, ledger_id, entry_id, master_key, data, recovery)
        clients = self._clients
        out = []
        for b in bookie_ids:
            client = clients.get(b) or self.client(b)
            out.append(client._submit(rid, P.Kind.ADD, frame, None, tag, sink))
        return out

    def client(self, bookie_id: int) -> BookieClient:
        """The client of bookie `bookie_id` (BookieUnavailable if its address is unknown)."""
        client = self._clients.get(bookie_id)
        if client is None:
            if self._nursery is None:
                raise RuntimeError("use the pool inside `async with BookiePool(...)`")
            if bookie_id not in self._addresses:
                raise BookieUnavailable(f"bookie {bookie_id} is not registered (no known address)")
            host, port = self._addresses[bookie_id]
            # One id sequence for the pool: start_add sends the same frame to several bookies.
            client = self._clients[bookie_id] = BookieClient(host, port, bookie_id=bookie_id, request_ids=self._ids,
                                                             **self._options)
            client.start(self._nursery)
        return client

    def statistics(self) -> dict[int, dict[str, Any]]:
        return {bookie_id: c.statistics() for bookie_id, c in self._clients.items()}
