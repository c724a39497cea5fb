"""Random fault schedules over one simulator: a Zab + metastore ensemble (sim.cluster) holding
the metadata of a ledger that is written and recovered on simulated bookies (sim.ledger_world),
every event on one scheduler from one seed.

A `MixedPlan` is one ledger (ensemble, write and ack quorums) on a metastore of 3 or 5 voters
and a list of timed steps inside a fault window: Zab faults (crash a voter or the leader,
never a majority of voters at once; restart; partition; isolate the leader; heal; with
`tail_faults` a crash may tear the log append in flight), bookie crashes and restarts, a
writer crash or close, and recoverers (some crashing halfway) while the writer appends.
Every metadata change of the ledger (ensemble changes, marking IN_RECOVERY, closing) is a
compare-and-set committed by Zab, so a leader change can fall between a recoverer's (or the
closing writer's) CAS and its answer.

After the window everything heals: every node and bookie up, the network whole. Then the
oracles of both worlds must hold:
- the ensemble converges and passes sim.zab_schedule.check_recovered (check_final, the
  committed history, every request answered, writes resume);
- the ledger is CLOSED in the metastore, every node of which holds the same metadata, and
  LedgerWorld.check_closed_ledger holds (every acknowledged entry is in the closed ledger
  with Qa genuine copies on its recorded bookies);
- every recoverer that finished agrees on that closed metadata, and none failed; a writer
  whose close completed closed exactly that metadata;
- the writer got no acknowledgement after it broke (fenced), checked as it happens.
With `journal` the bookies answer only after a simulated fsync and their crashes lose unsynced
records (sim/bookie_journal.py). With `autorecovery` an auditor and replication workers run
throughout (sim/autorecovery.py): a bookie down for its grace period is lost and its fragments
re-replicated while the writer writes and recoverers recover, and a `(ms, "lose_bookie", b)`
step loses a bookie for good (its disk wiped, never restarted). Then, after recovery, the
replica check runs, AutoRecovery must settle, and check_rereplicated must hold (every entry with
Qw genuine copies on live bookies the metadata names, none lost); the recoverers' and the
closing writer's metadata must equal the final one but for replaced lost bookies (no change lost).
The repr of a plan replays it; sim.explore prints it one step per line (`--mixed`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ledger.writer import WriterState
from sim.autorecovery import SimAutoRecovery, check_rereplicated, same_but_repaired
from sim.cluster import SimCluster
from sim.ledger_world import InvariantViolation, LedgerWorld
from sim.zab_schedule import apply_step, check_recovered

FAULT_WINDOW_MS = 600
TICK_MS = 10  # the ensemble's tick: elections within tens of ms, like the ledger's timeouts
CONVERGE_MS = 120_000
RECOVERY_MS = 120_000
AUTORECOVERY_MS = 60_000
# Longer than the fault window: only a bookie lost for good is declared lost. Half the plans with
# AutoRecovery draw SHORT_GRACE_MS instead: bookies that come back at the heal were declared lost
# meanwhile, and the worker must drop them from its tasks (ReplicationTask.rejudged) or a task with
# Qw=1, or with no spare bookie, stays stuck for ever (the bug that drawing it found).
AUTORECOVERY_GRACE_MS = 1_000
SHORT_GRACE_MS = 150
JOURNAL_FSYNC_MS = (1, 12)
APPEND_EVERY_MS = 8  # the writer's appends span the window, so bookie crashes make ensemble changes
_KINDS = ("zab",) * 6 + ("bookie",) * 4 + ("recoverer",) * 2 + ("writer_crash", "writer_close")
_ZAB = ("crash",) * 2 + ("crash_leader",) * 3 + ("restart",) * 3 + ("partition", "isolate_leader", "heal", "heal")


@dataclass(frozen=True)
class MixedPlan:
    """Everything a mixed run depends on; its repr is a Python literal that replays it.
    Steps are `(ms, "zab", zab step)` (sim.zab_schedule.apply_step's), `(ms, "bookie",
    "crash" | "restart", bookie)`, `(ms, "writer_crash")` and `(ms, "recoverer", crash after
    ms or None)`, `(ms, "writer_close")`, `(ms, "lose_bookie", bookie)`, in time order."""
    seed: int
    voters: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    bookies: int
    entries: int
    tail_faults: bool
    steps: tuple[tuple, ...]
    journal: bool = False
    autorecovery: bool = False
    autorecovery_grace_ms: int = AUTORECOVERY_GRACE_MS


def plan_from_seed(seed: int, max_steps: int = 12) -> MixedPlan:
    """A plan determined by one integer: up to `max_steps` drawn steps, then one more recoverer,
    and (half the time) a leader crash or isolation within 20 ms of each recoverer."""
    rng = random.Random(seed)
    voters = rng.choice((3, 5))
    e = rng.randint(1, 5)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    bookies = rng.randint(e, e + 3)
    steps = [(rng.randint(0, FAULT_WINDOW_MS), *_step(rng, voters, bookies)) for _ in range(rng.randint(0, max_steps))]
    steps.append((rng.randint(0, FAULT_WINDOW_MS), "recoverer", rng.choice((None, rng.randint(1, 100)))))
    # Biased toward the rare path (BUGGIFY): the metastore's leader goes while a recoverer's
    # compare-and-sets are in flight.
    for ms, *_ in [s for s in steps if s[1] == "recoverer"]:
        if rng.randint(0, 1):
            steps.append((ms + rng.randint(0, 20), "zab", (rng.choice(("crash_leader", "isolate_leader")),)))
    entries, tail_faults = rng.randint(1, 75), bool(rng.randint(0, 1))
    # Drawn last: with both off, a seed plays exactly the plan it played before they existed.
    journal, autorecovery = bool(rng.randint(0, 1)), bool(rng.randint(0, 1))
    if autorecovery and qa >= 2 and bookies > e and rng.randint(0, 2):
        # At most one bookie lost for good: Qa >= 2 keeps a replica of every acknowledged entry.
        steps.append((rng.randint(0, FAULT_WINDOW_MS), "lose_bookie", rng.randint(1, e)))
    grace = rng.choice((AUTORECOVERY_GRACE_MS, SHORT_GRACE_MS)) if autorecovery else AUTORECOVERY_GRACE_MS
    return MixedPlan(seed, voters, e, qw, qa, bookies, entries, tail_faults,
                     tuple(sorted(steps, key=lambda s: s[0])), journal, autorecovery, grace)


def _step(rng: random.Random, voters: int, bookies: int) -> tuple:
    kind = rng.choice(_KINDS)
    if kind == "zab":
        z = rng.choice(_ZAB)
        if z in ("crash", "restart"):
            return ("zab", (z, rng.randint(1, voters)))
        if z == "partition":
            side = tuple(i for i in range(1, voters + 1) if rng.randint(0, 1))
            if not side or len(side) == voters:
                return ("zab", ("heal",))
            return ("zab", ("partition", side, tuple(i for i in range(1, voters + 1) if i not in side)))
        return ("zab", (z,))
    if kind == "bookie":
        return ("bookie", rng.choice(("crash", "crash", "restart")), rng.randint(1, bookies))
    if kind == "recoverer":
        return ("recoverer", rng.choice((None, rng.randint(1, 100))))
    return (kind,)


# -- running ---------------------------------------------------------------------------------------
def run_mixed(plan: MixedPlan) -> tuple[SimCluster, LedgerWorld]:
    """Play `plan` on one scheduler, heal, recover the ledger and check every oracle (module
    docstring). A failure carries the plan and the end of both traces as exception notes."""
    c = SimCluster(plan.voters, seed=plan.seed, tick_ms=TICK_MS, tail_faults=plan.tail_faults)
    world = LedgerWorld(bookies=plan.bookies, metastore=c, journal=plan.journal, fsync_ms=JOURNAL_FSYNC_MS)
    ar = SimAutoRecovery(world, grace_ms=plan.autorecovery_grace_ms) if plan.autorecovery else None
    try:
        assert c.run_until(c.converged, CONVERGE_MS), "liveness: the metastore never elected a leader"
        lid = world.create_ledger(tuple(range(1, plan.ensemble_size + 1)), plan.write_quorum,
                                  plan.ack_quorum).ledger_id
        world.writer("w", lid)
        _play(plan, c, world, lid)
        _heal(c, world)
        check_recovered(c)
        _recover(world, lid)
        if ar is not None:
            _settle(world, ar, lid)
        check_mixed(c, world, lid)
    except BaseException as e:  # noqa: BLE001 - re-raised unchanged, with the replay recipe attached
        e.add_note(f"replay: run_mixed({plan!r})")
        e.add_note(c.describe_failure())
        e.add_note("\n".join(world.log[-20:]))
        raise
    finally:
        if ar is not None:
            ar.stop()
    return c, world


def _settle(world: LedgerWorld, ar: SimAutoRecovery, lid: int) -> None:
    """AutoRecovery until no task is left and no lost bookie is named; then the replica check and
    its refill until no task is left."""
    gone = world.gone
    metadata, _ = world.meta.read(lid)
    if not metadata.is_closed:  # the recoverers finished: nothing may wait for a writer any more
        raise InvariantViolation(f"ledger {lid} is {metadata.state.value} after its recovery, not CLOSED")

    def settled() -> bool:
        return ar.idle() and not world.meta.read(lid)[0].bookies & gone
    assert world.run_until(settled, AUTORECOVERY_MS), f"AutoRecovery did not settle: {ar.tasks} {ar.failures[-3:]}"
    ar.check_copied_before_replaced()
    ar.replica_check()
    assert world.run_until(ar.idle, AUTORECOVERY_MS), f"the replica check did not settle: {ar.tasks} {ar.failures[-3:]}"
    check_rereplicated(world, lid, gone)


def _play(plan: MixedPlan, c: SimCluster, world: LedgerWorld, lid: int) -> None:
    """The fault window, one simulated ms at a time: steps due, an append every APPEND_EVERY_MS."""
    steps, appended = list(plan.steps), 0
    starting: list[tuple[int, int | None]] = []   # recoverers waiting for a metastore node to open on
    crashes: dict[str, int] = {}                  # recoverer -> when it crashes
    writer = world.clients["w"]
    for ms in range(FAULT_WINDOW_MS + 1):
        while steps and steps[0][0] <= ms:
            step = steps.pop(0)
            if step[1] == "recoverer":
                starting.append((ms, step[2]))
            else:
                _apply(c, world, step)
        if starting and world.meta.readable(lid):
            _, crash_after = starting.pop(0)
            name = f"r{len(crashes)}"
            world.recoverer(name, lid)
            crashes[name] = ms + crash_after if crash_after is not None else -1
        for name, when in crashes.items():
            if when == ms:
                world.crash_client(name)
        writing = writer.alive and writer.op.state is WriterState.OPEN
        if writing and ms % APPEND_EVERY_MS == 0 and appended < plan.entries:
            world.append("w", b"entry %d" % appended)
            appended += 1
        world.run(1)


def _apply(c: SimCluster, world: LedgerWorld, step: tuple) -> None:
    kind = step[1]
    if kind == "zab":
        apply_step(c, step[2])
    elif kind == "bookie":
        if step[3] not in world.gone:
            (world.crash_bookie if step[2] == "crash" else world.restart_bookie)(step[3])
    elif kind == "lose_bookie":
        world.lose_bookie(step[2])
    elif kind == "writer_crash":
        world.crash_client("w")
    elif kind == "writer_close":
        if world.clients["w"].alive and world.clients["w"].op.state is WriterState.OPEN:
            world.close("w")  # its CAS to CLOSED races the recoverers' through Zab
    else:
        raise ValueError(f"unknown step {step!r}")


def _heal(c: SimCluster, world: LedgerWorld) -> None:
    c.heal()
    for i in c.nodes:
        if not c.nodes[i].alive:
            c.restart(i)
    for b in world.bookies:
        if b not in world.gone:
            world.restart_bookie(b)


def _recover(world: LedgerWorld, lid: int) -> None:
    """Run every live recoverer to its end; start one if none is left."""
    recoverers = [cl for name, cl in world.clients.items() if name.startswith("r") and cl.alive]
    if not recoverers:
        recoverers = [world.recoverer("final", lid)]
    assert world.run_until(lambda: all(r.done for r in recoverers), RECOVERY_MS), "recovery made no progress"


def check_mixed(c: SimCluster, world: LedgerWorld, lid: int) -> None:
    """The ledger's oracles after recovery (module docstring), read from the metastore."""
    assert c.run_until(c.converged, CONVERGE_MS), "the ensemble did not converge again"
    copies = {i: world.meta.read_on(i, lid) for i in c.alive()}
    if len(set(map(repr, copies.values()))) != 1:
        raise InvariantViolation(f"metastore nodes disagree on ledger {lid}'s metadata: {copies}")
    closed = world.check_closed_ledger(lid)
    recoverers = [cl for name, cl in world.clients.items() if name.startswith(("r", "final"))]
    finished = [r for r in recoverers if r.result is not None]
    lost = world.gone.union(*(a.ever_lost for a in world.autorecovery))  # bookies AutoRecovery may replace
    if not finished or any(not same_but_repaired(r.result, closed, lost) for r in finished):
        raise InvariantViolation(f"recoverers disagree with the closed metadata {closed}: "
                                 f"{[(r.name, r.result) for r in finished]}")
    failed = [(r.name, r.error) for r in recoverers if r.error is not None]
    if failed:
        raise InvariantViolation(f"recoverers failed: {failed}")
    writer = world.clients["w"]
    if writer.result is not None and not same_but_repaired(writer.result, closed, lost):
        raise InvariantViolation(f"the writer's close completed with {writer.result}, the ledger closed as {closed}")
