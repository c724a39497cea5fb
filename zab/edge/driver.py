"""The trio driver of one Zab peer: recovery, the event loop, and the edges.

It owns no protocol decision. It recovers the node from disk, feeds the pure
core (zab.core.peer.Peer) ticks, peer messages, link losses and client requests,
and executes the actions the core returns, in order: sends go to the peer
transport, log actions to the single log writer (fsync off the event loop,
group commit), epoch writes to disk before anything after them, deliveries
to the clients waiting on them.

The core is stepped inline, in whichever task has the event (a peer link's
reader, a client connection, the ticker, the log writer releasing what waited
for an fsync): every action but PersistEpoch is synchronous, so one step and
its actions run to completion without yielding, which keeps steps atomic and
in arrival order without a channel crossing and a task switch per event. An
epoch write blocks the inbox: whatever arrives meanwhile, and the rest of the
actions after it, queue until it is on disk.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from zab.core.actions import (Action, Answered, ClientRequest, ClientSync, Delivered, Disconnect, EnsembleChanged, Event, InstallSnapshot, LogAppend,
                         LeaderTicked, LogSync, LogTruncate, PersistEpoch, Received, RequestFailed, Role, RoleChanged,
                         Send, SessionsTouched, SnapBegin, SnapDiscard, SnapWrite, Synced, TakeSnapshot, Tick,
                         TouchSessions)
from zab.core.config import ZabConfig
from zab.core.ensemble import Ensemble, peer_addresses
from zab.storage.ensemble_file import read_ensemble, write_ensemble
from zab.storage.epochfile import write_epoch
from zab.errors import NoLeader, OutcomeUnknown
from edge import long_lived, metrics
from zab.edge.log_writer import DEFAULT_MAX_QUEUED_BYTES, LogWriter
from zab.core.peer import DiskState, Peer
from zab.storage.recovery import recover
from zab.core.statemachine import StateMachine
from zab.edge.transport import DEFAULT_SEND_QUEUE_MAX_BYTES, PeerTransport
from zab.core.txn import Txn

log = logging.getLogger("quire.zab.driver")

_LOG_ACTIONS = (LogAppend, LogSync, LogTruncate, SnapBegin, SnapWrite, SnapDiscard, InstallSnapshot, TakeSnapshot)

# The identity a request carries through Zab (its Txn's, REQUEST's and answers' cxid): the
# origin node's id in the top byte, then a per-driver counter from a random start. Every node
# delivers every transaction, and a session may move between nodes whose callers number
# their requests independently, so (session, caller's cxid) would answer one node's client
# with another's result (issue 17); the random start keeps a restarted node's new requests
# apart from its old ones still in flight.
REQUEST_NODE_BITS = 8
_REQUEST_SEQ_BITS = 64 - REQUEST_NODE_BITS
_REQUEST_SEQ_MASK = (1 << _REQUEST_SEQ_BITS) - 1


@dataclass(slots=True, unsafe_hash=True)
class _Resume:
    """Actions still to execute, in the inbox in their turn (after an fsync or an epoch write)."""
    actions: list[Action]


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    result: object = None
    error: Exception | None = None
    in_core: bool = False  # the core has seen the request; a role change now makes its outcome unknown
    on_done: Callable[[], None] | None = None  # see Pending.notify


class DriverListener(Protocol):
    """The service layered on the peer (see PeerDriver.listen)."""

    def delivered(self, txn: Txn, result: object) -> None: ...

    def sessions_touched(self, frm: int, session_ids: tuple[int, ...]) -> None: ...

    def role_changed(self, role: Role, leader: int | None, epoch: int, broadcasting: bool) -> None: ...

    def leader_ticked(self, now_ms: int) -> None: ...


@dataclass(eq=False)
class Pending:
    """A request handed to the peer, not yet answered."""
    driver: "PeerDriver"
    key: tuple[int, int]
    waiter: _Waiter

    def done(self) -> bool:
        return self.waiter.done.is_set()

    def outcome(self) -> object:
        """What result() returns (or raises), once done()."""
        assert self.done()
        self.driver._waiters.pop(self.key, None)
        if self.waiter.error is not None:
            raise self.waiter.error
        return self.waiter.result

    def notify(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the outcome is known (if it is not yet), right after the
        driver's pass over its inbox that decided it: every delivery of that pass has
        reached the listener, so a reply sent from the callback follows their watch events."""
        self.waiter.on_done = callback

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
                 snapshots_retained: int, cluster_name: str = "quire",
                 send_queue_max_bytes: int = DEFAULT_SEND_QUEUE_MAX_BYTES,
                 log_queue_max_bytes: int = DEFAULT_MAX_QUEUED_BYTES, bootstrap: Ensemble | None = None) -> None:
        """`bootstrap`: the ensemble cluster.toml describes (with addresses), used until this node
        persisted a newer one (zab/storage/ensemble_file.py)."""
        self.cfg = config
        self.bootstrap = bootstrap
        self.data_dir = Path(data_dir)
        self.state_machine = state_machine
        self.snapshots_retained = snapshots_retained
        self.transport = PeerTransport(cluster_name, config.my_id, peer_addresses, self._deliver_event,
                                       max_frame_bytes=max_frame_bytes, send_queue_max=send_queue_max,
                                       send_queue_max_bytes=send_queue_max_bytes)
        self.transport.wait_room = self._wait_log_room
        self.log_queue_max_bytes = log_queue_max_bytes
        self.peer: Peer | None = None
        self.writer: LogWriter | None = None
        # Events and resumed action lists in arrival order; empty unless an epoch write
        # is in progress, the driver has not started, or a step is feeding itself.
        self._inbox: collections.deque[Event | _Resume] = collections.deque()
        self._draining = False
        self._answered: list[Callable[[], None]] = []  # Pending.notify callbacks due after this pass
        self._holding = 0  # > 0: a caller starts several requests in a row; flush once after them
        self._started = False
        self._persisting: PersistEpoch | None = None
        self._persist_wakeup = trio.Event()
        self._waiters: dict[tuple[int, int], _Waiter] = {}  # by (session, request identity)
        # Metrics (edge/metrics.py): when this node last became LOOKING, and, while it leads, when
        # each proposal was appended (by zxid), until its delivery (the commit latency).
        metrics.ELECTIONS.inc()  # a node starts LOOKING
        self._looking_since: float | None = time.perf_counter()
        self._leading = False
        self._proposed_at: dict[int, float] = {}
        if not 0 < config.my_id < 1 << REQUEST_NODE_BITS:
            raise ValueError(f"node id {config.my_id} must be in 1..{(1 << REQUEST_NODE_BITS) - 1}")
        self._request_seq = int.from_bytes(os.urandom(8), "big") & _REQUEST_SEQ_MASK
        self._listener: DriverListener | None = None
        self._running = False

    # -- running ---------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        recovered = await trio.to_thread.run_sync(recover, self.data_dir)
        await trio.to_thread.run_sync(recovered.log.sync)  # records read back may only be in the page cache
        self.writer = LogWriter(recovered.log, recovered.snapshots, snapshots_retained=self.snapshots_retained,
                                on_done=self._take_synced, send_now=self._send_acks_now,
                                max_queued_bytes=self.log_queue_max_bytes)
        ensemble = read_ensemble(self.data_dir) or self.bootstrap
        if ensemble is not None:
            self.transport.set_members(peer_addresses(ensemble))
        with long_lived.building("recovered"):  # the snapshot is restored and the log replayed here
            self.peer = Peer(self.cfg, self.state_machine,
                             DiskState(recovered.accepted_epoch, recovered.current_epoch, recovered.snapshot_zxid,
                                       recovered.snapshot_chunks(), tuple(recovered.txns)), ensemble)
        log.info("event=recovered node=%s snapshot=%#x last_zxid=%#x accepted_epoch=%s current_epoch=%s",
                 self.cfg.my_id, recovered.snapshot_zxid, self.peer.last_zxid, recovered.accepted_epoch,
                 recovered.current_epoch)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run)
                nursery.start_soon(self.writer.run)
                nursery.start_soon(self._ticker)
                self._inbox.appendleft(_Resume(self.peer.start()))  # before anything the links delivered
                self._started = True
                self._drain()
                self._running = True
                task_status.started()
                await self._persist_epochs()
        finally:
            self._running = False
            recovered.log.close()
            for w in list(self._waiters.values()):
                self._settle(w, None, NoLeader("the node is shutting down"))
            self._run_answered()

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(self.cfg.tick_ms / 1000)
            self._feed((Tick(),))

    async def _wait_log_room(self) -> None:
        """Backpressure: new work waits while the log writer's backlog is at its byte bound."""
        if self.writer is not None:
            await self.writer.wait_room()

    def _deliver_event(self, event: object) -> None:
        # The transport hands over every message of one socket read as one list.
        self._feed(event if isinstance(event, list) else (event,))

    def _take_synced(self) -> None:
        self._feed(())  # _feed takes what the log writer's finished fsyncs released

    def _send_acks_now(self, acks: list[Action]) -> list[Action]:
        """In the log writer's thread, right after the fsync the ACKs waited for: write each to
        its link if the link is idle (a follower's ACK leaves without waking the event loop, a
        wake-up less on every write's critical path). Returns the rest, from the first that
        could not go (an ACK to ourselves, a busy link), for the trio thread to send in order."""
        for i, a in enumerate(acks):
            assert isinstance(a, Send)
            if not self._running or a.to == self.cfg.my_id or not self.transport.send_from_thread(a.to, a.msg):
                return acks[i:]
        return []

    # -- the inbox -----------------------------------------------------------------------
    def _feed(self, items) -> None:
        # Fsyncs that finished before these events: what they released is stepped first, in
        # order, whether or not the log writer's wake-up for it has come round yet.
        if self.writer is not None:
            self._inbox.extend(_Resume(then) for then in self.writer.take_done())
        self._inbox.extend(items)
        if not self._draining:
            self._drain()

    def _drain(self) -> None:
        """Step the core on everything queued, in order, until the inbox is empty or an
        epoch write must finish first. Never yields; a step's own sends to this node
        land in the inbox and are taken in this same pass."""
        if not self._started:
            return
        assert self.peer is not None
        self._draining = True
        try:
            while self._inbox and self._persisting is None:
                item = self._inbox.popleft()
                if isinstance(item, _Resume):
                    self._execute(item.actions)
                    continue
                if isinstance(item, (ClientRequest, ClientSync)):
                    waiter = self._waiters.get((item.session_id, item.cxid))
                    if waiter is not None:
                        waiter.in_core = True
                self._execute(self.peer.step(item))
        finally:
            self._draining = False
            if not self._holding:
                self._flush()
        self._run_answered()

    def _flush(self) -> None:
        assert self.writer is not None
        # Sends first: a leader's proposals reach the followers, whose fsyncs decide the commit,
        # before its own log hand-off (which never precedes a send it must: that is LogSync.then).
        self.transport.flush()  # one write per peer for everything this pass sent
        self.writer.flush()

    @contextlib.contextmanager
    def holding(self):
        """Start several requests (start_submit, start_sync) and send their proposals and
        log them together, once the block ends: one write per peer and one hand-off to
        the log writer instead of one each per request. The block must not wait on
        anything (no checkpoint): nothing leaves this node while it runs."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and self._started:
                self._flush()

    async def _persist_epochs(self) -> None:
        """Write each epoch the core asked for off the event loop; the inbox waits for it."""
        while True:
            await self._persist_wakeup.wait()
            self._persist_wakeup = trio.Event()
            assert self._persisting is not None
            await trio.to_thread.run_sync(self._persist_epoch, self._persisting)
            self._persisting = None
            self._drain()

    # -- actions ---------------------------------------------------------------------------
    def _execute(self, actions: list[Action]) -> None:
        assert self.writer is not None
        for i, a in enumerate(actions):
            if isinstance(a, _LOG_ACTIONS):
                if isinstance(a, SnapBegin):
                    long_lived.suspend()  # a new tree is built from the chunks: no collections meanwhile
                elif isinstance(a, SnapDiscard):
                    long_lived.resume()
                elif isinstance(a, InstallSnapshot):
                    long_lived.settle_built("snap installed")  # the new tree is long-lived: out of the collector's way
                    long_lived.resume()
                elif isinstance(a, TakeSnapshot):
                    long_lived.settle("snapshot")
                elif isinstance(a, LogAppend) and self._leading and metrics.ENABLED:
                    now, proposed = time.perf_counter(), self._proposed_at
                    for txn in a.txns:
                        proposed[txn.zxid] = now
                self.writer.submit(a)
            elif isinstance(a, Send):
                if a.to == self.cfg.my_id:
                    self._inbox.append(Received(a.to, a.msg))
                else:
                    self.transport.send(a.to, a.msg, flush=False)
            elif isinstance(a, PersistEpoch):
                # Disk before anything after it: the rest resumes once the write returns.
                self._persisting = a
                rest = actions[i + 1:]
                if rest:
                    self._inbox.appendleft(_Resume(rest))
                self._persist_wakeup.set()
                return
            else:
                self._execute_other(a)

    def _execute_other(self, a: Action) -> None:
        if isinstance(a, Delivered):
            if self._proposed_at:
                started = self._proposed_at.pop(a.txn.zxid, None)
                if started is not None:
                    metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
            self._answer(a.txn.session_id, a.txn.cxid, result=a.result)
            if self._listener is not None:
                self._listener.delivered(a.txn, a.result)
        elif isinstance(a, Answered):
            self._answer(a.session_id, a.cxid, result=a.result)
        elif isinstance(a, Synced):
            self._answer(a.session_id, a.cxid, result=a.zxid)
        elif isinstance(a, SessionsTouched):
            if self._listener is not None:
                self._listener.sessions_touched(a.frm, a.session_ids)
        elif isinstance(a, LeaderTicked):
            if self._listener is not None:
                self._listener.leader_ticked(a.now_ms)
        elif isinstance(a, RequestFailed):
            self._answer(a.session_id, a.cxid, error=NoLeader(f"no established leader ({a.reason}); retry shortly"))
        elif isinstance(a, RoleChanged):
            self._role_metrics(a.role)
            if self._listener is not None:
                self._listener.role_changed(a.role, a.leader, a.epoch, a.broadcasting)
            log.info("event=role node=%s role=%s leader=%s epoch=%s", self.cfg.my_id, a.role.value, a.leader, a.epoch)
            self._fail_all(OutcomeUnknown(f"node {self.cfg.my_id} became {a.role.value}; the request may or may "
                                          "not have committed"))
        elif isinstance(a, EnsembleChanged):
            # Small and rare: written before anything after it, as the core expects of a persist.
            write_ensemble(self.data_dir, a.ensemble)
            self.transport.set_members(peer_addresses(a.ensemble))
            log.info("event=ensemble node=%s version=%#x voters=%s observers=%s", self.cfg.my_id, a.ensemble.version,
                     sorted(a.ensemble.voters), sorted(a.ensemble.observers))
        elif isinstance(a, Disconnect):
            log.warning("event=disconnect node=%s peer=%s reason=%r", self.cfg.my_id, a.peer, a.reason)
            self.transport.disconnect(a.peer)
        else:
            raise TypeError(f"unexpected action {a!r}")

    def _role_metrics(self, role: Role) -> None:
        self._leading = role is Role.LEADING
        self._proposed_at.clear()  # a new role: proposals of the last one commit, if ever, under another
        if role is Role.LOOKING:
            if self._looking_since is None:
                metrics.ELECTIONS.inc()
                self._looking_since = time.perf_counter()
        elif self._looking_since is not None:
            metrics.ELECTION_SECONDS.observe(time.perf_counter() - self._looking_since)
            self._looking_since = None

    def listen(self, listener: "DriverListener") -> None:
        """Tell `listener` of every delivery, session touch, role change and (on a leader) tick, in order.

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
        return await self._start(session_id, cxid, lambda rid: ClientSync(session_id, rid))

    def touch(self, session_ids: tuple[int, ...]) -> None:
        """Report client sessions active on this node (the leader decides expiry)."""
        self._feed((TouchSessions(session_ids),))

    async def submit(self, session_id: int, cxid: int, request: bytes) -> object:
        """Replicate one write; returns what the state machine's apply() returned, once
        the transaction is delivered here.

        Raises NoLeader (retry later) or OutcomeUnknown (the leader changed while
        the request was in flight).
        """
        return await (await self.start_submit(session_id, cxid, request)).result()

    async def start_submit(self, session_id: int, cxid: int, request: bytes, decoded: object = None) -> "Pending":
        """Hand a write to the peer now and return without waiting for it to commit.

        Writes started one after another from one task are proposed in that order, so
        a client connection can pipeline many writes and still see ZooKeeper's FIFO
        order; await `.result()` of each for its outcome. `decoded`: what the state
        machine's prepare() would decode `request` to, if the caller has it (the
        ClientRequest event's field).
        """
        return await self._start(session_id, cxid, lambda rid: ClientRequest(session_id, rid, request, decoded))

    async def _start(self, session_id: int, cxid: int, make: Callable[[int], Event]) -> "Pending":
        """`cxid` is the caller's number for the request; Zab carries a unique identity instead."""
        if not self._running:
            raise NoLeader(f"node {self.cfg.my_id} is not running")
        await self._wait_log_room()
        if not self._running:
            raise NoLeader(f"node {self.cfg.my_id} is not running")
        self._request_seq = (self._request_seq + 1) & _REQUEST_SEQ_MASK
        key = (session_id, self.cfg.my_id << _REQUEST_SEQ_BITS | self._request_seq)
        assert key not in self._waiters, f"request identity {key} reused while in flight (caller's cxid {cxid})"
        waiter = self._waiters[key] = _Waiter()
        try:
            self._feed((make(key[1]),))  # stepped here and now: proposed before this returns
        except BaseException:
            self._waiters.pop(key, None)
            raise
        return Pending(self, key, waiter)

    def _answer(self, session_id: int, cxid: int, *, result: object = None,
                error: Exception | None = None) -> None:
        waiter = self._waiters.pop((session_id, cxid), None)
        if waiter is not None:
            self._settle(waiter, result, error)

    def _settle(self, waiter: _Waiter, result: object, error: Exception | None) -> None:
        waiter.result, waiter.error = result, error
        waiter.done.set()
        if waiter.on_done is not None:
            self._answered.append(waiter.on_done)  # run after this pass (see Pending.notify)

    def _run_answered(self) -> None:
        while self._answered:
            answered, self._answered = self._answered, []
            for callback in answered:
                callback()

    def _fail_all(self, error: Exception) -> None:
        for key, w in list(self._waiters.items()):
            if w.in_core:
                del self._waiters[key]
                self._settle(w, None, error)

    # -- observation ----------------------------------------------------------------------------
    def status(self) -> dict:
        if self.peer is None:
            return {"id": self.cfg.my_id, "role": "starting"}
        s = self.peer.status()
        s["pid"] = os.getpid()
        s["peers"] = self.transport.connected_peers()
        s["log"] = self.writer.statistics() if self.writer else {}
        s["transport"] = dict(vars(self.transport.stats))
        s["gc_frozen_objects"] = long_lived.frozen_objects()
        return s
