"""Hypothesis over the ledger world: bookie crashes and restarts (with journals, half the time: a
bookie answers after its fsync and a crash loses unsynced records), lost requests and answers (partial
writes: a bookie stored an entry but its ack was lost), lost fences, a writer that crashes or is fenced
while alive, and up to three recoverers that start at different times, some crashing halfway.

After the faults every bookie comes back and the network heals; then the ledger must be CLOSED and
the oracles of sim/ledger_schedule.py's `check` hold (acknowledged entries kept with Qa genuine copies,
recoverers agreeing, no acknowledgement after a failure, readers never past the writer's LAC).
A failing example prints its parameters; the run is deterministic from them. The stories, their
runner and the oracles live in sim/ledger_schedule.py (shared with `python -m sim.explore --ledger`).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.ledger_schedule import FAULT_WINDOW_MS, Story, check, run_story

EXAMPLES = 3000 if os.environ.get("QUIRE_SOAK") else 100


@st.composite
def stories(draw) -> Story:
    e = draw(st.integers(1, 5))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    bookies = draw(st.integers(e, e + 3))
    faults = draw(st.lists(st.tuples(st.integers(0, FAULT_WINDOW_MS), st.sampled_from(["crash", "restart", "lose_fences"]),
                                     st.integers(1, bookies)), max_size=6))
    recoverers = draw(st.lists(st.tuples(st.integers(0, FAULT_WINDOW_MS),
                                         st.one_of(st.none(), st.integers(1, 60))), min_size=1, max_size=3))
    return Story(seed=draw(st.integers(0, 2**32 - 1)), ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                 bookies=bookies, entries=draw(st.integers(1, 40)), loss=draw(st.sampled_from([0.0, 0.02, 0.1])),
                 bookie_faults=tuple(sorted(faults)), writer_crash_ms=draw(st.one_of(st.none(), st.integers(0, 150))),
                 recoverers=tuple(recoverers), journal=draw(st.booleans()))


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(stories())
def test_random_faults_keep_every_acknowledged_entry_and_recoverers_agree(story: Story):
    check(run_story(story))


def test_a_journaled_story_replays_exactly_and_keeps_every_acknowledged_entry():
    """Bookie 2 crashes twice with records in its journal unsynced; the story replays exactly."""
    story = Story(seed=7, ensemble_size=3, write_quorum=3, ack_quorum=2, bookies=4, entries=40, loss=0.02,
                  bookie_faults=((21, "crash", 2), (41, "restart", 2), (61, "crash", 2), (81, "restart", 2)),
                  writer_crash_ms=None, recoverers=((120, None),), journal=True)
    a, b = run_story(story), run_story(story)
    assert a.log == b.log and a.meta.read(1) == b.meta.read(1)
    assert sum(bk.journal.fsyncs for bk in a.bookies.values()) > 0
    check(a)


def test_fixed_seeds_replay_exactly():
    """The same story gives the same trace: a failing seed replays."""
    story = Story(seed=42, ensemble_size=3, write_quorum=2, ack_quorum=2, bookies=5, entries=30, loss=0.1,
                  bookie_faults=((20, "crash", 2), (60, "lose_fences", 3), (90, "restart", 2)),
                  writer_crash_ms=None, recoverers=((50, 10), (70, None), (75, None)))
    a, b = run_story(story), run_story(story)
    assert a.log == b.log and a.clients["w"].acked == b.clients["w"].acked
    assert a.meta.read(1) == b.meta.read(1)
    check(a)
