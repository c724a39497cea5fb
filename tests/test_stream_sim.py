"""The ownership, recovery and rolling protocol of named logs (stream/ownership.py) in the
simulator (sim/stream_world.py): competing owners, owner crashes and pauses, bookie crashes and
lost messages, with the oracles checked after every simulated millisecond. Broken takeovers
("mutants") show that the oracles catch what the fence and the CAS prevent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.ledger_world import InvariantViolation
from sim.stream_world import FAULT_WINDOW_MS, StreamStory, StreamWorld, story_from_seed
from stream import ownership as O
from stream.errors import LogFenced, StreamError
from stream.segment_list import SegmentList


@st.composite
def stories(draw) -> StreamStory:
    e = draw(st.integers(1, 3))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    bookies = e + draw(st.integers(0, 2))
    window = st.integers(0, FAULT_WINDOW_MS)
    owners = ((0, draw(st.integers(1, 60))),) + tuple(draw(st.lists(
        st.tuples(st.integers(1, FAULT_WINDOW_MS), st.integers(0, 60)), max_size=3)))
    owner_faults = draw(st.lists(st.tuples(window, st.sampled_from(("crash", "pause")),
                                           st.integers(0, len(owners) - 1), st.integers(5, 150)), max_size=3))
    bookie_faults = draw(st.lists(st.tuples(window, st.sampled_from(("crash", "restart")),
                                            st.integers(1, bookies)), max_size=3))
    return StreamStory(draw(st.integers(0, 2**32)), bookies, e, qw, qa, draw(st.integers(1, 6)), owners,
                       tuple(sorted(owner_faults)), tuple(sorted(bookie_faults)),
                       draw(st.sampled_from((0.0, 0.05))))


@settings(max_examples=60, deadline=None)
@given(stories())
def test_drawn_schedules_keep_every_acknowledged_record_once_in_order(story):
    StreamWorld(story).run()


@pytest.mark.parametrize("seed", range(40))
def test_seeded_schedules(seed):
    StreamWorld(story_from_seed(seed)).run()


def test_a_contender_takes_over_a_live_writer_mid_stream():
    """Owner 0 writes 60 records; owner 1 takes over at 40 ms while 0 is still writing: 0 is fenced at
    an append or at its roll, 1 writes after 0's recovered records, and nothing is lost."""
    story = StreamStory(seed=7, bookies=4, ensemble=3, write_quorum=3, ack_quorum=2, roll_entries=4,
                        owners=((0, 60), (40, 20)), owner_faults=(), bookie_faults=())
    world = StreamWorld(story)
    world.run()
    first, second = world.owners[0], world.owners[1]
    assert first.state == "fenced" and first.acked and second.state == "done" and len(second.acked) == 20
    records = [payload for _, _, payload in world.visible]
    assert records[-20:] == [p for _, _, p in second.acked]  # the successor's records come after all of 0's
    assert all(p.startswith(b"o0:") for p in records[:-20])


def test_a_paused_owner_resumes_fenced_and_adds_nothing():
    story = StreamStory(seed=3, bookies=3, ensemble=3, write_quorum=3, ack_quorum=2, roll_entries=100,
                        owners=((0, 60), (60, 10)), owner_faults=((30, "pause", 0, 200),), bookie_faults=())
    world = StreamWorld(story)
    world.run()
    paused = world.owners[0]
    assert paused.state == "fenced" and paused.acked
    assert all(p.startswith(b"o1:") for _, _, p in world.visible[-10:])


def _unfenced_take_over(log_name: str) -> O.Protocol:
    """Mutant: completes the last owner's segment at what the list says (nothing) instead of recovering it."""
    listing: SegmentList = yield O.ReadList()
    after = listing.take_over()
    current = listing.in_progress
    if current is not None:
        after = after.completed(current.seq, **O.SegmentTally().totals(-1), now_ms=(yield O.Now()))
    ledger_id = yield O.CreateLedger(after.log.next_segment)
    after, segment = after.started(ledger_id, (yield O.Now()))
    applied = yield O.ApplyChange(listing, after)
    if applied is None:
        raise StreamError("lost the race")
    return O.Owned(applied, segment)


def _first_failure(take_over, seeds) -> InvariantViolation | None:
    for seed in seeds:
        try:
            StreamWorld(story_from_seed(seed), take_over=take_over).run()
        except InvariantViolation as e:
            return e
    return None


def test_mutant_takeover_without_recovery_is_caught():
    error = _first_failure(_unfenced_take_over, range(40))
    assert error is not None, "a takeover that does not recover the last segment went unnoticed"


def _drive(protocol, answers):
    """Run a protocol step by hand: `answers(action)` gives each action's result."""
    result = None
    while True:
        try:
            action = protocol.send(result)
        except StopIteration as done:
            return done.value
        result = answers(action)


def _owned_list():
    from stream.log_metadata import LogMetadata, LogSettings
    listing = SegmentList(LogMetadata(0, LogSettings()), 0)
    return _drive(O.take_over("log"), lambda a: {O.ReadList: listing, O.Now: 5, O.CreateLedger: 11}[type(a)]
                  if not isinstance(a, O.ApplyChange) else a.before.applied(a.before.change_to(a.after)))


@pytest.mark.parametrize("epoch_moved", [False, True])
def test_a_roll_that_loses_its_cas_to_a_truncation_redoes_it_and_to_a_takeover_is_fenced(epoch_moved):
    owned = _owned_list()
    tally = O.SegmentTally()
    tally.sealed(0, 2, 3, 30)
    # Someone else changed the list meanwhile: a truncation keeps the epoch, a takeover moves it.
    other = owned.listing.applied(owned.listing.change_to(owned.listing))
    if epoch_moved:
        other = other.applied(other.change_to(other.take_over()))
    lost, register = [], [other]  # the list as the metastore holds it

    def answers(action):
        if isinstance(action, O.ApplyChange):
            if action.before.log_version != register[0].log_version:
                lost.append(action)
                return None
            register[0] = action.before.applied(action.before.change_to(action.after))
            return register[0]
        if isinstance(action, O.ReadList):
            return register[0]
        return {O.CloseLedger: 0, O.Now: 9, O.CreateLedger: 12, O.DeleteLedger: None}[type(action)]

    if epoch_moved:
        with pytest.raises(LogFenced):
            _drive(O.roll("log", owned, tally), answers)
        return
    rolled = _drive(O.roll("log", owned, tally), answers)
    assert len(lost) == 1 and rolled.segment.ledger_id == 12 and rolled.segment.seq == 2
    assert rolled.listing.segments[0].completed and rolled.listing.segments[0].records == 3
