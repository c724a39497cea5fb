"""AutoRecovery's pure planning (ledger/autorecovery/planning.py): which fragments and entries a lost bookie
held, which bookie replaces it, when the metadata may record the replacement, the task record and
the auditor's grace period."""

from __future__ import annotations

import random

import pytest

from bookie.entry import DigestType
from ledger.metadata import Fragment, LedgerMetadata, LedgerState, decode, encode
from ledger.autorecovery.planning import (FragmentChanged, LossTracker, ReplicationTask, Unrepairable, apply_repair,
                                choose_targets, damaged_fragments, entries_on, ledger_entry_count, ledgers_to_mark,
                                open_tail_damaged, plan_fragment, replica_checks, sources)


def ledger(*fragments: tuple[int, tuple[int, ...]], e: int = 3, qw: int = 2, qa: int = 2,
           last: int | None = None, ledger_id: int = 7) -> LedgerMetadata:
    state = LedgerState.CLOSED if last is not None else LedgerState.OPEN
    return LedgerMetadata(ledger_id, e, qw, qa, tuple(Fragment(f, b) for f, b in fragments), DigestType.CRC32C,
                          b"d" * 32, 0, state=state, last_entry=last, master_key=b"k" * 32)


def test_a_lost_bookie_held_the_entries_whose_write_quorum_includes_it():
    # E=3 Qw=2 on (1, 2, 3): entry i goes to positions i%3, i%3+1: 0->(1,2) 1->(2,3) 2->(3,1) 3->(1,2)...
    m = ledger((0, (1, 2, 3)), last=8)
    assert list(entries_on(m, 0, 1)) == [0, 2, 3, 5, 6, 8]
    assert list(entries_on(m, 0, 2)) == [0, 1, 3, 4, 6, 7]
    assert list(entries_on(m, 0, 4)) == []
    assert sources(m, 2, excluded={1}) == (3,)
    assert sources(m, 1, excluded={1}) == (2, 3)
    assert ledger_entry_count(m, [0], {1}) == 6


def test_only_fragments_with_a_known_end_are_repaired_while_the_ledger_is_open():
    m = ledger((0, (1, 2, 3)), (10, (2, 3, 4)), (20, (1, 3, 4)))
    assert damaged_fragments(m, {1}) == [0]  # fragment 2 is the writer's: left for the grace period
    assert open_tail_damaged(m, {1}) and not open_tail_damaged(m, {2})
    assert list(entries_on(m, 0, 1)) == [0, 2, 3, 5, 6, 8, 9]  # up to the next fragment's first entry - 1
    closed = ledger((0, (1, 2, 3)), (10, (2, 3, 4)), (20, (1, 3, 4)), last=25, e=3)
    assert damaged_fragments(closed, {1}) == [0, 2] and not open_tail_damaged(closed, {1})
    assert max(entries_on(closed, 2, 1)) == 24  # 24 % 3 = 0: positions 0, 1 -> bookies 1, 3


def test_an_empty_closed_ledger_needs_only_the_metadata_change():
    m = ledger((0, (1, 2, 3)), last=-1)
    assert damaged_fragments(m, {2}) == [0] and list(entries_on(m, 0, 2)) == []
    repair = plan_fragment(m, 0, {2}, [1, 3, 4], {2}, random.Random(1))
    assert repair.last_entry == -1 and apply_repair(m, repair).fragments[0].ensemble == (1, 4, 3)


def test_targets_are_writable_outside_the_ensemble_and_never_lost_or_drained():
    rng = random.Random(3)
    for _ in range(50):
        chosen = choose_targets((1, 2, 3), {1, 2}, writable=[1, 2, 3, 4, 5, 6], excluded={1, 2, 6}, rng=rng)
        assert set(chosen) == {1, 2} and set(chosen.values()) == {4, 5}
    assert choose_targets((1, 2, 3), {2}, [3, 4, 5], {2}, rng, prefer=5) == {2: 5}  # this node's bookie first
    assert choose_targets((1, 2, 3), {2}, [3, 4, 5], {2}, rng, prefer=3)[2] in (4, 5)  # unless in the ensemble
    with pytest.raises(Unrepairable, match="not enough bookies"):
        choose_targets((1, 2, 3), {1}, writable=[2, 3], excluded={1}, rng=rng)


def test_the_replacement_is_recorded_only_against_the_fragment_that_was_copied():
    m = ledger((0, (1, 2, 3)), (10, (2, 3, 4)))
    repair = plan_fragment(m, 0, {1}, [2, 3, 4, 5], {1}, random.Random(0), prefer=5)
    assert repair.targets == {1: 5} and repair.last_entry == 9
    assert apply_repair(m, repair).fragments == (Fragment(0, (5, 2, 3)), Fragment(10, (2, 3, 4)))
    # the writer replaced its last fragment meanwhile (another bookie): fragment 0 is unchanged: still fine
    moved = m.with_fragment(15, (2, 3, 5))
    assert apply_repair(moved, repair).fragments[0].ensemble == (5, 2, 3)
    # a writer's ensemble change that replaced fragment 1 at entry 10 keeps fragment 0's end: fine too
    assert apply_repair(m.with_fragment(10, (2, 3, 6)), repair).fragments[1].ensemble == (2, 3, 6)
    # someone else already replaced bookie 1 in fragment 0: copy again from the new metadata
    with pytest.raises(FragmentChanged):
        apply_repair(m.replace_bookie(0, 1, 4), repair)


