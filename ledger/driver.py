"""Runs pure ledger operations against real bookies and the metastore (trio edge).

An OpDriver serves one ledger. It holds any number of operations (a Writer,
ReadEntryOps, a RecoveryOp, ...), executes their actions in order and feeds
every outcome back to the operation that asked, as an event:

- bookie requests (SendAdd, SendRead, ...) become BookiePool `start_*` calls
  whose PendingRequests land in one completion queue, so one task can keep
  thousands in flight (an entry's write quorum is encoded once);
- WriteMetadata / ReadMetadata / ChooseBookies run as small tasks in the
  client's nursery (a lost CAS, or one whose outcome is unknown, comes back as
  MetadataBadVersion: the operation re-reads and decides, seed 001);
- Tick every `tick_s`; Idle to an operation that asked (RequestIdle) once every
  task runnable when it asked (the application woken by an acknowledgement)
  has had its turn: the pump yields to them, then sends it;
- what is meant for the application (Acknowledge, FailAdds, Completed,
  Failed) goes to the handler registered with the operation.

Outcomes are fed to the operations by the pump task, or, with `inline=True`
(the WriteHandle's driver), at once by whichever task finished the request
(the bookie connection's reader) while the pump runs: an acknowledgement then
wakes the application directly, one event-loop pass sooner and without a pump
wake-up per answer. The successful adds of one socket read arrive together
(in their order, never past another answer of that read) and reach the Writer
as `add_acked(bookie, entry)` calls, without an event object each. Either way events reach an operation one at a time, in
the order they were posted, never while its actions are being executed.

The driver makes no protocol decision of its own (STYLE.md habit 2).
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import stamina
import trio

from bookie import errors as B
from bookie.client import BookiePool, Completions, PendingRequest
from ledger import actions as A
from ledger import placement
from ledger.errors import LedgerError, MetadataConflict
from ledger.manager import LedgerManager
from ledger.writer import Writer
from metastore.errors import MetastoreError

log = logging.getLogger("quire.ledger.driver")

Handler = Callable[[A.Action], None]
T = TypeVar("T")
LONG_POLL_MS = 1_000
METADATA_RETRY_S = 0.05  # the first backoff of a metastore call the driver retries
METADATA_RETRY_MAX_S = 1.0  # the longest: an outage of the metastore is not a storm of reads


class Context(Protocol):
    """What the driver needs of the LedgerClient."""
    pool: BookiePool
    manager: LedgerManager
    nursery: trio.Nursery
    rng: random.Random

    async def writable_bookies(self) -> list[int]: ...


class _Sink(Completions):
    """The driver's completion queue: finished bookie requests wake its pump."""

    def __init__(self, driver: OpDriver) -> None:
        super().__init__()
        self._driver = driver

    def _put(self, pending: PendingRequest) -> None:
        self._driver._post(pending)

    def _put_many(self, pendings: list[PendingRequest]) -> None:
        self._driver._post_many(pendings)


