"""One connection of the bookie port (trio edge): its outgoing answers and in-flight counts.

Its Outbox (edge/outbox.py) is written by the event loop and, for the answers to adds, by the
storage's worker thread right after their fsync (`ThreadAnswer`). A client that does not read
its answers is cut off once `max_outgoing_bytes` are queued for it, or once the answers of every
connection together pass the port's ByteBudget (bookie/service.py).
"""

from __future__ import annotations

import logging
import threading

import trio

from bookie import protocol as P
from bookie.errors import BookieError
from edge.outbox import ByteBudget, Outbox

log = logging.getLogger("quire.bookie.service")


class BookieConnection:
    """One client connection: its Outbox (edge/outbox.py, through which the storage's worker
    thread writes add answers too: `ThreadAnswer`) and its in-flight count."""

    def __init__(self, conn_id: int, stream: trio.SocketStream, max_outgoing_bytes: int,
                 budget: ByteBudget | None = None) -> None:
        self.id = conn_id
        self.stream = stream
        # The storage worker answers adds from its thread; `budget` bounds all connections' answers.
        self.out = Outbox(max_bytes=max_outgoing_bytes, threads=True, budget=budget)
        self.claims = threading.Lock()  # which side sends a ThreadAnswer: the worker thread or the loop
        self.in_flight = 0
        self.closing = False
        self.drained = trio.Event()  # set once the writer task is done
        self.scope: trio.CancelScope | None = None  # the connection's nursery
        self.splitter: P.FrameSplitter | None = None
        self.in_flight_bytes = 0  # of adds waiting for their journal fsync
        self.cut_off = False  # closed for not reading its answers

    def send(self, frame: bytes) -> None:
        if self.closing and self.scope is None:
            return
        # Once closing, answers queue behind the BAD_REQUEST that the writer task drains last.
        if not self.out.send(frame, direct=not self.closing) and self.scope is not None:
            budget = self.out.budget
            log.warning("event=slow_reader_cut_off conn=%s queued_bytes=%s port_queued_bytes=%s", self.id,
                        self.out.queued_bytes, budget and budget.used)
            self.cut_off = True
            self.scope.cancel()  # a client that does not read its answers is cut off, never waited for

    async def write_loop(self) -> None:
        """The connection's writer task: sends what is queued until the outbox is closed and drained."""
        try:
            await self.out.pump(self.stream)
        finally:
            self.drained.set()

    def send_many(self, frames: list[bytes]) -> None:
        if frames:
            self.send(b"".join(frames))

    def fail_ids(self, request_id: int, ledger_id: int, kind: P.Kind, error: BookieError) -> None:
        self.send(P.encode_response(P.Response(request_id, kind, P.status_of(error), ledger_id, message=str(error))))

    def answer(self, resp: P.Response) -> None:
        self.send(P.encode_response(resp))

    def fail(self, req: P.Request, kind: P.Kind, error: BookieError) -> None:
        self.send(P.encode_response(P.Response(req.request_id, kind, P.status_of(error), req.ledger_id,
                                               message=str(error))))


class ThreadAnswer:
    """The answers to one socket read's adds, written by the storage's worker thread right after the
    batch's fsync when the connection is idle (Batch.after_sync); otherwise by the event loop.
    Whichever side claims it first, under the connection's `claims` lock, sends it: the event loop
    may apply the batch (settle) before the thread has got to its answers."""

    __slots__ = ("conn", "data", "by_thread")

    def __init__(self, conn: BookieConnection, data: bytes) -> None:
        self.conn, self.data = conn, data
        self.by_thread: bool | None = None  # None: not claimed yet

    def send_from_thread(self) -> None:
        conn = self.conn
        with conn.claims:
            if self.by_thread is None:  # else the event loop claimed it
                self.by_thread = not conn.closing and conn.out.send_from_thread(self.data)

    def claim_for_loop(self) -> bool:
        """In the event loop: whether it must send the answer (the thread did not, and now never will)."""
        with self.conn.claims:
            if self.by_thread is None:
                self.by_thread = False
            return not self.by_thread
