"""WriteHandle and ReadHandle: the application's view of one ledger (trio edge).

Both drive the pure operations of ledger/ through an OpDriver; the rules live
there (docs/ledger.md). A WriteHandle keeps one Writer and a pump task in the
LedgerClient's nursery, so any number of appends can be in flight:

    handle = await client.create(3, 3, 2, password=b"pw")
    pending = [handle.start_append(b"x%d" % i) for i in range(10_000)]   # no task each
    for p in pending:
        await p.result()                    # the entry id, or a typed error
    await handle.close()

An append's error is a ledger.errors class; an OutcomeUnknown one (fenced,
closed under us, out of bookies) means the entry may or may not be in the
ledger once it is recovered.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import trio

from bookie.entry import NO_ENTRY, Digester, Entry
from edge import metrics
from ledger import actions as A
from ledger.driver import Context, OpDriver
from ledger.errors import EntryNotAvailable, LedgerError, ReadBeyondLastConfirmed
from ledger.metadata import LedgerMetadata
from ledger.read_op import LongPollOp, ReadEntryOp, ReadLacOp
from ledger.writer import Writer, WriterState

READ_WINDOW = 256      # entries read concurrently by one read()
TAIL_BATCH = 64


class PendingAppend:
    """One append in flight: `entry_id` at once, `await result()` for the outcome."""

    __slots__ = ("entry_id", "_event", "_error", "done", "started")

    def __init__(self, entry_id: int, started: float = 0.0) -> None:
        self.entry_id = entry_id
        self.started = started  # perf_counter() at the call, for the append latency metric (0: not timed)
        self._event: trio.Event | None = None  # made only for a result() awaited before the outcome
        self._error: LedgerError | None = None
        self.done = False

    def _finish(self, error: LedgerError | None = None) -> None:
        if not self.done:
            self.done, self._error = True, error
            if self._event is not None:
                self._event.set()

    async def result(self) -> int:
        """The entry id once acknowledged (Qa copies, every lower entry too); raises the append's error.

        An append already acknowledged answers without yielding to the scheduler (only a
        cancellation is checked): a writer collecting a window of finished appends pays no
        scheduler pass per entry. One that is not done yet waits, and yields, as usual."""
        if self.done:
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        if self._error is not None:
            raise self._error
        return self.entry_id


class _Outcome:
    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.error: LedgerError | None = None

    def set(self, value: Any = None, error: LedgerError | None = None) -> None:
        if not self.event.is_set():
            self.value, self.error = value, error
            self.event.set()

    async def get(self) -> Any:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class WriteHandle:
    """The writer of one ledger. Appends are pipelined; `close()` drains them and closes (seed 001)."""

    def __init__(self, ctx: Context, writer: Writer, master_key: bytes, *, tick_s: float = 0.02) -> None:
        self._writer = writer
        self._driver = OpDriver(ctx, writer.ledger_id, master_key, tick_s=tick_s, inline=True)  # acks wake us at once
        self._pending: dict[int, PendingAppend] = {}
        self._closing: _Outcome | None = None
        self._changes_counted = writer.ensemble_changes
        self._op = self._driver.add(writer, self._on_action, start=False)
        ctx.nursery.start_soon(self._driver.pump, self._finished)

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    @property
    def lac(self) -> int:
        """The last entry acknowledged to this application (NO_ENTRY = -1 for none)."""
        return self._writer.lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self._writer.metadata

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def start_append(self, payload: bytes) -> PendingAppend:
        """Send an append now and return at once; raises the handle's error if it cannot write."""
        entry_id, actions = self._writer.append(bytes(payload))
        pending = self._pending[entry_id] = PendingAppend(entry_id, time.perf_counter() if metrics.ENABLED else 0.0)
        self._driver.execute(self._op, actions)
        return pending

    async def append(self, payload: bytes) -> int:
        """Append and wait for the acknowledgement; returns the entry id."""
        return await self.start_append(payload).result()

    async def append_many(self, payloads: list[bytes]) -> list[int]:
        """Append every payload pipelined; returns their entry ids once all are acknowledged."""
        pending = [self.start_append(p) for p in payloads]
        return [await p.result() for p in pending]

    async def close(self) -> LedgerMetadata:
        """Wait for outstanding appends, then close the ledger at the LAC. Idempotent once closed."""
        if self._writer.state is WriterState.CLOSED:
            return self._writer.metadata
        if self._closing is None:
            self._closing = _Outcome()
            self._driver.execute(self._op, self._writer.close())
        return await self._closing.get()

    def statistics(self) -> dict:
        return {**self._writer.statistics(), **self._driver.stats, "in_flight": len(self._pending)}

    def _finished(self) -> bool:
        state = self._writer.state
        return state is WriterState.CLOSED or (state is WriterState.BROKEN and not self._pending)

    def _on_action(self, action: A.Action) -> None:
        if isinstance(action, A.Acknowledge):
            pop = self._pending.pop
            now, observe = time.perf_counter(), metrics.LEDGER_APPEND_SECONDS.observe
            for entry_id in action.entry_ids:
                pending = pop(entry_id)
                pending._finish()
                if pending.started:
                    observe(now - pending.started)
            changes = self._writer.ensemble_changes
            if changes != self._changes_counted:  # counted here: the writer itself is sans-I/O and process-free
                metrics.LEDGER_ENSEMBLE_CHANGES.inc(changes - self._changes_counted)
                self._changes_counted = changes
        elif isinstance(action, A.FailAdds):
            for entry_id in action.entry_ids:
                self._pending.pop(entry_id)._finish(action.error)
        elif isinstance(action, A.Completed):
            if self._closing is not None:
                self._closing.set(action.result)
        elif isinstance(action, A.Failed):
            if self._closing is not None:
                self._closing.set(error=action.error)
            for failed in self._writer.fail(action.error):  # the driver's verdict: the ledger vanished
                self._on_action(failed)
            for pending in self._pending.values():
                pending._finish(action.error)
            self._pending.clear()


