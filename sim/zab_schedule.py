"""Random fault schedules for the simulated Zab + metastore ensemble (sim.cluster.SimCluster).

A `Scenario` is one seed, an ensemble shape, a few configuration knobs and a
list of steps: client writes (creates and compare-and-set setDatas of five
znodes) through any node, crashes (never more than a minority of voters down
at once, except "crash_all" which takes every node down and restarts every
node at once), restarts, partitions (random halves or one node isolated),
heals and runs of simulated time; with `tail_faults`, a crash may also leave a
torn or corrupt log tail (sim.disk). The invariant oracles of replay.invariants
watch the whole run. Afterwards the network heals, every node restarts, and the
ensemble must converge (liveness), answer every request, keep taking writes,
and pass check_final() plus the history oracles here.

The repr of a Scenario is a Python literal that replays it exactly; sim.explore
prints one step per line. tests/test_zab_sim_random.py draws scenarios with
hypothesis through the same builder.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from metastore.errors import TxnConflict
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.tree import next_version
from metastore.core.txn import SetData
from metastore.wire.txn_codec import decode_txn
from replay.invariants import InvariantViolation
from sim.cluster import ANY_VERSION, SimCluster
from zab.core.actions import LogAppend

KEYS = ("k0", "k1", "k2", "k3", "k4")
CONVERGE_TIMEOUT_MS = 120_000
SETTLE_MS = 2_000
CRASH_WRITING_MS = 200

# Knobs passed to SimCluster as ZabConfig fields. Small windows force SNAP syncs
# and frequent local snapshots; the defaults exercise DIFF and TRUNC only.
OPTION_SETS: tuple[tuple[tuple[str, int], ...], ...] = (
    (),
    (("sync_window_txns", 4), ("snapshot_every_txns", 5)),
    (("sync_window_txns", 2), ("snapshot_every_txns", 3)),
    (("snapshot_every_txns", 7),),
    # Ticks as short as network delays, and tight limits: timeouts fire mid-sync.
    (("tick_ms", 5), ("sync_limit_ticks", 3), ("ping_interval_ticks", 1), ("init_limit_ticks", 6)),
    (("tick_ms", 10), ("init_limit_ticks", 4), ("sync_window_txns", 3), ("snapshot_every_txns", 4)),
)


# -- scenarios ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """Everything a run depends on; its repr is a Python literal that replays it."""
    seed: int
    voters: int
    observers: int
    crash_keeps_unsynced: bool
    options: tuple[tuple[str, int], ...]
    steps: tuple[tuple, ...]
    tail_faults: bool = False  # a crash may tear or garble the log append in flight (sim.disk)


class Chooser:
    """The choices a schedule makes, from hypothesis (shrinkable) or from a seeded Random."""

    def __init__(self, integer: Callable[[int, int], int]) -> None:
        self.integer = integer

    def pick(self, items):
        items = list(items)
        return items[self.integer(0, len(items) - 1)]


# Step kinds, weighted by repetition. Hypothesis shrinks towards the first.
_KINDS = (("create",) * 2 + ("set",) * 4 + ("run",) * 6 + ("burst",) * 2 + ("crash",) * 2 + ("crash_leader",) * 2
          + ("crash_writing",) * 2 + ("restart",) * 3 + ("partition", "isolate", "isolate_leader", "heal", "heal", "crash_all"))


def build_scenario(seed: int, c: Chooser, max_steps: int, *, exact: bool = False) -> Scenario:
    """A scenario from `c`'s choices: up to `max_steps` drawn steps (exactly that many if `exact`)."""
    voters = c.pick((3, 5))
    observers = c.pick((0, 0, 1))
    ids = list(range(1, voters + observers + 1))
    max_voters_down = (voters - 1) // 2
    down: set[int] = set()
    steps: list[tuple] = []
    n_steps = c.integer(0, max_steps)
    if exact:  # drawn all the same, so the choices after it are those of the inexact scenario
        n_steps = max_steps
    for n in range(n_steps):
        kind = c.pick(_KINDS)
        alive = [i for i in ids if i not in down]
        voters_down = len([i for i in down if i <= voters])
        if kind == "create":
            steps.append(("create", c.pick(alive), c.pick(KEYS), f"v{n}"))
        elif kind == "set":
            version = c.pick((ANY_VERSION,) * 4 + (0, 1, 2))
            steps.append(("set", c.pick(alive), c.pick(KEYS), f"v{n}", version))
        elif kind == "burst":
            steps.append(("burst", c.pick(alive), c.integer(2, 12)))
        elif kind == "crash_leader":
            # Resolved when it runs (the leader is not known here); skipped there if no
            # voter may go down, so the schedule's own bookkeeping cannot tell.
            steps.append(("crash_leader",))
        elif kind == "isolate_leader":
            steps.append(("isolate_leader",))
        elif kind in ("crash", "crash_writing"):
            eligible = [i for i in alive if i > voters or voters_down < max_voters_down]
            if eligible:
                victim = c.pick(eligible)
                down.add(victim)
                steps.append((kind, victim))
        elif kind == "restart":
            if down:
                back = c.pick(sorted(down))
                down.discard(back)
                steps.append(("restart", back))
            else:
                steps.append(("restart_any",))
        elif kind == "crash_all":
            steps += [("crash_all",), ("restart_all",)]
            down.clear()
        elif kind == "partition":
            side = frozenset(i for i in ids if c.integer(0, 1))
            if side and len(side) < len(ids):
                steps.append(("partition", tuple(sorted(side)), tuple(i for i in ids if i not in side)))
        elif kind == "isolate":
            steps.append(("isolate", c.pick(ids)))
        elif kind == "heal":
            steps.append(("heal",))
        else:
            steps.append(("run", c.pick((5, 20, 100, 300, 700, 1500, 3000))))
    keeps_unsynced, options = bool(c.integer(0, 3)), c.pick(OPTION_SETS)
    # Drawn last, so every earlier choice is what it was before tail faults existed.
    return Scenario(seed, voters, observers, keeps_unsynced, options, tuple(steps), tail_faults=bool(c.integer(0, 1)))