class OpDriver:
    def __init__(self, ctx: Context, ledger_id: int, master_key: bytes, *, tick_s: float = 0.02,
                 long_poll_ms: int = LONG_POLL_MS, inline: bool = False) -> None:
        self.ctx = ctx
        self.inline = inline
        self._depth = 0  # > 0 while actions are executed or an event is dispatched: events wait in the inbox
        self._until: Callable[[], bool] | None = None  # the running pump's condition (None: no pump runs)
        self._idle_wanted: set[int] = set()  # operations that asked for an Idle event (RequestIdle)
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.tick_s = tick_s
        self.long_poll_ms = long_poll_ms
        self._ops: dict[int, Any] = {}
        self._add_acked: dict[int, Callable[[int, int], list[A.Action]]] = {}  # ops with the fast ack path
        self._add_acked_many: dict[int, Callable[[int, list[int]], list[A.Action]]] = {}  # ... and its batched form
        self._handlers: dict[int, Handler] = {}
        self._ids = itertools.count(1)
        self._inbox: collections.deque[Any] = collections.deque()
        self._wake = trio.Event()
        self._sink = _Sink(self)
        self.stats = {"requests": 0, "events": 0, "ticks": 0}

    # -- operations ----------------------------------------------------------------------------
    def add(self, op: Any, handler: Handler, *, start: bool = True) -> int:
        op_id = next(self._ids)
        self._ops[op_id] = op
        self._handlers[op_id] = handler
        if isinstance(op, Writer):  # its successful adds skip the event objects: op.add_acked(bookie, entry)
            self._add_acked[op_id] = op.add_acked
            self._add_acked_many[op_id] = op.add_acked_many
        if start:
            self.execute(op_id, op.start())
        return op_id

    def remove(self, op_id: int) -> None:
        self._ops.pop(op_id, None)
        self._handlers.pop(op_id, None)
        self._add_acked.pop(op_id, None)
        self._add_acked_many.pop(op_id, None)

    @property
    def idle(self) -> bool:
        return not self._ops

    # -- executing actions ------------------------------------------------------------------------
    def execute(self, op_id: int, actions: list[A.Action]) -> None:
        self._execute_nested(op_id, actions)
        if self._inbox and not self._depth and self._until is not None and self.inline:
            self._drain()  # outcomes posted while executing (a bookie refused at once)

    def _execute(self, op_id: int, actions: list[A.Action]) -> None:
        i, n = 0, len(actions)
        while i < n:
            action = actions[i]
            if isinstance(action, A.SendAdd):
                j = i + 1  # an entry's write quorum comes as consecutive SendAdds: encode it once
                while (j < n and isinstance(actions[j], A.SendAdd) and actions[j].entry_id == action.entry_id
                       and actions[j].data is action.data and actions[j].recovery == action.recovery):
                    j += 1
                self._adds(op_id, actions[i:j])
                i = j
                continue
            self._execute_one(op_id, action)
            i += 1

    def _execute_one(self, op_id: int, action: A.Action) -> None:
        if isinstance(action, (A.SendRead, A.SendFence, A.SendReadLac, A.SendLac, A.SendLongPoll)):
            self._request(op_id, action)
        elif isinstance(action, (A.WriteMetadata, A.ReadMetadata)):
            self.ctx.nursery.start_soon(self._metadata, op_id, action)
        elif isinstance(action, A.ChooseBookies):
            self.ctx.nursery.start_soon(self._choose, op_id, action)
        elif isinstance(action, A.RequestIdle):
            self._idle_wanted.add(op_id)
            self._wake.set()
        else:
            handler = self._handlers.get(op_id)
            if handler is not None:
                handler(action)

    def _adds(self, op_id: int, adds: list[A.SendAdd]) -> None:
        first = adds[0]
        pool = self.ctx.pool
        known = [a.bookie for a in adds if pool.knows(a.bookie)]
        if len(known) < len(adds):
            for a in adds:
                if a.bookie not in known:
                    self._post((op_id, A.AddFailed(a.bookie, a.entry_id, B.BookieUnavailable(
                        f"bookie {a.bookie} is not registered"))))
        if known:
            self.stats["requests"] += len(known)
            pool.start_add(known, self.ledger_id, first.entry_id, self.master_key, first.data,
                           first.recovery, tag=(op_id, first), sink=self._sink)

    def _request(self, op_id: int, action: Any) -> None:
        try:
            client = self.ctx.pool.client(action.bookie)
        except B.BookieUnavailable as e:
            if not isinstance(action, A.SendLac):
                self._post((op_id, _failure(action, action.bookie, e)))
            return
        self.stats["requests"] += 1
        lid, key, tag, sink = self.ledger_id, self.master_key, (op_id, action), self._sink
        match action:
            case A.SendRead(_, entry_id, fence):
                client.start_read(lid, entry_id, fence, key if fence else None, tag=tag, sink=sink)
            case A.SendFence():
                client.start_fence(lid, key, tag=tag, sink=sink)
            case A.SendReadLac():
                client.start_read_lac(lid, tag=tag, sink=sink)
            case A.SendLac(_, lac):
                client.start_write_lac(lid, lac, key)  # fire and forget
            case A.SendLongPoll(_, _, previous_lac):
                client.start_long_poll(lid, previous_lac, self.long_poll_ms, tag=tag, sink=sink)

    async def _metadata(self, op_id: int, action: A.WriteMetadata | A.ReadMetadata) -> None:
        manager = self.ctx.manager
        try:
            if isinstance(action, A.ReadMetadata):
                read = await self._while_alive(op_id, "metadata_retry", lambda: manager.read(self.ledger_id))
                if read is None:
                    return
                event: A.Event = A.MetadataRead(*read)
            else:
                event = A.MetadataWritten(await manager.write(action.metadata, action.expected_version))
        except MetadataConflict:
            event = A.MetadataBadVersion()
        except LedgerError as e:  # NoSuchLedger: deleted under us
            self._post((op_id, A.Failed(e)))
            return
        except MetastoreError as e:  # a write's (reads are retried): not retried, its outcome is unknown
            log.info("event=metadata_retry ledger=%d error=%r", self.ledger_id, e)
            await trio.sleep(METADATA_RETRY_S)  # paces the operation's re-read through a metastore outage
            event = A.MetadataBadVersion()  # the operation re-reads and decides (seed 001)
        self._post((op_id, event))

    async def _choose(self, op_id: int, action: A.ChooseBookies) -> None:
        # a metastore hiccup is not "no bookies": ask again
        writable = await self._while_alive(op_id, "placement_retry", self.ctx.writable_bookies)
        if writable is None:
            return
        chosen = placement.choose_outside(writable, action.exclude, action.count, self.ctx.rng)
        self._post((op_id, A.BookiesChosen(chosen)))

    async def _while_alive(self, op_id: int, event: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """`call()`, again after each MetastoreError (stamina's backoff from METADATA_RETRY_S, logged as
        `event`) while operation `op_id` lives; None once it is gone (an answer would be dropped)."""
        def metastore_hiccup(error: Exception) -> bool:
            if not isinstance(error, MetastoreError):
                return False
            log.info("event=%s ledger=%d error=%r", event, self.ledger_id, error)
            return True
        async for attempt in stamina.retry_context(on=metastore_hiccup, attempts=None, timeout=None,
                                                  wait_initial=METADATA_RETRY_S, wait_max=METADATA_RETRY_MAX_S,
                                                  wait_jitter=METADATA_RETRY_S):
            with attempt:
                if op_id not in self._ops:
                    return None
                return await call()
        raise AssertionError("unreachable: the context has no attempt or time limit")

    # -- events --------------------------------------------------------------------------------------
    def _post(self, item: Any) -> None:
        self._inbox.append(item)
        if self.inline and not self._depth and self._until is not None:
            self._drain()
            if not self._until():
                return  # the pump has nothing to do: no wake-up
        self._wake.set()

    def _post_many(self, items: list[Any]) -> None:
        """_post for the answers of one socket read: one pass over the inbox for all of them, and one
        writer call for each run of its successful adds (see _drain)."""
        self._inbox.append(items)
        if self.inline and not self._depth and self._until is not None:
            self._drain()
            if not self._until():
                return
        self._wake.set()

    def _drain(self) -> None:
        """Dispatch the inbox, oldest first, including what the dispatching itself posts."""
        inbox, fast, stats = self._inbox, self._add_acked, self.stats
        while inbox:
            item = inbox.popleft()
            if type(item) is list:  # one socket read's answers (_post_many)
                self._drain_run(item)
                continue
            if type(item) is PendingRequest and item.error is None and type(item.tag[1]) is A.SendAdd:
                op_id, action = item.tag  # the hot path, an add that succeeded: no event object
                add_acked = fast.get(op_id)
                if add_acked is not None:
                    stats["events"] += 1
                    actions = add_acked(item.client.bookie_id, action.entry_id)
                    if actions:
                        self._execute_nested(op_id, actions)
                    continue
            self._dispatch(*self._event_of(item))

    def _drain_run(self, items: list[PendingRequest]) -> None:
        """Dispatch one socket read's answers in order: each run of successful adds of one writer
        from one bookie is one add_acked_many call (the hot path: no event object per ack)."""
        many, stats = self._add_acked_many, self.stats
        i, n = 0, len(items)
        while i < n:
            item = items[i]
            op_id, action = item.tag
            if item.error is None and type(action) is A.SendAdd and op_id in many:
                bookie = item.client.bookie_id
                entry_ids = [action.entry_id]
                i += 1
                while i < n:
                    nxt = items[i]
                    tag = nxt.tag
                    if (nxt.error is not None or tag[0] != op_id or type(tag[1]) is not A.SendAdd
                            or nxt.client.bookie_id != bookie):
                        break
                    entry_ids.append(tag[1].entry_id)
                    i += 1
                stats["events"] += len(entry_ids)
                actions = many[op_id](bookie, entry_ids)
                if actions:
                    self._execute_nested(op_id, actions)
                continue
            self._dispatch(*self._event_of(item))
            i += 1

    def _execute_nested(self, op_id: int, actions: list[A.Action]) -> None:
        """_execute with draining held off: what it posts waits in the inbox for the loop that drains it."""
        self._depth += 1
        try:
            self._execute(op_id, actions)
        finally:
            self._depth -= 1

    def _event_of(self, item: Any) -> tuple[int, A.Event]:
        if isinstance(item, tuple):
            return item
        op_id, action = item.tag
        bookie = item.client.bookie_id
        error = item.error
        if error is not None:
            return op_id, _failure(action, bookie, error)
        if type(action) is A.SendAdd:  # the hot path
            return op_id, A.AddAcked(bookie, action.entry_id)
        value = item.outcome()
        match action:
            case A.SendAdd(_, entry_id):
                return op_id, A.AddAcked(bookie, entry_id)
            case A.SendRead(_, entry_id):
                return op_id, A.ReadAnswered(bookie, entry_id, value)
            case A.SendFence():
                return op_id, A.FenceAnswered(bookie, value)
            case A.SendReadLac():
                return op_id, A.LacAnswered(bookie, value)
            case A.SendLongPoll():
                return op_id, A.LongPollAnswered(bookie, value[0], value[1])
        raise TypeError(f"no event for {action!r}")

    def _dispatch(self, op_id: int, event: A.Event) -> None:
        op = self._ops.get(op_id)
        if op is None:
            return
        self.stats["events"] += 1
        if isinstance(event, A.Failed):  # the driver's own verdict (the ledger vanished)
            handler = self._handlers.get(op_id)
            if handler is not None:
                handler(event)
            return
        self._execute_nested(op_id, op.step(event))

    async def pump(self, until: Callable[[], bool]) -> None:
        """Feed events to the operations until `until()` holds. One pump per driver at a time."""
        next_tick = trio.current_time() + self.tick_s
        self._until = until
        try:
            while not until():
                if not self._inbox and not self._idle_wanted:
                    with trio.move_on_at(next_tick):
                        await self._wake.wait()
                self._wake = trio.Event()
                asked_before = bool(self._idle_wanted)  # by another task, while this one waited
                items = len(self._inbox)
                self._drain()
                if trio.current_time() >= next_tick:
                    self.stats["ticks"] += 1
                    next_tick = trio.current_time() + self.tick_s
                    for op_id in list(self._ops):
                        self._dispatch(op_id, A.Tick())
                if self._idle_wanted:
                    await self._idle(1 if asked_before else 2)
                elif not items:
                    await trio.lowlevel.checkpoint()
        finally:
            self._until = None

    async def _idle(self, passes: int) -> None:
        """Send Idle to the operations that asked, once the tasks runnable when they asked have run.
        A request made in scheduler pass k wakes the application (an acknowledgement) for pass k + 1:
        this task must resume in k + 2 at the earliest. Woken by the request (made by another task
        while this one waited), it runs in k + 1: one yield. Asked during its own dispatching, it is
        in pass k: two."""
        for _ in range(passes):
            await trio.lowlevel.checkpoint()
        wanted, self._idle_wanted = self._idle_wanted, set()
        for op_id in sorted(wanted):
            self._dispatch(op_id, A.Idle())


def _failure(action: Any, bookie: int, error: B.BookieError) -> A.Event:
    match action:
        case A.SendAdd(_, entry_id):
            return A.AddFailed(bookie, entry_id, error)
        case A.SendRead(_, entry_id):
            return A.ReadFailed(bookie, entry_id, error)
        case A.SendFence():
            return A.FenceFailed(bookie, error)
        case A.SendReadLac():
            return A.LacFailed(bookie, error)
        case A.SendLongPoll():
            return A.LongPollFailed(bookie, error)
    raise TypeError(f"no failure event for {action!r}")