def test_a_fragment_whose_end_moved_is_copied_again():
    m = ledger((0, (1, 2, 3)), (10, (2, 3, 4)))
    repair = plan_fragment(m, 0, {1}, [4, 5], {1}, random.Random(0))
    # the writer's ensemble change at 10 had not landed: a re-read shows it starting at 12
    later = ledger((0, (1, 2, 3)), (12, (2, 3, 4)))
    with pytest.raises(FragmentChanged, match="ends at 11"):
        apply_repair(later, repair)


def test_replica_checks_cover_every_copy_of_a_closed_ledger():
    m = ledger((0, (1, 2, 3)), (3, (4, 2, 3)), last=4)
    checks = list(replica_checks(m, skip={3}))
    assert checks == [(0, 1), (0, 2), (1, 2), (2, 1), (3, 4), (3, 2), (4, 2)]


def test_the_task_record_round_trips_merges_and_backs_off():
    task = ReplicationTask(7, frozenset({2}), since_ms=1000)
    assert ReplicationTask.from_json(task.to_json()) == task
    grown = task.merged({4}, damaged={1})
    assert grown.lost == {2, 4} and grown.damaged == {1} and grown.covers({2, 4}, {1})
    failed = task.failed("not enough bookies", now_ms=5000, base_ms=500, max_ms=3000)
    assert failed.attempts == 1 and failed.next_attempt_ms == 5500 and not failed.due(5499) and failed.due(5500)
    assert failed.failed("again", 6000, 500, 3000).next_attempt_ms == 7000
    assert ReplicationTask.from_json(failed.to_json()).error == "not enough bookies"
    assert failed.merged({3}).due(0)  # new work is tried at once
    with pytest.raises(ValueError, match="not an under-replication task"):
        ReplicationTask.from_json(b"{}")


def test_a_worker_taking_a_task_forgets_the_lost_bookies_registered_again():
    task = ReplicationTask(7, frozenset({1, 2, 3}), since_ms=1000, damaged=frozenset({4}), attempts=5,
                           error="no readable replica", next_attempt_ms=9000)
    # bookie 1 back (available or read-only), 2 still unregistered, 3 registered read-only to be drained
    back = task.rejudged(registered={1, 3, 4, 5}, draining={3})
    assert back.lost == {2, 3} and back.damaged == {4}
    assert (back.since_ms, back.attempts, back.error, back.next_attempt_ms) == (1000, 5, "no readable replica", 9000)
    assert task.rejudged(registered={4, 5}) is task  # nobody back: the very task (nothing to write)
    # every lost bookie back: no fragment needs repair any more, the task is finished
    m = ledger((0, (1, 2, 3)), (10, (2, 3, 4)), last=15)
    done = task.rejudged(registered={1, 2, 3, 4})
    assert not done.lost and damaged_fragments(m, done.lost) == [] and not open_tail_damaged(m, done.lost)
    # one back, one lost for good: the one back is a source again, only the other is replaced
    rest = ReplicationTask(7, frozenset({1, 2}), 0).rejudged(registered={1, 3, 4, 5})
    assert rest.lost == {2} and sources(m, 0, excluded=rest.lost) == (1,)
    assert plan_fragment(m, 0, rest.lost, [1, 3, 4, 5], rest.lost, random.Random(0)).targets.keys() == {2}


def test_a_bookie_back_within_the_grace_period_is_never_lost():
    t = LossTracker(grace_ms=1000)
    t.observe(known={1, 2, 3}, registered={1, 2, 3}, now_ms=0)
    t.observe({1, 2, 3}, {1, 3}, now_ms=100)  # bookie 2 unregistered
    assert t.lost(1099) == frozenset() and t.next_deadline_ms() == 1100
    t.observe({1, 2, 3}, {1, 2, 3}, now_ms=900)  # back in time
    assert t.lost(5000) == frozenset() and t.next_deadline_ms() is None
    t.observe({1, 2, 3}, {1, 3}, now_ms=6000)
    assert t.lost(6999) == frozenset() and t.lost(7000) == {2}


def test_ledgers_with_a_fragment_on_a_lost_bookie_are_marked():
    a = ledger((0, (1, 2, 3)), ledger_id=1)
    b = ledger((0, (2, 3, 4)), ledger_id=2)
    c = ledger((0, (4, 2, 3)), (5, (1, 2, 3)), ledger_id=3)
    assert ledgers_to_mark([a, b, c], {4}) == {2: {4}, 3: {4}}


def test_metadata_keeps_the_master_key_and_still_reads_metadata_without_it():
    m = ledger((0, (1, 2, 3)))
    assert decode(encode(m)).master_key == b"k" * 32
    old = encode(LedgerMetadata(1, 3, 2, 2, (Fragment(0, (1, 2, 3)),), DigestType.CRC32C, b"d", 0))
    assert b"master_key" not in old and decode(old).master_key is None
