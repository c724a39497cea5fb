"""The trio driver of one Zab peer: recovery, the event loop, and the edges.

It owns no protocol decision. It recovers the node from disk, feeds the pure
core (zab.peer.Peer) ticks, peer messages, link losses and client requests,
and executes the actions the core returns, in order: sends go to the peer
transport, log actions to the single log writer (fsync off the event loop,
group commit), epoch writes to disk before anything after them, deliveries
to the clients waiting on them.
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from zab.actions import (Action, ClientRequest, ClientSync, Delivered, Disconnect, Event, InstallSnapshot, LogAppend,
                         LogSync, LogTruncate, PersistEpoch, Received, RequestFailed, Role, RoleChanged, Send,
                         SessionsTouched, Synced, TakeSnapshot, Tick, TouchSessions)
from zab.config import ZabConfig
from zab.epochfile import write_epoch
from zab.errors import NoLeader, OutcomeUnknown
from zab.log_writer import LogWriter
from zab.peer import DiskState, Peer
from zab.recovery import recover
from zab.statemachine import StateMachine
from zab.transport import PeerTransport
from zab.txn import Txn

log = logging.getLogger("quire.zab.driver")

EVENT_QUEUE_MAX = 10_000
_LOG_ACTIONS = (LogAppend, LogSync, LogTruncate, InstallSnapshot, TakeSnapshot)


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    result: object = None
    error: Exception | None = None
    in_core: bool = False  # the core has seen the request; a role change now makes its outcome unknown


class DriverListener(Protocol):
    """The service layered on the peer (see PeerDriver.listen)."""

    def delivered(self, txn: Txn, result: object) -> None: ...

    def sessions_touched(self, frm: int, session_ids: tuple[int, ...]) -> None: ...

    def role_changed(self, role: Role, leader: int | None, epoch: int) -> None: ...


@dataclass(eq=False)
class Pending:
    """A request handed to the peer, not yet answered."""
    driver: "PeerDriver"
    key: tuple[int, int]
    waiter: _Waiter

    async def result(self) -> object:
        try:
            await self.waiter.done.wait()
        finally:
            self.driver._waiters.pop(self.key, None)
        if self.waiter.error is not None:
            raise self.waiter.error
        return self.waiter.result


class PeerDriver:
    """Runs one Zab peer. `await nursery.start(driver.run)`, then `submit` writes."""

    def __init__(self, config: ZabConfig, peer_addresses: dict[int, tuple[str, int]], data_dir: Path,
                 state_machine: StateMachine, *, max_frame_bytes: int, send_queue_max: int,
                 snapshots_retained: int, cluster_name: str = "quire") -> None:
        self.cfg = config
        self.data_dir = Path(data_dir)
        self.state_machine = state_machine
        self.snapshots_retained = snapshots_retained
        self.transport = PeerTransport(cluster_name, config.my_id, peer_addresses, self._deliver_event,
                                       max_frame_bytes=max_frame_bytes, send_queue_max=send_queue_max)
        self.peer: Peer | None = None
        self.writer: LogWriter | None = None
        self._events_send, self._events_recv = trio.open_memory_channel(EVENT_QUEUE_MAX)
        self._local: collections.deque[Event] = collections.deque()
        self._waiters: dict[tuple[int, int], _Waiter] = {}
        self._listener: DriverListener | None = None
        self._running = False

    # -- running ---------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        recovered = await trio.to_thread.run_sync(recover, self.data_dir)
        await trio.to_thread.run_sync(recovered.log.sync)  # records read back may only be in the page cache
        self.writer = LogWriter(recovered.log, recovered.snapshots, snapshots_retained=self.snapshots_retained,
                                run_then=self._run_after_sync)
        self.peer = Peer(self.cfg, self.state_machine,
                         DiskState(recovered.accepted_epoch, recovered.current_epoch, recovered.snapshot_zxid,
                                   recovered.snapshot_state, tuple(recovered.txns)))
        log.info("event=recovered node=%s snapshot=%#x last_zxid=%#x accepted_epoch=%s current_epoch=%s",
                 self.cfg.my_id, recovered.snapshot_zxid, self.peer.last_zxid, recovered.accepted_epoch,
                 recovered.current_epoch)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run)
                nursery.start_soon(self.writer.run)
                nursery.start_soon(self._ticker)
                await self._execute(self.peer.start())
                self._running = True
                task_status.started()
                await self._loop()
        finally:
            self._running = False
            recovered.log.close()
            for w in self._waiters.values():
                w.error = NoLeader("the node is shutting down")
                w.done.set()

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(self.cfg.tick_ms / 1000)
            await self._events_send.send(Tick())

    async def _deliver_event(self, event: object) -> None:
        await self._events_send.send(event)

    async def _loop(self) -> None:
        assert self.peer is not None
        while True:
            item = self._local.popleft() if self._local else await self._events_recv.receive()
            # The transport hands over every message of one socket read as one list:
            # one channel hop per read instead of one per message.
            for event in item if isinstance(item, list) else (item,):
                if isinstance(event, (ClientRequest, ClientSync)):
                    waiter = self._waiters.get((event.session_id, event.cxid))
                    if waiter is not None:
                        waiter.in_core = True
                await self._execute(self.peer.step(event))

    # -- actions ---------------------------------------------------------------------------
    async def _execute(self, actions: list[Action]) -> None:
        assert self.writer is not None
        for a in actions:
            if isinstance(a, _LOG_ACTIONS):
                self.writer.submit(a)
            else:
                await self._execute_now(a, from_writer=False)

    async def _run_after_sync(self, actions: list[Action]) -> None:
        for a in actions:
            await self._execute_now(a, from_writer=True)

    async def _execute_now(self, a: Action, *, from_writer: bool) -> None:
        if isinstance(a, Send):
            if a.to == self.cfg.my_id:
                event = Received(a.to, a.msg)
                if from_writer:
                    await self._events_send.send(event)
                else:
                    self._local.append(event)
            else:
                self.transport.send(a.to, a.msg)
        elif isinstance(a, PersistEpoch):
            await trio.to_thread.run_sync(self._persist_epoch, a)
        elif isinstance(a, Delivered):
            self._answer(a.txn.session_id, a.txn.cxid, result=a.result)
            if self._listener is not None:
                self._listener.delivered(a.txn, a.result)
        elif isinstance(a, Synced):
            self._answer(a.session_id, a.cxid, result=a.zxid)
        elif isinstance(a, SessionsTouched):
            if self._listener is not None:
                self._listener.sessions_touched(a.frm, a.session_ids)
        elif isinstance(a, RequestFailed):
            self._answer(a.session_id, a.cxid, error=NoLeader(f"no established leader ({a.reason}); retry shortly"))
        elif isinstance(a, RoleChanged):
            if self._listener is not None:
                self._listener.role_changed(a.role, a.leader, a.epoch)
            log.info("event=role node=%s role=%s leader=%s epoch=%s", self.cfg.my_id, a.role.value, a.leader, a.epoch)
            self._fail_all(OutcomeUnknown(f"node {self.cfg.my_id} became {a.role.value}; the request may or may "
                                          "not have committed"))
        elif isinstance(a, Disconnect):
            log.warning("event=disconnect node=%s peer=%s reason=%r", self.cfg.my_id, a.peer, a.reason)
            self.transport.disconnect(a.peer)
        else:
            raise TypeError(f"unexpected action {a!r}")

    def listen(self, listener: "DriverListener") -> None:
        """Tell `listener` of every delivery, session touch and role change, in order.

        Its methods run inline, before the driver yields to any other task: a service
        that answers reads from the state machine (the metastore) thereby sees each
        delivery before any read can observe its effect, which is how watch events
        reach a client before data that reflects them. They must not block.
        """
        self._listener = listener

    def _persist_epoch(self, a: PersistEpoch) -> None:
        # acceptedEpoch first: currentEpoch <= acceptedEpoch must hold on disk at every instant.
        if a.accepted is not None:
            write_epoch(self.data_dir, "acceptedEpoch", a.accepted)
        if a.current is not None:
            write_epoch(self.data_dir, "currentEpoch", a.current)

    # -- clients -----------------------------------------------------------------------------
    async def sync(self, session_id: int, cxid: int) -> int:
        """A client's `sync`: returns once this node has delivered every transaction the
        leader had committed when it saw the request; returns that zxid."""
        result = await (await self.start_sync(session_id, cxid)).result()
        assert isinstance(result, int)
        return result

    async def start_sync(self, session_id: int, cxid: int) -> "Pending":
        """Hand a `sync` to the peer now; await `.result()` later (see start_submit)."""
        return await self._start(session_id, cxid, ClientSync(session_id, cxid))

    def touch(self, session_ids: tuple[int, ...]) -> None:
        """Report client sessions active on this node (the leader decides expiry)."""
        try:
            self._events_send.send_nowait(TouchSessions(session_ids))
        except trio.WouldBlock:
            pass  # the next touch carries them; a busy node is not an idle session

    async def submit(self, session_id: int, cxid: int, request: bytes) -> object:
        """Replicate one write; returns what the state machine's apply() returned, once
        the transaction is delivered here.

        Raises NoLeader (retry later) or OutcomeUnknown (the leader changed while
        the request was in flight).
        """
        return await (await self.start_submit(session_id, cxid, request)).result()

    async def start_submit(self, session_id: int, cxid: int, request: bytes) -> "Pending":
        """Hand a write to the peer now and return without waiting for it to commit.

        Writes started one after another from one task are proposed in that order, so
        a client connection can pipeline many writes and still see ZooKeeper's FIFO
        order; await `.result()` of each for its outcome.
        """
        return await self._start(session_id, cxid, ClientRequest(session_id, cxid, request))

    async def _start(self, session_id: int, cxid: int, event: Event) -> "Pending":
        if not self._running:
            raise NoLeader(f"node {self.cfg.my_id} is not running")
        key = (session_id, cxid)
        if key in self._waiters:
            raise ValueError(f"request {key} is already in flight")
        waiter = self._waiters[key] = _Waiter()
        try:
            await self._events_send.send(event)
        except BaseException:
            self._waiters.pop(key, None)
            raise
        return Pending(self, key, waiter)

    def _answer(self, session_id: int, cxid: int, *, result: object = None,
                error: Exception | None = None) -> None:
        waiter = self._waiters.pop((session_id, cxid), None)
        if waiter is not None:
            waiter.result, waiter.error = result, error
            waiter.done.set()

    def _fail_all(self, error: Exception) -> None:
        for key, w in list(self._waiters.items()):
            if w.in_core:
                del self._waiters[key]
                w.error = error
                w.done.set()

    # -- observation ----------------------------------------------------------------------------
    def status(self) -> dict:
        if self.peer is None:
            return {"id": self.cfg.my_id, "role": "starting"}
        s = self.peer.status()
        s["pid"] = os.getpid()
        s["peers"] = self.transport.connected_peers()
        s["log"] = self.writer.statistics() if self.writer else {}
        s["transport"] = dict(vars(self.transport.stats))
        return s
