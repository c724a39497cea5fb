"""A whole Zab ensemble in one process, driven by one seed.

Every node runs the real pure core (zab.peer.Peer) over a simulated network
and disk; time is simulated milliseconds; all randomness comes from one
`random.Random(seed)`, so a failing run replays exactly from its seed. The
invariant oracles of replay.invariants are checked on every delivery, every
leader establishment and every flush of a log.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from replay.invariants import DeliveryOracle, InvariantViolation, LeadershipOracle
from sim.disk import SimDisk
from sim.network import SimNetwork
from zab.acks import coalesce_acks
from zab.actions import (Action, Answered, ClientRequest, Delivered, Disconnect, InstallSnapshot, LogAppend, LogSync,
                         LogTruncate, PeerDisconnected, PersistEpoch, Received, RequestFailed, RoleChanged, Send,
                         SessionsTouched, Synced, TakeSnapshot, Tick)
from zab.config import ZabConfig
from sim.kv_state_machine import KVStateMachine, decode_result, encode_put
from zab.leader import LeaderRole
from zab.peer import Peer


@dataclass
class ClientOp:
    node: int
    key: str
    value: str
    session_id: int
    cxid: int
    status: str = "pending"  # pending | acked | refused | failed | unknown
    zxid: int | None = None
    result: dict | None = None


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

    @property
    def alive(self) -> bool:
        return self.peer is not None


class SimCluster:
    def __init__(self, voters: int = 3, observers: int = 0, seed: int = 0, *, tick_ms: int = 50,
                 crash_keeps_unsynced: bool = True, disk_latency_ms: dict[int, int] | None = None,
                 state_machine: Callable[[], object] = KVStateMachine, **config: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = SimNetwork(self.rng)
        self.now = 0
        self.tick_ms = tick_ms
        self.crash_keeps_unsynced = crash_keeps_unsynced
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
        self.trace: list[str] = []
        self._events: list[tuple[int, int, tuple]] = []
        self._seq = 0
        self._cxid = 0
        self.steps = 0
        for i in ids:
            self.restart(i)

    # -- scheduling ---------------------------------------------------------------
    def _at(self, t: int, *event) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, event))

    def zab_config(self, i: int) -> ZabConfig:
        return ZabConfig(my_id=i, voters=self.voters, observers=self.observers, tick_ms=self.tick_ms, **self.config)

    # -- node lifecycle -----------------------------------------------------------
    def restart(self, i: int) -> None:
        node = self.nodes[i]
        assert not node.alive, f"node {i} is running"
        node.incarnation += 1
        recovered = node.disk.recover()
        node.peer = Peer(self.zab_config(i), self.state_machine(), recovered)
        node.prev_delivered = recovered.snapshot_zxid
        node.queue, node.flush_scheduled = [], False
        self._log(f"restart {i} last={node.peer.last_zxid:#x}")
        self._execute(node, node.peer.start())
        self._at(self.now + self.rng.randint(1, self.tick_ms), "tick", i, node.incarnation)

    def crash(self, i: int) -> None:
        node = self.nodes[i]
        if not node.alive:
            return
        self._log(f"crash {i}")
        if self.crash_keeps_unsynced and node.queue:
            self._apply_writes(node, node.queue[: self.rng.randint(0, len(node.queue))], run_then=False)
        node.queue = []
        node.peer = None
        node.incarnation += 1
        for op in node.pending.values():
            op.status = "unknown"
        node.pending.clear()
        for j in self.nodes:
            if j != i:
                self._break(i, j)

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
    def put(self, node: int, key: str, value: str, version: int | None = None) -> ClientOp:
        """A write of the key-value demo state machine."""
        return self.submit(node, encode_put(key, value, version), key=key, value=value)

    def submit(self, node: int, request: bytes, *, session_id: int | None = None, key: str = "",
               value: str = "") -> ClientOp:
        """Any write request for the cluster's state machine, through `node`."""
        self._cxid += 1
        op = ClientOp(node, key, value, (node << 48) | 1 if session_id is None else session_id, self._cxid)
        self.ops.append(op)
        n = self.nodes[node]
        if not n.alive:
            op.status = "failed"
            return op
        n.pending[(op.session_id, op.cxid)] = op
        self._at(self.now, "request", node, n.incarnation, op.session_id, op.cxid, request)
        return op

    def inject(self, node: int, event) -> None:
        """Hand any core event (ClientSync, TouchSessions, ...) to a live node now."""
        n = self.nodes[node]
        if n.alive:
            self._at(self.now, "event", node, n.incarnation, event)

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
        deadline = self.now + timeout_ms
        while self._events and self._events[0][0] <= deadline:
            if predicate():
                return True
            t, _, event = heapq.heappop(self._events)
            self.now = t
            self._dispatch(event)
        self.now = max(self.now, deadline)
        return predicate()

    def _dispatch(self, event: tuple) -> None:
        kind, i, incarnation = event[0], event[1], event[2]
        node = self.nodes[i]
        if not node.alive or node.incarnation != incarnation:
            return
        self.steps += 1
        if kind == "tick":
            self._step(node, Tick())
            self._at(self.now + self.tick_ms, "tick", i, incarnation)
        elif kind == "msg":
            frm, gen, msg = event[3], event[4], event[5]
            if self.net.current(frm, i, gen) and self.nodes[frm].alive:
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

    def _step(self, node: SimNode, event) -> None:
        assert node.peer is not None
        self._execute(node, node.peer.step(event))
        role = node.peer.role_state if node.peer else None
        if isinstance(role, LeaderRole) and role.established:
            assert role.epoch is not None
            self.leadership.established(role.epoch, node.id)

    # -- actions ----------------------------------------------------------------------
    def _execute(self, node: SimNode, actions: list[Action]) -> None:
        for a in actions:
            if not node.alive:
                return
            if isinstance(a, (LogAppend, LogSync, LogTruncate, TakeSnapshot)):
                self._queue_write(node, a)
            elif isinstance(a, Send):
                self._send(node, a)
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
                op = node.pending.pop((a.txn.session_id, a.txn.cxid), None)
                if op is not None:
                    op.result = decode_result(a.result) if isinstance(a.result, bytes) else a.result
                    op.status, op.zxid = "acked", a.txn.zxid
            elif isinstance(a, Answered):
                op = node.pending.pop((a.session_id, a.cxid), None)
                if op is not None:
                    op.result = decode_result(a.result) if isinstance(a.result, bytes) else a.result
                    # KV's answer is a dict, the metastore's an Applied: both name the zxid it follows.
                    after = op.result["zxid"] if isinstance(op.result, dict) else op.result.zxid
                    if after > node.prev_delivered:
                        raise InvariantViolation(f"node {node.id} answered a refusal ordered after {after:#x} "
                                                 f"having delivered {node.prev_delivered:#x}")
                    op.status = "refused"
            elif isinstance(a, RequestFailed):
                op = node.pending.pop((a.session_id, a.cxid), None)
                if op is not None:
                    op.status = "failed"
            elif isinstance(a, RoleChanged):
                self._log(f"node {node.id} -> {a.role.value} leader={a.leader} epoch={a.epoch}")
                for op in node.pending.values():
                    op.status = "unknown"
                node.pending.clear()
            elif isinstance(a, Synced):
                self.synced.append((node.id, a))
            elif isinstance(a, SessionsTouched):
                self.touched.append((node.id, a))
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
            self._at(self.now + latency, "flush", node.id, node.incarnation)

    def _send(self, node: SimNode, a: Send) -> None:
        if a.to == node.id:
            self._at(self.now, "local", node.id, node.incarnation, a.msg)
            return
        target = self.nodes.get(a.to)
        if target is None or not target.alive:
            return
        slot = self.net.schedule(node.id, a.to, self.now)
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
            elif isinstance(a, InstallSnapshot):
                disk.install_snapshot(a.zxid, a.state)
            elif isinstance(a, TakeSnapshot):
                disk.take_snapshot(a.frozen.zxid, a.frozen.to_bytes())
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
        """The established leader, if exactly one live node is established and heard by a quorum."""
        for i, n in self.nodes.items():
            r = n.peer.role_state if n.peer else None
            if isinstance(r, LeaderRole) and r.established:
                return i
        return None

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
