"""Write quorums, ack quorums and coverage (ledger/quorum.py), against seed 001's numbers."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from ledger.quorum import Coverage, ack_quorum_met, write_quorum, write_set

B1, B2, B3, B4 = "B1", "B2", "B3", "B4"


def test_seed_001_write_quorum_table():
    """Seed 001, "Write Quorums": E = 4, Qw = 3, Qa = 2, ensemble B1 B2 B3 B4, entries 0..5."""
    ensemble = (B1, B2, B3, B4)
    table = {
        0: (B1, B2, B3),
        1: (B2, B3, B4),
        2: (B3, B4, B1),
        3: (B4, B1, B2),
        4: (B1, B2, B3),
        5: (B2, B3, B4),
    }
    assert {e: write_quorum(ensemble, e, 3) for e in range(6)} == table


def test_only_e_distinct_write_quorums_and_one_without_striping():
    assert len({frozenset(write_set(e, 4, 3)) for e in range(100)}) == 4
    assert len({frozenset(write_set(e, 3, 3)) for e in range(100)}) == 1  # Qw = E: no striping


def test_ack_quorum_counts_only_bookies_of_the_write_quorum():
    quorum = write_quorum((1, 2, 3, 4), 0, 3)  # 1 2 3
    assert ack_quorum_met({1, 2}, quorum, 2)
    assert not ack_quorum_met({1, 4}, quorum, 2)  # bookie 4 is not in entry 0's write quorum
    assert not ack_quorum_met({1}, quorum, 2)


def test_fencing_coverage_needs_qw_minus_qa_plus_one_of_every_write_quorum():
    # E = Qw = 3, Qa = 2: any 2 of the 3 bookies.
    c = Coverage.ensemble(3, 3, 2)
    assert not c.add(0)
    assert c.add(2)
    # E = 4, Qw = 3, Qa = 2: 2 of each of {0,1,2} {1,2,3} {2,3,0} {3,0,1}.
    c = Coverage.ensemble(4, 3, 2)
    assert not c.add(0) and not c.add(2)  # {1,2,3} has only index 2, {3,0,1} only index 0
    assert c.add(3)                       # now every write quorum has two responders
    c = Coverage.ensemble(4, 3, 2)
    for i in (0, 1):
        c.add(i)
    assert not c.covered()  # {2,3,0} has one responder
    c.add(2)
    assert c.covered()


def test_coverage_with_qa_equal_qw_needs_one_per_write_quorum():
    c = Coverage.ensemble(3, 3, 3)
    assert c.add(1)


def test_entry_coverage_watches_one_write_quorum():
    # E = 4, Qw = 3, Qa = 2, entry 1 lives on indexes 1 2 3: answers from index 0 never count.
    c = Coverage.entry(4, 3, 2, 1)
    assert not c.add(0)
    assert not c.add(1)
    assert c.add(3)


@given(st.integers(1, 6).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e)))
       .flatmap(lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(1, t[1]))))
def test_coverage_means_no_write_quorum_keeps_qa_silent_bookies(params):
    """The definition's point: covered <=> every write quorum has fewer than Qa non-responders."""
    e, qw, qa = params
    for k in range(e + 1):
        for responded in combinations(range(e), k):
            c = Coverage.ensemble(e, qw, qa)
            for i in responded:
                c.add(i)
            silent_ok = all(len(set(write_set(x, e, qw)) - set(responded)) < qa for x in range(e))
            assert c.covered() == silent_ok, (e, qw, qa, responded)
