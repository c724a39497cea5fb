"""The explorer (sim/explore.py): a fixed budget of seeds through every world (the Zab ensemble,
the ledger world, and both on one scheduler), exact replay of a printed schedule, and the report
of a failure (a planted oracle failure: the real ones hold)."""

from __future__ import annotations

import pytest

import sim.mixed_schedule
import sim.zab_schedule
from replay.invariants import InvariantViolation
from sim.explore import explore, format_schedule, main, parse_schedule, run
from sim.ledger_schedule import story_from_seed
from sim.mixed_schedule import plan_from_seed
from sim.zab_schedule import Scenario, scenario_from_seed

# CI's fixed budget: every seed here must keep every invariant. About a second in all.
ZAB_SEEDS, ZAB_STEPS = range(16), 30
LEDGER_SEEDS, LEDGER_FAULTS = range(16), 6
MIXED_SEEDS, MIXED_STEPS = range(48), 14  # about two seconds
# Mixed seeds that lose a bookie for good, with AutoRecovery on: about three seconds.
AUTORECOVERY_SEEDS = [s for s in range(300) if any(step[1] == "lose_bookie" for step in plan_from_seed(s, 14).steps)]


def test_a_fixed_budget_of_zab_seeds_keeps_every_invariant() -> None:
    outcomes = [explore(s, ZAB_STEPS) for s in ZAB_SEEDS]
    failures = [o.report() for o in outcomes if not o.ok]
    assert not failures, "\n\n".join(failures)
    # Some seed must cut a torn or corrupt tail, or the budget leaves the disk faults untested.
    assert sum(int(o.summary.split("tail_cuts=")[1].split()[0]) for o in outcomes) > 0


def test_a_fixed_budget_of_ledger_seeds_keeps_every_invariant() -> None:
    failures = [o.report() for o in (explore(s, LEDGER_FAULTS, ledger=True) for s in LEDGER_SEEDS) if not o.ok]
    assert not failures, "\n\n".join(failures)


def test_a_fixed_budget_of_mixed_seeds_keeps_every_invariant() -> None:
    outcomes = [explore(s, MIXED_STEPS, mixed=True) for s in MIXED_SEEDS]
    failures = [o.report() for o in outcomes if not o.ok]
    assert not failures, "\n\n".join(failures)
    # Some metadata request must have met a metastore fault, or the budget mixes nothing.
    assert sum(int(o.summary.split("connection_losses=")[1].split()[0]) for o in outcomes) > 0
    # Half the plans run bookie journals: some crash must have lost an unsynced record.
    journaled = [o for o in outcomes if "unsynced_lost=" in o.summary]
    assert sum(int(o.summary.split("unsynced_lost=")[1].split()[0]) for o in journaled) > 0


def test_a_fixed_budget_of_autorecovery_seeds_re_replicates_every_lost_bookie() -> None:
    """Half the mixed plans run with bookie journals and half with AutoRecovery; these lose a bookie
    for good: the ledger closes, every fragment on the lost bookie is re-replicated (check_rereplicated:
    every entry with Qw genuine copies on live bookies the metadata names) and the recoverers' metadata
    equals the final one but for the replaced bookie."""
    assert len(AUTORECOVERY_SEEDS) >= 20
    outcomes = [explore(s, MIXED_STEPS, mixed=True) for s in AUTORECOVERY_SEEDS]
    failures = [o.report() for o in outcomes if not o.ok]
    assert not failures, "\n\n".join(failures)
    repaired = sum(int(o.summary.split("fragments_repaired=")[1].split()[0]) for o in outcomes)
    assert repaired >= len(outcomes) // 2, "most lost bookies held a fragment: some must have been repaired"


@pytest.mark.parametrize("seed", [3, 11])
def test_a_run_is_deterministic_from_its_seed(seed: int) -> None:
    assert explore(seed, ZAB_STEPS) == explore(seed, ZAB_STEPS)
    assert explore(seed, LEDGER_FAULTS, ledger=True) == explore(seed, LEDGER_FAULTS, ledger=True)
    assert explore(seed, MIXED_STEPS, mixed=True) == explore(seed, MIXED_STEPS, mixed=True)


@pytest.mark.parametrize("seed", [0, 5, 9])
def test_a_printed_schedule_replays_to_the_same_outcome(seed: int) -> None:
    for outcome in (explore(seed, ZAB_STEPS), explore(seed, LEDGER_FAULTS, ledger=True),
                    explore(seed, MIXED_STEPS, mixed=True)):
        assert run(parse_schedule(outcome.schedule)) == outcome


def test_a_schedule_prints_one_step_per_line_and_parses_back() -> None:
    sc = scenario_from_seed(7, 25, exact=True)
    text = format_schedule(sc)
    assert len(text.splitlines()) == 2 + len(sc.steps)  # the comment, the header, one line per step
    assert parse_schedule(text) == sc
    story = story_from_seed(7)
    assert parse_schedule(format_schedule(story)) == story
    plan = plan_from_seed(7, MIXED_STEPS)
    text = format_schedule(plan)
    assert len(text.splitlines()) == 2 + len(plan.steps)
    assert parse_schedule(text) == plan


def _planted(c) -> None:
    raise InvariantViolation("planted: acknowledged write lost")


def test_a_failure_prints_its_seed_schedule_and_failure_and_replays_from_the_file(
        monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(sim.zab_schedule.SimCluster, "check_final", _planted)
    assert main(["--seed", "4", "--steps", "12"]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("FAILED zab seed=4\n--- schedule ---\n")
    schedule = printed.split("--- schedule ---\n")[1].split("--- failure ---\n")[0]
    assert parse_schedule(schedule) == scenario_from_seed(4, 12, exact=True)
    assert "InvariantViolation: planted: acknowledged write lost" in printed
    path = tmp_path / "schedule.txt"
    path.write_text(schedule)
    assert main(["--schedule", str(path)]) == 1
    assert capsys.readouterr().out == printed, "the replay failed differently"


def test_a_passing_run_prints_one_summary_line(capsys) -> None:
    assert main(["--seed", "2", "--steps", "10"]) == 0
    assert main(["--seed", "2", "--steps", "3", "--ledger"]) == 0
    assert main(["--seed", "2", "--steps", "5", "--mixed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [["ok", "zab", "seed=2"], ["ok", "ledger", "seed=2"],
                                                    ["ok", "mixed", "seed=2"]]


def test_a_broken_schedule_is_a_failure_not_a_crash_of_the_runner() -> None:
    sc = Scenario(seed=1, voters=3, observers=0, crash_keeps_unsynced=True, options=(), steps=(("explode", 1),))
    outcome = run(sc)
    assert not outcome.ok and outcome.failure.startswith("ValueError: unknown step")


def test_a_mixed_failure_prints_a_schedule_that_replays_from_the_file(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(sim.mixed_schedule, "check_mixed", _planted_mixed)
    assert main(["--seed", "9", "--steps", "8", "--mixed"]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("FAILED mixed seed=9\n--- schedule ---\n")
    schedule = printed.split("--- schedule ---\n")[1].split("--- failure ---\n")[0]
    assert parse_schedule(schedule) == plan_from_seed(9, 8)
    path = tmp_path / "schedule.txt"
    path.write_text(schedule)
    assert main(["--schedule", str(path)]) == 1
    assert capsys.readouterr().out == printed, "the replay failed differently"


def _planted_mixed(c, world, lid) -> None:
    raise InvariantViolation(f"planted: ledger {lid} closed at {world.meta.read(lid)[0].last_entry}")