def scenario_from_seed(seed: int, max_steps: int = 40, *, exact: bool = False) -> Scenario:
    """A scenario determined by one integer (for replay, soak and CI seeds)."""
    rng = random.Random(seed)
    return build_scenario(seed, Chooser(rng.randint), max_steps, exact=exact)


# -- running ------------------------------------------------------------------------------
def apply_step(c: SimCluster, step: tuple) -> None:
    """Play one step of a scenario on `c` (crash and restart steps respect the minority rule)."""
    kind = step[0]
    if kind == "create":
        _, node, key, value = step
        c.create(node, key, value)
    elif kind == "set":
        _, node, key, value, version = step
        c.set_data(node, key, value, version)
    elif kind == "burst":
        _, node, count = step
        for k in range(count):  # creates first (refused once the znode exists), so the setDatas after them succeed
            key, value = KEYS[k % len(KEYS)], f"b{len(c.ops)}"
            if k < len(KEYS):
                c.create(node, key, value)
            else:
                c.set_data(node, key, value)
    elif kind == "crash":
        _crash_within_minority(c, step[1])
    elif kind == "crash_writing":
        _crash_while_writing(c, step[1])
    elif kind == "crash_leader":
        leader = c.leader()
        if leader is not None:
            _crash_within_minority(c, leader)
    elif kind == "isolate_leader":
        leader = c.leader()
        if leader is not None:
            c.partition({leader}, set(c.nodes) - {leader})
    elif kind == "restart":
        if not c.nodes[step[1]].alive:
            c.restart(step[1])
    elif kind == "restart_any":
        down = [i for i in c.nodes if not c.nodes[i].alive]
        if down:
            c.restart(down[0])
    elif kind == "crash_all":
        for i in c.nodes:
            c.crash(i)
    elif kind == "restart_all":
        _restart_all(c)
    elif kind == "partition":
        c.partition(set(step[1]), set(step[2]))
    elif kind == "isolate":
        c.partition({step[1]}, set(c.nodes) - {step[1]})
    elif kind == "heal":
        c.heal()
    elif kind == "run":
        c.run(step[1])
    else:
        raise ValueError(f"unknown step {step!r}")


def _crash_within_minority(c: SimCluster, node: int) -> None:
    """Crash `node` unless that would take a majority of the voters down."""
    voters_down = len([i for i in c.voters if not c.nodes[i].alive])
    if node in c.observers or voters_down < (len(c.voters) - 1) // 2:
        c.crash(node)


def _crash_while_writing(c: SimCluster, node: int) -> None:
    """A write through `node`, then crash it once its log writer holds an append not yet
    fsynced (if that comes within CRASH_WRITING_MS): the only moment a crash can lose,
    tear or garble a log tail. Between steps the queues are usually empty."""
    if c.nodes[node].alive:
        c.create(node, f"w{len(c.ops)}", "x")  # a fresh znode: never refused, so always logged
        c.run_until(lambda: any(isinstance(a, LogAppend) for a in c.nodes[node].queue), CRASH_WRITING_MS)
    _crash_within_minority(c, node)


def _restart_all(c: SimCluster) -> None:
    for i in c.nodes:
        if not c.nodes[i].alive:
            c.restart(i)


