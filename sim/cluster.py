"""A whole Zab ensemble in one process, driven by one seed.

Every node runs the real pure core (zab.core.peer.Peer) over a simulated network
and disk; time is simulated milliseconds; time, events and all randomness come from
one sim.scheduler.Scheduler(seed), so a failing run replays exactly from its seed
(a LedgerWorld built on the cluster runs on the same scheduler). The
invariant oracles of replay.invariants are checked on every delivery, every
leader establishment and every flush of a log.

The state machine is the metastore's (metastore.core.state_machine), the one the
daemon replicates. A test's client writes are ZooKeeper creates and setDatas of
top-level znodes named by a key (`SimCluster.create`, `SimCluster.set_data`), or any
request (`SimCluster.submit`); sim.client_ops builds the requests (also for a real
`PeerDriver`) and holds `ClientOp`, which can tell its submitter when it settles.
Faults: crash / restart, partition / heal, and pause / resume (a SIGSTOP: the node is
frozen, nothing sent to it is lost). With `expire_sessions` the leader expires sessions
on its ticks as the daemon does (sim.sessions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from metastore.core.state_machine import MetastoreStateMachine
from replay.invariants import DeliveryOracle, InvariantViolation, LeadershipOracle
from sim.client_ops import (ANY_VERSION, ClientOp, create_request, error_of, path_of,  # noqa: F401 - re-exported
                            read_key, set_data_request, version_of)
from sim.disk import TAIL_FAULTS, SimDisk
from sim.network import SimNetwork
from sim.scheduler import Scheduler
from sim.sessions import SimSessions
from zab.core.acks import coalesce_acks
from zab.core.actions import (Action, Answered, ClientRequest, Delivered, Disconnect, EnsembleChanged, InstallSnapshot, LogAppend, LogSync,
                         SnapBegin, SnapDiscard, SnapWrite,
                         LogTruncate, PeerDisconnected, PersistEpoch, Received, RequestFailed, RoleChanged, Send,
                         SessionsTouched, Synced, TakeSnapshot, Tick, LeaderTicked, TouchSessions)
from zab.core.config import ZabConfig
from zab.core.leader import LeaderRole
from zab.core.peer import Peer

_TICK = Tick()  # a Tick has no fields: one serves every tick
SIM_SNAPSHOT_CHUNK_BYTES = 4096  # small, so the simulated trees' local snapshots take many pieces


@dataclass
class SimNode:
    id: int
    disk: SimDisk
    peer: Peer | None = None
    incarnation: int = 0
    queue: list[Action] = field(default_factory=list)
    flush_scheduled: bool = False
    prev_delivered: int = 0
    pending: dict[tuple[int, int], ClientOp] = field(default_factory=dict)
    reported_epoch: int | None = None  # the last epoch the leadership oracle heard this node lead
    paused: bool = False  # SIGSTOPped (SimCluster.pause): what reaches it waits in `held`
    held: list[tuple] = field(default_factory=list)
    tick_missed: bool = False  # its timer came due while paused: it fires once at resume

    @property
    def alive(self) -> bool:
        return self.peer is not None


def _in_flight_append(lost: list[Action]) -> LogAppend | None:
    """The append a crash interrupted: the first one the lost writes hold, unless a truncation
    or a snapshot install comes first (the tail bytes would then belong to another log)."""
    for a in lost:
        if isinstance(a, LogAppend):
            return a if a.txns else None
        if isinstance(a, (LogTruncate, InstallSnapshot)):
            return None
    return None


def _settle_all(node: SimNode, status: str) -> None:
    """Every request waiting at `node` gets `status` (its client's connection is gone)."""
    pending = list(node.pending.values())
    node.pending.clear()  # first: an on_done may submit again through this node
    for op in pending:
        op.settle(status)


class SimCluster:
    """`voters` + `observers` nodes (ids from 1) running `zab.core.peer.Peer` on a fresh
    `state_machine()` per incarnation (by default the metastore's), with `config` as
    ZabConfig fields. `expire_sessions` (metastore only) runs each node's session expiry as the
    daemon does (sim.sessions); off, LeaderTicked is ignored and no session ever expires."""

    def __init__(self, voters: int = 3, observers: int = 0, seed: int = 0, *, tick_ms: int = 50,
                 crash_keeps_unsynced: bool = True, tail_faults: bool = False,
                 disk_latency_ms: dict[int, int] | None = None,
                 state_machine: Callable[[], object] = MetastoreStateMachine, expire_sessions: bool = False,
                 **config: int) -> None:
        self.seed = seed
        self.sched = Scheduler(seed)  # a LedgerWorld built on this cluster runs on it too
        self.rng = self.sched.rng
        self._at = self.sched.bind(self._dispatch)  # _at(t, *event): _dispatch(event) at t
        self.net = SimNetwork(self.rng)
        self.tick_ms = tick_ms
        self.crash_keeps_unsynced = crash_keeps_unsynced
        self.tail_faults = tail_faults
        self.disk_latency_ms = dict(disk_latency_ms or {})
        self.state_machine = state_machine
        ids = list(range(1, voters + observers + 1))
        self.voters = frozenset(ids[:voters])
        self.observers = frozenset(ids[voters:])
        self.config = config
        self.nodes = {i: SimNode(i, SimDisk(i)) for i in ids}
        self.deliveries = DeliveryOracle()
        self.leadership = LeadershipOracle()
        self.ops: list[ClientOp] = []
        self.synced: list[tuple[int, Synced]] = []
        self.touched: list[tuple[int, SessionsTouched]] = []
        self.sessions = SimSessions(lambda i, req, sid: self.submit(i, req, session_id=sid),
                                    lambda: self.sched.now, tick_ms) if expire_sessions else None
        self.trace: list[str] = []
        self._cxid = 0
        self.steps = 0
        for i in ids:
            self.restart(i)

    # -- scheduling ---------------------------------------------------------------
    @property
    def now(self) -> int:
        """Simulated milliseconds since the start (the scheduler's clock; the hot paths below
        read `self.sched.now` and skip the property)."""
        return self.sched.now

    def zab_config(self, i: int) -> ZabConfig:
        return ZabConfig(my_id=i, voters=self.voters, observers=self.observers, tick_ms=self.tick_ms, **self.config)

    # -- node lifecycle -----------------------------------------------------------
    def restart(self, i: int) -> None:
        node = self.nodes[i]
        assert not node.alive, f"node {i} is running"
        node.incarnation += 1
        recovered = node.disk.recover()
        node.peer = Peer(self.zab_config(i), self.state_machine(), recovered, node.disk.ensemble)
        node.prev_delivered = recovered.snapshot_zxid
        node.queue, node.flush_scheduled = [], False
        if self.sessions is not None:
            self.sessions.restarted(i)
        self._log(f"restart {i} last={node.peer.last_zxid:#x}")
        self._execute(node, node.peer.start())
        self._at(self.now + self.rng.randint(1, self.tick_ms), "tick", i, node.incarnation)

    def crash(self, i: int, tail: str | None = None) -> None:
        """Stop node `i`: its queued writes were never fsynced. With `crash_keeps_unsynced` a
        random prefix of them reached the disk anyway; `tail` ("torn", "corrupt"; with
        `tail_faults`, a seeded choice) damages the append that was in flight after that prefix
        (sim.disk.SimDisk.damage_tail), if there is one."""
        node = self.nodes[i]
        if not node.alive:
            return
        queue, kept = node.queue, 0
        if self.crash_keeps_unsynced and queue:
            kept = self.rng.randint(0, len(queue))
            self._apply_writes(node, queue[:kept], run_then=False)
        if tail is None and self.tail_faults:
            tail = self.rng.choice((None,) + TAIL_FAULTS)
        in_flight = _in_flight_append(queue[kept:]) if tail else None
        if in_flight is not None:
            node.disk.damage_tail(in_flight.txns, tail, self.rng)
        self._log(f"crash {i}" + (f" ({tail} tail)" if in_flight is not None else ""))
        node.queue, node.held = [], []
        node.peer, node.paused = None, False
        node.incarnation += 1
        _settle_all(node, "unknown")
        for j in self.nodes:
            if j != i:
                self._break(i, j)

    def pause(self, i: int) -> None:
        """SIGSTOP node `i`: it steps nothing (no ticks, messages, disk completions, client
        events) but loses nothing: each event for it is held, in order, until `resume`. Its
        links stay up unless the other side drops them (its peers' own timeouts, Disconnect);
        messages on a link that broke before they reached it are lost, as anywhere."""
        node = self.nodes[i]
        if node.alive and not node.paused:
            self._log(f"pause {i}")
            node.paused = True

    def resume(self, i: int) -> None:
        """SIGCONT: node `i` steps everything it was sent while paused, in order, before any
        later event; then its timer fires once (missed ticks are not replayed as a burst) and
        its ticks go on every tick_ms from now."""
        node = self.nodes[i]
        if not node.paused:
            return
        held, node.held, node.paused = node.held, [], False
        self._log(f"resume {i} ({len(held)} events held)")
        for event in held:
            self._dispatch(event)
        if node.tick_missed and node.alive:
            node.tick_missed = False
            self._at(self.now, "tick", i, node.incarnation)

    def _hold(self, node: SimNode, event: tuple) -> None:
        kind = event[0]
        if kind == "tick":
            node.tick_missed = True  # and no next tick: resume starts the timer again
        elif kind == "msg":  # in its socket buffer once it arrived on a live link: read at resume
            frm, gen, msg = event[3], event[4], event[5]
            if self.net.current(frm, node.id, gen) and self.nodes[frm].peer is not None:
                node.held.append(("recv", node.id, event[2], frm, msg))
        else:
            node.held.append(event)

    def _break(self, a: int, b: int) -> None:
        if a not in self.nodes or b not in self.nodes:
            return  # a stranger's id (forge): it has no link to break
        self.net.break_link(a, b)
        for x, y in ((a, b), (b, a)):
            if self.nodes[x].alive:
                self._at(self.now, "disc", x, self.nodes[x].incarnation, y)

    def partition(self, *groups: set[int]) -> None:
        self._log(f"partition {groups}")
        for a, b in self.net.partition(*groups):
            for x, y in ((a, b), (b, a)):
                if self.nodes[x].alive:
                    self._at(self.now, "disc", x, self.nodes[x].incarnation, y)

    def heal(self) -> None:
        self._log("heal")
        self.net.heal()

    # -- clients ------------------------------------------------------------------
    def create(self, node: int, key: str, value: str = "") -> ClientOp:
        """A client of `node` creates the znode `path_of(key)` holding `value`. The leader
        refuses it with NodeExists if the znode exists in its view of the future (the
        committed tree plus every write it prepared before): no two creates of one key
        both succeed. Acknowledged, `op.version` is 0."""
        return self.submit(node, create_request(key, value, origin=node, time_ms=self.now), key=key, value=value)

    def set_data(self, node: int, key: str, value: str, version: int = ANY_VERSION) -> ClientOp:
        """A client of `node` sets the data of `path_of(key)` to `value` if its version is
        `version` (ANY_VERSION: any): refused with NoNode or BadVersion otherwise.
        Acknowledged, `op.version` is the version it produced (one more than before)."""
        request = set_data_request(key, value, version, origin=node, time_ms=self.now)
        return self.submit(node, request, key=key, value=value)

    def submit(self, node: int, request: bytes, *, session_id: int | None = None, key: str = "",
               value: str = "") -> ClientOp:
        """Any write request for the cluster's state machine, through `node` (for the
        metastore, an envelope whose origin is `node`). The default session is one per node."""
        self._cxid += 1
        op = ClientOp(node, key, value, (node << 48) | 1 if session_id is None else session_id, self._cxid)
        self.ops.append(op)
        n = self.nodes[node]
        if not n.alive:
            op.status = "failed"  # before any on_done is set: the caller sees it at once
            return op
        n.pending[(op.session_id, op.cxid)] = op
        self._at(self.now, "request", node, n.incarnation, op.session_id, op.cxid, request)
        return op

    def inject(self, node: int, event) -> None:
        """Hand any core event (ClientSync, TouchSessions, ...) to a live node now."""
        n = self.nodes[node]
        if n.alive:
            self._at(self.now, "event", node, n.incarnation, event)

    def touch(self, node: int, *session_ids: int) -> None:
        """Clients of these sessions were active on `node` (the service's `driver.touch`): the
        leader hears of it with `node`'s next ping, or at once if `node` leads."""
        self.inject(node, TouchSessions(session_ids))

    def forge(self, node: int, frm: int, msg) -> None:
        """A hostile peer's message: `node` receives `msg` as if from `frm` (any id, member
        or not, up or down), outside every link of the simulated network."""
        n = self.nodes[node]
        if n.alive:
            self._log(f"forged {type(msg).__name__} {frm} -> {node}")
            self._at(self.now, "event", node, n.incarnation, Received(frm, msg))

    # -- running --------------------------------------------------------------------
    def run(self, ms: int) -> None:
        self.run_until(lambda: False, ms)

    def run_until(self, predicate: Callable[[], bool], timeout_ms: int) -> bool:
        """Run events (of every world on this cluster's scheduler) until `predicate()` holds
        (True) or `timeout_ms` simulated ms pass (False)."""
        return self.sched.run_until(predicate, timeout_ms)

    def _dispatch(self, event: tuple) -> None:
        kind, i, incarnation = event[0], event[1], event[2]
        node = self.nodes[i]
        # Millions of events in the random tests: `peer is None`, not the `alive` property.
        if node.peer is None or node.incarnation != incarnation:
            return
        if node.paused:
            self._hold(node, event)
            return
        self.steps += 1
        if kind == "tick":
            self._step(node, _TICK)
            self._at(self.sched.now + self.tick_ms, "tick", i, incarnation)
        elif kind == "msg":
            frm, gen, msg = event[3], event[4], event[5]
            if self.net.current(frm, i, gen) and self.nodes[frm].peer is not None:
                self._step(node, Received(frm, msg))
        elif kind == "local":
            self._step(node, Received(i, event[3]))
        elif kind == "disc":
            self._step(node, PeerDisconnected(event[3]))
        elif kind == "flush":
            node.flush_scheduled = False
            queue, node.queue = node.queue, []
            self._apply_writes(node, queue, run_then=True)
        elif kind == "request":
            self._step(node, ClientRequest(event[3], event[4], event[5]))
        elif kind == "event":
            self._step(node, event[3])
        elif kind == "recv":  # a message held while the node was paused
            self._step(node, Received(event[3], event[4]))

    def _step(self, node: SimNode, event) -> None:
        assert node.peer is not None
        self._execute(node, node.peer.step(event))
        role = node.peer.role_state if node.peer is not None else None
        if isinstance(role, LeaderRole) and role.established and role.epoch != node.reported_epoch:
            assert role.epoch is not None
            # Once per epoch a node leads: the oracle's answer cannot change until the epoch does.
            node.reported_epoch = role.epoch
            self.leadership.established(role.epoch, node.id)

    # -- actions ----------------------------------------------------------------------
    def _execute(self, node: SimNode, actions: list[Action]) -> None:
        for a in actions:
            if node.peer is None:
                return
            if isinstance(a, Send):  # the most frequent action first
                self._send(node, a)
            elif isinstance(a, (LogAppend, LogSync, LogTruncate, TakeSnapshot, SnapBegin, SnapWrite, SnapDiscard)):
                self._queue_write(node, a)
            elif isinstance(a, InstallSnapshot):
                # The core restored its state machine to the leader's snapshot: deliveries
                # continue from there (the writer makes it durable later).
                node.prev_delivered = a.zxid
                self._queue_write(node, a)
            elif isinstance(a, PersistEpoch):
                node.disk.persist_epoch(a.accepted, a.current)
            elif isinstance(a, Delivered):
                self.deliveries.delivered(node.id, node.prev_delivered, a.txn)
                node.prev_delivered = a.txn.zxid
                if self.sessions is not None:
                    self.sessions.delivered(node.id, a.result)
                op = node.pending.pop((a.txn.session_id, a.txn.cxid), None)
                if op is not None:
                    op.result, op.zxid = a.result, a.txn.zxid
                    op.settle("acked")
            elif isinstance(a, Answered):
                op = node.pending.pop((a.session_id, a.cxid), None)
                if op is not None:
                    op.result = a.result
                    after = a.result.zxid  # refused() stamps the zxid the answer was ordered after
                    if after > node.prev_delivered:
                        raise InvariantViolation(f"node {node.id} answered a refusal ordered after {after:#x} "
                                                 f"having delivered {node.prev_delivered:#x}")
                    op.settle("refused")
            elif isinstance(a, RequestFailed):
                op = node.pending.pop((a.session_id, a.cxid), None)
                if op is not None:
                    op.settle("failed")
            elif isinstance(a, RoleChanged):
                self._log(f"node {node.id} -> {a.role.value} leader={a.leader} epoch={a.epoch}")
                _settle_all(node, "unknown")
                if self.sessions is not None:
                    self.sessions.role_changed(node.id)
            elif isinstance(a, Synced):
                self.synced.append((node.id, a))
            elif isinstance(a, SessionsTouched):
                self.touched.append((node.id, a))
                if self.sessions is not None:
                    self.sessions.touched(node.id, a.session_ids)
            elif isinstance(a, LeaderTicked):
                if self.sessions is not None:
                    self.sessions.leader_ticked(node.id, a.now_ms, node.peer.sm.tree.sessions)
            elif isinstance(a, EnsembleChanged):
                self._log(f"node {node.id} ensemble {a.ensemble.version:#x}: {sorted(a.ensemble.voters)} voters, "
                          f"{sorted(a.ensemble.observers)} observers")
                node.disk.ensemble = a.ensemble  # the daemon writes its file before it goes on
            elif isinstance(a, Disconnect):
                self._log(f"node {node.id} disconnects {a.peer}: {a.reason}")
                self._break(node.id, a.peer)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _queue_write(self, node: SimNode, a: Action) -> None:
        node.queue.append(a)
        if not node.flush_scheduled:
            node.flush_scheduled = True
            latency = self.disk_latency_ms.get(node.id) or self.rng.randint(1, 4)
            self._at(self.sched.now + latency, "flush", node.id, node.incarnation)

    def _send(self, node: SimNode, a: Send) -> None:
        if a.to == node.id:
            self._at(self.sched.now, "local", node.id, node.incarnation, a.msg)
            return
        target = self.nodes.get(a.to)
        if target is None or target.peer is None:
            return
        slot = self.net.schedule(node.id, a.to, self.sched.now)
        if slot is not None:
            self._at(slot[0], "msg", a.to, target.incarnation, node.id, slot[1], a.msg)

    def _apply_writes(self, node: SimNode, queue: list[Action], run_then: bool) -> None:
        disk = node.disk
        then: list[Action] = []
        for a in queue:
            if isinstance(a, LogAppend):
                disk.append(a.txns)
            elif isinstance(a, LogTruncate):
                disk.truncate_after(a.zxid)
            elif isinstance(a, SnapBegin):
                disk.snap_begin(a.zxid)
            elif isinstance(a, SnapWrite):
                disk.snap_write(a.data)
                then.extend(a.then)  # the SNAPACK, once the chunk is "written"
            elif isinstance(a, SnapDiscard):
                disk.snap_discard()
            elif isinstance(a, InstallSnapshot):
                disk.install_snapshot(a.zxid)
            elif isinstance(a, TakeSnapshot):
                # In pieces, as the real log writer encodes it; kept whole on the simulated disk.
                disk.take_snapshot(a.frozen.zxid, b"".join(a.frozen.chunks(SIM_SNAPSHOT_CHUNK_BYTES)))
            elif isinstance(a, LogSync):
                then.extend(a.then)
        disk.check()
        if run_then:
            disk.fsyncs += 1
            self._execute(node, coalesce_acks(then))  # one fsync for the queue: the log writer's rule too

    # -- observation ---------------------------------------------------------------------
    def _log(self, line: str) -> None:
        self.trace.append(f"{self.now:>7} {line}")

    def alive(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.alive]

    def leader(self) -> int | None:
        """The established leader, if exactly one live node is established and heard by a quorum
        (a paused node is not: it answers nobody)."""
        for i, n in self.nodes.items():
            r = n.peer.role_state if n.peer and not n.paused else None
            if isinstance(r, LeaderRole) and r.established:
                return i
        return None

    def read(self, node: int, key: str) -> tuple[str, int] | None:
        """The data (UTF-8) and version of `path_of(key)` in what `node` has applied, or
        None if it has no such znode there."""
        return read_key(self.peer(node).sm, key)

    def peer(self, i: int) -> Peer:
        p = self.nodes[i].peer
        assert p is not None, f"node {i} is down"
        return p

    def in_broadcast(self, ids=None) -> bool:
        ids = self.alive() if ids is None else ids
        return self.leader() is not None and all(self.peer(i).phase.value == "broadcast" for i in ids)

    def converged(self) -> bool:
        alive = self.alive()
        if not self.in_broadcast(alive):
            return False
        peers = [self.peer(i) for i in alive]
        return len({(p.last_committed, p.last_zxid) for p in peers}) == 1

    def check_final(self) -> None:
        """After convergence: equal state everywhere and no acknowledged write lost."""
        peers = [self.peer(i) for i in self.alive()]
        digests = {p.sm.digest() for p in peers}
        if len(digests) != 1:
            raise InvariantViolation(f"tree digests differ at {[hex(p.last_committed) for p in peers]}: {digests}")
        committed = peers[0].last_committed
        for op in self.ops:
            if op.status == "acked":
                assert op.zxid is not None
                if op.zxid > committed or op.zxid not in self.deliveries.index:
                    raise InvariantViolation(f"acknowledged write {op.key}={op.value} at {op.zxid:#x} lost")
                txn = self.deliveries.data[op.zxid]
                if (txn.session_id, txn.cxid) != (op.session_id, op.cxid):
                    raise InvariantViolation(f"acknowledged write {op.key}={op.value} answered by another txn")

    def describe_failure(self) -> str:
        return f"seed={self.seed} (replay: SimCluster(..., seed={self.seed}))\n" + "\n".join(self.trace[-40:])
