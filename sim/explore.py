"""Explore one seeded fault schedule and print a replayable failure.

    python -m sim.explore --seed N --steps M            # the Zab + metastore ensemble
    python -m sim.explore --seed N --steps M --ledger   # the ledger world
    python -m sim.explore --seed N --steps M --mixed    # both, one scheduler: ledger metadata in Zab
    python -m sim.explore --schedule FILE               # replay a printed schedule exactly

The Zab run builds `sim.zab_schedule.scenario_from_seed(N, M, exact=True)`: M draws
of steps: client writes through random nodes, crashes (with lost, torn or corrupt
log tails when the scenario has tail faults), restarts, partitions and heals, then
heals everything and checks liveness, `SimCluster.check_final` and the history
oracles. The ledger run builds `sim.ledger_schedule.story_from_seed(N, M)` (at most
M bookie faults) and checks the closed ledger, the recoverers and the readers. The mixed
run builds `sim.mixed_schedule.plan_from_seed(N, M)` (up to M drawn steps: Zab faults,
bookie faults, writer crashes and closes, recoverers; then one more recoverer, and leader
faults next to recoverers) and checks both worlds' oracles on one scheduler. Half the
stories and plans run bookie journals (answers after a simulated fsync, unsynced records
lost in crashes: the summary counts `fsyncs` and `unsynced_lost`); half the mixed plans run
AutoRecovery, some losing a bookie for good (the summary's `lost`, `repairs`,
`fragments_repaired`), and then check that every lost bookie's fragments were re-replicated.

On success one line: `ok <world> seed=N ...`, exit status 0. On a failure: the seed,
the schedule (a header dict, then one step per line, every line a Python literal;
save it to a file and pass it to --schedule to replay), and the failure; exit status 1.

The simulation is pure (one random.Random per run, no clock); only `main` reads a
schedule file and prints.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, fields

from sim.ledger_schedule import Story, check, run_story, story_from_seed
from sim.mixed_schedule import MixedPlan, plan_from_seed, run_mixed
from sim.zab_schedule import Scenario, run_scenario, scenario_from_seed

SCHEDULE_COMMENT = "# sim.explore schedule: save as FILE, replay with python -m sim.explore --schedule FILE"


@dataclass(frozen=True)
class Outcome:
    """What one run came to: `failure` None when every invariant held."""
    world: str  # "zab" | "ledger" | "mixed"
    seed: int
    schedule: str  # format_schedule's text: replays the run exactly
    summary: str
    failure: str | None

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return self.failure is None

    def report(self) -> str:
        """What the runner prints: one line on success; seed, schedule and failure otherwise."""
        if self.ok:
            return self.summary
        return (f"FAILED {self.world} seed={self.seed}\n--- schedule ---\n{self.schedule}"
                f"--- failure ---\n{self.failure}")


# -- schedules as text ------------------------------------------------------------------------
Plan = Scenario | Story | MixedPlan
_WORLDS = {Scenario: "zab", Story: "ledger", MixedPlan: "mixed"}


def format_schedule(plan: Plan) -> str:
    """A header dict, then one step per line, each line a Python literal (parse_schedule reads it)."""
    if isinstance(plan, (Scenario, MixedPlan)):
        header = {"world": _WORLDS[type(plan)]} | {f.name: getattr(plan, f.name) for f in fields(plan)
                                                   if f.name != "steps"}
        steps: list[tuple] = list(plan.steps)
    else:
        skip = ("bookie_faults", "writer_crash_ms", "recoverers")
        header = {"world": "ledger"} | {f.name: getattr(plan, f.name) for f in fields(plan) if f.name not in skip}
        steps = [("bookie", *fault) for fault in plan.bookie_faults]
        steps += [("recoverer", start, crash_after) for start, crash_after in plan.recoverers]
        if plan.writer_crash_ms is not None:
            steps.append(("writer_crash", plan.writer_crash_ms))
    return "\n".join([SCHEDULE_COMMENT, repr(header), *(repr(s) for s in steps)]) + "\n"


def parse_schedule(text: str) -> Plan:
    """The plan a format_schedule text describes (comments and blank lines ignored)."""
    lines = [ast.literal_eval(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines or not isinstance(lines[0], dict):
        raise ValueError("a schedule starts with its header dict")
    header, steps = dict(lines[0]), [tuple(s) for s in lines[1:]]
    world = header.pop("world", "zab")
    if world == "zab":
        return Scenario(**header, steps=tuple(steps))
    if world == "mixed":
        return MixedPlan(**header, steps=tuple(steps))
    if world != "ledger":
        raise ValueError(f"unknown world {world!r}")
    faults = tuple(sorted(s[1:] for s in steps if s[0] == "bookie"))
    recoverers = tuple(s[1:] for s in steps if s[0] == "recoverer")
    crashes = [s[1] for s in steps if s[0] == "writer_crash"]
    unknown = [s for s in steps if s[0] not in ("bookie", "recoverer", "writer_crash")]
    if unknown or len(crashes) > 1:
        raise ValueError(f"not ledger steps: {unknown or crashes}")
    return Story(**header, bookie_faults=faults, recoverers=recoverers, writer_crash_ms=crashes[0] if crashes else None)


# -- running ------------------------------------------------------------------------------------
def run(plan: Plan) -> Outcome:
    """Play `plan` and check every invariant; never raises for a failed run (see Outcome.failure)."""
    schedule = format_schedule(plan)
    world = _WORLDS[type(plan)]
    try:
        runner = {"zab": _run_zab, "ledger": _run_ledger, "mixed": _run_mixed}[world]
        summary = runner(plan)
    except Exception as e:  # noqa: BLE001 - the failure is the outcome: reported with its schedule
        notes = [n for n in getattr(e, "__notes__", []) if not n.startswith("replay: ")]
        return Outcome(world, plan.seed, schedule, "", "\n".join([f"{type(e).__name__}: {e}", *notes]))
    return Outcome(world, plan.seed, schedule, summary, None)


def _run_zab(sc: Scenario) -> str:
    c = run_scenario(sc)
    peer = c.peer(c.alive()[0])
    acked = sum(op.status == "acked" for op in c.ops)
    cuts = sum(len(n.disk.cuts) for n in c.nodes.values())
    return (f"ok zab seed={sc.seed} steps={len(sc.steps)} nodes={len(c.nodes)} acked={acked}/{len(c.ops)} "
            f"committed={peer.last_committed:#x} tail_cuts={cuts} digest={peer.sm.digest()}")


def _run_ledger(story: Story) -> str:
    world = run_story(story)
    check(world)
    closed, _ = world.meta.read(1)
    writer = world.clients["w"]
    return (f"ok ledger seed={story.seed} faults={len(story.bookie_faults)} acked={len(writer.acked)} "
            f"closed_at={closed.last_entry}{_journal_summary(world)}")


def _run_mixed(plan: MixedPlan) -> str:
    c, world = run_mixed(plan)
    closed, version = world.meta.read(1)
    writer = world.clients["w"]
    return (f"ok mixed seed={plan.seed} steps={len(plan.steps)} acked={len(writer.acked)} "
            f"closed_at={closed.last_entry} metadata_version={version} cas={len(world.meta.writes)} "
            f"connection_losses={world.meta.connection_losses} committed={c.peer(c.alive()[0]).last_committed:#x}"
            f"{_journal_summary(world)}{_autorecovery_summary(world)}")


def _journal_summary(world) -> str:
    journals = [b.journal for b in world.bookies.values() if b.journal is not None]
    if not journals:
        return ""
    return f" fsyncs={sum(j.fsyncs for j in journals)} unsynced_lost={sum(j.lost_records for j in journals)}"


def _autorecovery_summary(world) -> str:
    if not world.autorecovery:
        return ""
    ar = world.autorecovery[0]
    repaired = sum(c.op.stats["fragments_repaired"] for n, c in world.clients.items() if n.startswith("ar"))
    return (f" lost={sorted(ar.ever_lost)} repairs={len(ar.repaired)} workers={ar.workers} "
            f"fragments_repaired={repaired}")


def explore(seed: int, steps: int, *, ledger: bool = False, mixed: bool = False) -> Outcome:
    """Build the schedule of `seed` (`steps` drawn steps, or at most `steps` bookie faults for
    the ledger world, or up to `steps` drawn steps of the mixed world) and run it."""
    if mixed:
        return run(plan_from_seed(seed, steps))
    return run(story_from_seed(seed, steps) if ledger else scenario_from_seed(seed, steps, exact=True))


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m sim.explore", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ledger", action="store_true", help="the ledger world instead of the Zab ensemble")
    parser.add_argument("--mixed", action="store_true", help="both on one scheduler, ledger metadata in Zab")
    parser.add_argument("--schedule", metavar="FILE", help="replay the schedule a failed run printed")
    args = parser.parse_args(argv)
    if args.schedule:
        with open(args.schedule, encoding="utf-8") as f:  # the runner's one file: the schedule to replay
            outcome = run(parse_schedule(f.read()))
    else:
        outcome = explore(args.seed, args.steps, ledger=args.ledger, mixed=args.mixed)
    print(outcome.report())
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