def run_scenario(sc: Scenario) -> SimCluster:
    """Play `sc`, recover everything, and check liveness and every oracle.

    Any failure carries the scenario and the end of the cluster trace as exception notes.
    """
    c = SimCluster(sc.voters, sc.observers, seed=sc.seed, crash_keeps_unsynced=sc.crash_keeps_unsynced,
                   tail_faults=sc.tail_faults, **dict(sc.options))
    try:
        for step in sc.steps:
            apply_step(c, step)
            _check_nodes(c)
        c.heal()
        _restart_all(c)
        check_recovered(c)
    except BaseException as e:  # noqa: BLE001 - re-raised unchanged, with the replay recipe attached
        e.add_note(f"replay: run_scenario({sc!r})")
        e.add_note(c.describe_failure())
        raise
    return c


def _check_nodes(c: SimCluster) -> None:
    """Per-node invariants, between steps: a node never claims what it has not applied."""
    for i in c.alive():
        p = c.peer(i)
        if p.sm.last_zxid != p.last_committed:
            raise InvariantViolation(f"node {i}: state machine at {p.sm.last_zxid:#x} but last committed "
                                     f"zxid {p.last_committed:#x} (ZOOKEEPER-2355)")
        if not p.last_committed <= p.last_zxid:
            raise InvariantViolation(f"node {i}: committed {p.last_committed:#x} beyond logged {p.last_zxid:#x}")
        if p.current_epoch > p.accepted_epoch:
            raise InvariantViolation(f"node {i}: currentEpoch {p.current_epoch} > acceptedEpoch {p.accepted_epoch}")


def check_recovered(c: SimCluster) -> None:
    """Liveness and every end-of-run oracle, once the network healed and every node is up:
    convergence, every request answered, check_final, the committed history, writes resume."""
    assert c.run_until(c.converged, CONVERGE_TIMEOUT_MS), (
        f"liveness: no convergence {CONVERGE_TIMEOUT_MS} ms after heal and restart of all nodes: "
        f"{[c.peer(i).describe() for i in c.alive()]}")
    # Requests still in flight at the moment of convergence get their answer now.
    c.run(SETTLE_MS)
    _check_nodes(c)
    assert c.converged(), f"the ensemble did not stay converged: {[c.peer(i).describe() for i in c.alive()]}"
    pending = [op for op in c.ops if op.status == "pending"]
    assert not pending, f"liveness: requests never answered after convergence: {pending}"
    c.check_final()
    _check_history(c)
    _check_writes_resume(c)


def _check_history(c: SimCluster) -> None:
    """Oracles beyond check_final(), over the global committed history."""
    order = [c.deliveries.data[z] for z in c.deliveries.order]
    final = c.peer(c.alive()[0]).last_committed
    if order and order[-1].zxid > final:
        raise InvariantViolation(f"a delivered transaction {order[-1].zxid:#x} is beyond the converged {final:#x}")
    seen: set[tuple[int, int]] = set()
    for t in order:
        if t.session_id == 0:
            continue
        if (t.session_id, t.cxid) in seen:
            raise InvariantViolation(f"request {(t.session_id, t.cxid)} committed twice (again at {t.zxid:#x})")
        seen.add((t.session_id, t.cxid))
    for op in c.ops:
        if op.status == "failed" and (op.session_id, op.cxid) in seen:
            raise InvariantViolation(f"request {op.key}={op.value} cxid={op.cxid} was failed (NoLeader) "
                                     "to its client but committed")
    # The transactions carry the versions the leader predicted; replayed in order
    # from the empty state they must agree with themselves and with every node.
    replayed = MetastoreStateMachine()
    for t in order:
        body = decode_txn(t.data).body
        if isinstance(body, SetData):
            stat = replayed.tree.exists(body.path)
            expected = None if stat is None else next_version(stat.version)
            if body.version != expected:
                raise InvariantViolation(f"txn {t.zxid:#x} sets {body.path} to version {body.version}, "
                                         f"but the committed history before it implies {expected}")
        try:  # a create of a znode that exists, or under a parent at another cversion, does not fit
            replayed.apply(t.zxid, t.data)
        except TxnConflict as e:
            raise InvariantViolation(f"txn {t.zxid:#x} does not fit the committed history before it: {e}") from e
    digests = {c.peer(i).sm.digest() for i in c.alive()}
    if digests != {replayed.digest()}:
        raise InvariantViolation(f"replaying the committed history gives digest {replayed.digest()}, "
                                 f"the nodes have {digests}")


def _check_writes_resume(c: SimCluster) -> None:
    ops = [c.create(i, f"after-{i}", "x") for i in c.alive()]
    assert c.run_until(lambda: all(op.status == "acked" for op in ops), 30_000), (
        f"liveness: writes after recovery not acknowledged: {[(op.node, op.status) for op in ops]}")
    assert c.run_until(c.converged, 30_000)
    c.check_final()


