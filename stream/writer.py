"""The single writer of a named log (edge): ownership, takeover, record batching and rolling.

Ownership is tracked, not elected (seed 004): a writer queues an ephemeral sequential znode under
the log's `owner/` (metastore/client/recipes.py's Lock) and writes once it is first. What makes
a single writer safe is fencing, not the lock: the takeover, roll and completion protocol is
stream/ownership.py's (pure, also run by the simulator); this module executes its actions on the
metastore and the ledger client. A deposed owner finds out at its next append (LedgerFenced from
the bookies) or at its next roll (the CAS fails): every write from then on fails with LogFenced,
and none of them is visible, since readers stop at the end its successor recovered.

Records are packed into record sets (stream/record_set.py): one is sealed and appended at once
when fewer than `max_in_flight` entries are in flight, else it fills until one is acknowledged
(so a lone record goes out alone and a stream of them is batched). Acknowledgements come in
entry order; a record's position is known when its set is sealed and returned once it is
acknowledged. A segment rolls, between two entries, once it holds roll_bytes or is roll_ms old.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import Any

import trio

from ledger.errors import CloseConflict, LedgerClosed, LedgerError, LedgerFenced, LedgerInRecovery
from ledger.handles import WriteHandle
from metastore.client.recipes import Lock
from metastore.errors import MetastoreError
from stream import ownership
from stream.errors import LogFenced, OwnershipTaken, StreamError
from stream.namespace import ListChanged, Namespace, ledger_password, now_ms
from stream.position import Position
from stream.record_set import RecordSetBuilder, decode
from stream.segment import Segment

log = logging.getLogger("quire.stream.writer")

DEFAULT_MAX_IN_FLIGHT = 1
_FENCED = (LedgerFenced, LedgerClosed, LedgerInRecovery, CloseConflict)


class _Batch:
    """The records of one record set: sealed into entry `entry_id` of segment `seq`, then acknowledged."""

    __slots__ = ("builder", "seq", "entry_id", "pending", "done", "error")

    def __init__(self, builder: RecordSetBuilder) -> None:
        self.builder = builder
        self.seq = self.entry_id = -1
        self.pending = None
        self.done = trio.Event()
        self.error: BaseException | None = None

    async def wait(self) -> None:
        await self.done.wait()
        if self.error is not None:
            raise self.error


class LogWriter:
    """`async with namespace.writer(name) as w:` owns the log for the block (Namespace.writer)."""

    def __init__(self, namespace: Namespace, name: str, *, identity: bytes = b"", wait: bool = False,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.ns, self.name, self.identity, self.wait = namespace, name, identity, wait
        self.paths = namespace.paths(name)
        self.max_in_flight = max_in_flight
        self._stack = AsyncExitStack()
        self._owned: ownership.Owned | None = None       # the list as we left it, and our segment
        self._handle: WriteHandle | None = None          # our segment's ledger
        self._handles: dict[int, WriteHandle] = {}       # created by the protocol, not ours yet
        self._in_flight: deque[_Batch] = deque()
        self._unsealed: deque[_Batch] = deque()  # record sets being filled, full ones first
        self._wake = trio.Event()
        self._fenced: BaseException | None = None
        self._closed = False
        self._tally = ownership.SegmentTally()  # sealed into the current segment so far
        self._last_txid = -1
        self._rolling = False
        self._segment_lock = trio.Lock()
        self._acker_scope = trio.CancelScope()
        self.acknowledged: Position | None = None  # the last record acknowledged

    # -- ownership ---------------------------------------------------------------------------
    async def __aenter__(self) -> LogWriter:
        await self._stack.__aenter__()
        try:
            self._settings = (await self.ns.read(self.name)).log.settings  # fixed when the log was created
            self._max_entry = self._settings.max_entry_bytes
            lock = Lock(self.ns.meta, self.paths.owner, self.identity, prefix="writer-")
            if not self.wait and await lock.contenders():
                raise OwnershipTaken(f"log {self.name!r} has a writer already; close it first, or open with wait=True")
            await self._stack.enter_async_context(lock)
            await self._take_over()
            # In the ledger client's nursery, not one of ours around the caller's block: its
            # exceptions then come out as they are, not in an exception group.
            assert self.ns.ledgers.nursery is not None, "use the writer inside `async with LedgerClient(...)`"
            self.ns.ledgers.nursery.start_soon(self._run_acker)
            self._stack.callback(self._acker_scope.cancel)
        except BaseException:
            await self._stack.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if exc[0] is None and not self._closed:
                await self.close()
        finally:
            await self._stack.__aexit__(*exc)

    async def _take_over(self) -> None:
        self._owned = await self._drive(ownership.take_over(self.name))
        self._handle = self._handles.pop(self._owned.segment.ledger_id)
        self._last_txid = self._owned.listing.last_txid
        self._unsealed.append(_Batch(RecordSetBuilder(self._max_entry, self._last_txid)))
        log.info("event=log_owned log=%s epoch=%d segment=%d ledger=%d", self.name, self._owned.listing.log.epoch,
                 self._owned.segment.seq, self._handle.ledger_id)

    async def _drive(self, protocol: ownership.Protocol) -> Any:
        """Run a step of the ownership protocol (stream/ownership.py) against the metastore and
        the ledger client; what it returns."""
        result: Any = None
        while True:
            try:
                action = protocol.send(result)
            except StopIteration as done:
                return done.value
            result = await self._execute(action)

    async def _execute(self, action: ownership.Action) -> Any:
        if isinstance(action, ownership.ReadList):
            return await self.ns.read(self.name)
        if isinstance(action, ownership.ApplyChange):
            try:
                return await self.ns.apply(self.name, action.before, action.after)
            except ListChanged:
                return None
        if isinstance(action, ownership.Now):
            return now_ms()
        if isinstance(action, ownership.CreateLedger):
            s = self._settings
            handle = await self.ns.ledgers.create(
                s.ensemble, s.write_quorum, s.ack_quorum, password=ledger_password(self.name),
                custom={"stream": self.name.encode(), "segment": str(action.seq).encode()})
            self._handles[handle.ledger_id] = handle
            return handle.ledger_id
        if isinstance(action, ownership.CloseLedger):
            assert self._handle is not None and self._handle.ledger_id == action.ledger_id
            await self._handle.close()
            return self._handle.lac
        if isinstance(action, ownership.DeleteLedger):
            self._handles.pop(action.ledger_id, None)
            await self.ns.delete_ledger(action.ledger_id)
            return None
        assert isinstance(action, ownership.RecoverSegment), action
        return await self._recover(action.segment)

    async def _recover(self, segment: Segment) -> ownership.RecoveredTail:
        """Fence and close the last owner's segment; its first and last record sets."""
        handle = await self.ns.ledgers.open(segment.ledger_id, ledger_password(self.name), recover=True)
        last = handle.last_entry
        if last is None or last < 0:
            return ownership.RecoveredTail(-1, None, None)
        tail = decode((await handle.read(last, last))[0].payload)
        head = tail if last == 0 else decode((await handle.read(0, 0))[0].payload)
        log.info("event=segment_recovered log=%s segment=%d ledger=%d last_entry=%d", self.name, segment.seq,
                 segment.ledger_id, last)
        return ownership.RecoveredTail(last, head, tail)

    # -- writing -----------------------------------------------------------------------------
    @property
    def last_txid(self) -> int:
        """The largest transaction id written to the log so far (-1 for none): a record's must be larger."""
        return self._unsealed[-1].builder.last_txid if self._unsealed else self._last_txid

    def _add(self, txid: int, payload: bytes) -> tuple[_Batch, int]:
        if self._fenced is not None:
            raise LogFenced(f"log {self.name!r}: this writer was fenced ({self._fenced}); open a new writer") \
                from self._fenced
        if self._closed or not self._unsealed:
            raise StreamError(f"log {self.name!r}: the writer is closed")
        batch = self._unsealed[-1]
        if batch.builder.count and not batch.builder.fits(len(payload)):
            batch = _Batch(RecordSetBuilder(self._max_entry, batch.builder.last_txid))
            self._unsealed.append(batch)
            self._maybe_seal()  # the full one goes out now, unless a roll is due first
        return batch, batch.builder.add(txid, payload)

    async def write(self, txid: int, payload: bytes) -> Position:
        """Append one record with transaction id `txid` (greater than the last one); its position,
        once it is acknowledged (on Qa bookies). LogFenced once another writer took over."""
        batch, slot = self._add(txid, bytes(payload))
        self._maybe_seal()
        await batch.wait()
        return Position(batch.seq, batch.entry_id, slot)

    async def write_many(self, records: Iterable[tuple[int, bytes]]) -> list[Position]:
        """Append records in order (no task or event per record); their positions once all are
        acknowledged. On an error the records before the failing one may have been written."""
        placed = [self._add(txid, bytes(payload)) for txid, payload in records]
        if not placed:
            return []
        self._maybe_seal()
        await placed[-1][0].wait()  # acknowledgements come in order
        return [Position(b.seq, b.entry_id, slot) for b, slot in placed]

    async def flush(self) -> Position | None:
        """Wait until every record written so far is acknowledged; the last one's position."""
        last = self._unsealed[-1] if self._unsealed and self._unsealed[-1].builder.count else None
        if last is not None:
            self._maybe_seal()
            await last.wait()  # acknowledgements come in order: everything before it too
        elif self._in_flight:
            await self._in_flight[-1].wait()
        if self._fenced is not None:
            raise LogFenced(f"log {self.name!r}: this writer was fenced ({self._fenced})") from self._fenced
        return self.acknowledged

    def _maybe_seal(self) -> None:
        """Seal what may go now: every full record set, and the one being filled while fewer than
        max_in_flight entries are in flight; nothing while a roll waits for the segment to drain."""
        while self._unsealed and not self._rolling and self._fenced is None:
            head = self._unsealed[0]
            if not head.builder.count or (len(self._unsealed) == 1 and len(self._in_flight) >= self.max_in_flight):
                return
            self._seal(self._unsealed.popleft())

    def _seal(self, batch: _Batch) -> None:
        builder = batch.builder
        assert self._handle is not None and self._owned is not None
        tally, segment = self._tally, self._owned.segment
        if not self._unsealed:
            self._unsealed.append(_Batch(RecordSetBuilder(self._max_entry, builder.last_txid)))
        data = builder.encode(tally.records, tally.bytes)
        try:
            batch.pending = self._handle.start_append(data)
        except LedgerError as e:  # the handle knows already that it is fenced or closed
            self._unsealed.appendleft(batch)
            self._fail(e)
            return
        batch.seq, batch.entry_id = segment.seq, batch.pending.entry_id
        tally.sealed(builder.first_txid, builder.last_txid, builder.count, builder.payload_bytes)
        self._last_txid = builder.last_txid
        self._in_flight.append(batch)
        if tally.bytes >= self._settings.roll_bytes or now_ms() - segment.created_ms >= self._settings.roll_ms:
            self._rolling = True
        self._wake.set()

    async def _run_acker(self) -> None:
        with self._acker_scope:
            await self._acker()

    async def _acker(self) -> None:
        """Acknowledge sealed record sets in entry order; roll between entries when due."""
        while True:
            if not self._in_flight:
                if self._rolling and self._fenced is None and not self._closed:
                    async with self._segment_lock:  # close() completes the segment under it too
                        if not self._closed:
                            await self._roll()
                    self._maybe_seal()
                    continue
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            batch = self._in_flight[0]
            try:
                await batch.pending.result()  # type: ignore[union-attr]
            except LedgerError as e:
                self._fail(e)
                return
            self._in_flight.popleft()
            self.acknowledged = Position(batch.seq, batch.entry_id, batch.builder.count - 1)
            batch.done.set()
            self._maybe_seal()

    def _fail(self, error: BaseException) -> None:
        fenced = LogFenced(f"log {self.name!r}: another writer took it over ({error}); open a new writer") \
            if isinstance(error, _FENCED) else error
        self._fenced = fenced
        for batch in (*self._in_flight, *self._unsealed):
            batch.error = fenced
            batch.done.set()
        self._in_flight.clear()
        log.warning("event=writer_fenced log=%s error=%s", self.name, error)

    async def _roll(self) -> None:
        """Complete the current segment (its ledger closed at its last entry) and start the next."""
        try:
            self._owned = await self._drive(ownership.roll(self.name, self._owned, self._tally))
        except (LedgerError, StreamError) as e:
            self._fail(e)
            return
        self._handle = self._handles.pop(self._owned.segment.ledger_id)
        self._rolling = False
        self._tally = ownership.SegmentTally()
        log.info("event=segment_rolled log=%s segment=%d ledger=%d", self.name, self._owned.segment.seq,
                 self._handle.ledger_id)
        if self._settings.retention_ms or self._settings.retention_bytes:
            assert self.ns.ledgers.nursery is not None
            self.ns.ledgers.nursery.start_soon(self._retain)

    async def _retain(self) -> None:
        """Apply the log's retention after a roll (DistributedLog's writer does it too), beside
        the writing: a truncation changes the list, which the writer's next roll takes in stride
        (the epoch is unchanged)."""
        try:
            point = await self.ns.apply_retention(self.name)
        except (LedgerError, StreamError, MetastoreError, ValueError) as e:
            log.warning("event=log_retention_failed log=%s error=%s", self.name, e)
            return
        if point is not None:
            log.info("event=log_retention log=%s truncated_before=%s", self.name, point)

    async def close(self) -> None:
        """Flush, complete the last segment and give up ownership (a clean shutdown leaves no
        segment in progress)."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        async with self._segment_lock:
            try:
                await self._drive(ownership.complete(self.name, self._owned, self._tally))
            except (LedgerError, StreamError) as e:
                self._fail(e)
                raise self._fenced from None  # type: ignore[misc]
        log.info("event=log_closed log=%s segment=%d", self.name, self._owned.segment.seq)