class ReadHandle:
    """A reader of one ledger: closed (after recovery, or closed by its writer) or open (reads up to
    the LAC, tails with long polls)."""

    def __init__(self, ctx: Context, metadata: LedgerMetadata, version: int, digester: Digester, master_key: bytes,
                 *, lac: int = NO_ENTRY, tick_s: float = 0.02, speculative_ticks: int = 5,
                 long_poll_ms: int = 1_000) -> None:
        self._ctx = ctx
        self.metadata = metadata
        self.version = version
        self._digester = digester
        self._key = master_key
        self._tick_s = tick_s
        self._speculative_ticks = speculative_ticks
        self._long_poll_ms = long_poll_ms
        self.lac = metadata.last_entry if metadata.is_closed else lac

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    @property
    def last_entry(self) -> int | None:
        """The last entry of a closed ledger (-1 if empty); None while it is open."""
        return self.metadata.last_entry

    def _driver(self, long_poll_ms: int | None = None) -> OpDriver:
        return OpDriver(self._ctx, self.ledger_id, self._key, tick_s=self._tick_s,
                        long_poll_ms=long_poll_ms or self._long_poll_ms)

    async def _run(self, ops: list[Any], driver: OpDriver | None = None) -> list[tuple[Any, LedgerError | None]]:
        """Run operations to their end; their (result, error) in order."""
        driver = driver or self._driver()
        outcomes: list[tuple[Any, LedgerError | None] | None] = [None] * len(ops)

        def handler_for(i: int):
            def handler(action: A.Action) -> None:
                if isinstance(action, A.Completed):
                    outcomes[i] = (action.result, None)
                elif isinstance(action, A.Failed):
                    outcomes[i] = (None, action.error)
            return handler

        ids = [driver.add(op, handler_for(i)) for i, op in enumerate(ops)]
        await driver.pump(lambda: all(o is not None for o in outcomes))
        for op_id in ids:
            driver.remove(op_id)
        return outcomes  # type: ignore[return-value]

    async def refresh(self) -> LedgerMetadata:
        """Re-read the metadata (a closed ledger's last entry, an open one's new fragments)."""
        self.metadata, self.version = await self._ctx.manager.read(self.ledger_id)
        if self.metadata.is_closed:
            self.lac = self.metadata.last_entry
        return self.metadata

    async def read_lac(self) -> int:
        """The highest LAC the bookies know (for a closed ledger: its last entry)."""
        if self.is_closed:
            return self.lac
        ((lac, error),) = await self._run([ReadLacOp(self.metadata)])
        if error is not None:
            raise error
        self.lac = max(self.lac, lac)
        return self.lac

    async def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive), digests verified. Only confirmed entries: up to the last
        entry of a closed ledger, or the LAC of an open one (read again if needed)."""
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        if last > self.lac and not self.is_closed:
            await self.read_lac()
        if last > self.lac:
            raise ReadBeyondLastConfirmed(
                f"ledger {self.ledger_id}: entry {last} is past the last confirmed entry {self.lac}"
                + ("" if self.is_closed else "; read the LAC again later, or tail the ledger"))
        out: list[Entry] = []
        for start in range(first, last + 1, READ_WINDOW):
            out += await self._read_window(start, min(last, start + READ_WINDOW - 1))
        return out

    async def _read_window(self, first: int, last: int) -> list[Entry]:
        for attempt in range(2):
            ops = [ReadEntryOp(self.metadata, e, self._digester, speculative_ticks=self._speculative_ticks)
                   for e in range(first, last + 1)]
            outcomes = await self._run(ops)
            errors = [error for _, error in outcomes if error is not None]
            if not errors:
                return [entry for entry, _ in outcomes]
            if attempt == 0 and not self.is_closed:
                await self.refresh()  # the writer may have moved entries to a new fragment
        raise errors[0]

    async def wait_entries(self, from_entry: int, max_entries: int = TAIL_BATCH) -> list[Entry]:
        """The next confirmed entries from `from_entry` on, waiting (one long poll) if there are none yet.
        An empty list means nothing new within the long-poll timeout (or the closed ledger ended).

        When the long poll's answer carries entry `from_entry` (the bookie sends the entry after the
        LAC it was told, when it stores it), that entry alone is returned, digest-verified by the
        poll, without a read round trip; the next call reads whatever else the new LAC confirms."""
        bound = self.lac
        if from_entry > bound and not self.is_closed:
            entry = await self._long_poll(from_entry)
            if entry is not None:
                return [entry]
            bound = self.lac
        if from_entry > bound:
            return []
        return await self.read(from_entry, min(bound, from_entry + max_entries - 1))

    async def _long_poll(self, entry_id: int) -> Entry | None:
        """One long poll for entry `entry_id`; raises the LAC. Returns the entry if the answer carried
        it and the LAC confirms it, else None (read it, or poll again)."""
        previous = self.lac
        op = LongPollOp(self.metadata, entry_id, previous, self._digester, first_replica=entry_id)
        ((result, error),) = await self._run([op], self._driver())
        if error is None and result[0] > self.lac:
            lac, entry = result
            self.lac = lac
            return entry if entry is not None and entry.entry_id == entry_id <= lac else None
        await self.refresh()  # no news: maybe closed, or on a new fragment
        if error is not None and isinstance(error, EntryNotAvailable) and not self.is_closed:
            await trio.sleep(self._tick_s * 5)
        return None

    async def tail(self, from_entry: int = 0) -> AsyncIterator[Entry]:
        """Every entry from `from_entry` on as it gets confirmed; ends after the last entry once the
        ledger is closed."""
        next_entry = from_entry
        while True:
            batch = await self.wait_entries(next_entry)
            for entry in batch:
                yield entry
            next_entry += len(batch)
            if not batch and self.is_closed and next_entry > self.metadata.last_entry:
                return
