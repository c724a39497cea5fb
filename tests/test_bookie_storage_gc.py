"""The GC policy (bookie/gc.py), purely: absence from one metadata scan is never enough to
destroy bytes (FAULTS.md: YahooArchive/bookkeeper #15/#17, #870, #4607)."""

from __future__ import annotations

import pytest

from bookie.gc import ExistsCheck, GcPolicy, MetadataScan

LOCAL = {1, 2, 3}


def policy_after(*scans: MetadataScan, interval_ms: int = 1000) -> GcPolicy:
    policy = GcPolicy(interval_ms)
    for scan in scans:
        policy.observe_scan(scan)
    return policy


def gone(ledger_id: int, zxid: int) -> ExistsCheck:
    return ExistsCheck(ledger_id, exists=False, zxid=zxid)


def test_one_scan_without_the_ledger_is_never_enough():
    policy = policy_after(MetadataScan(10, 0, frozenset({1, 2})))
    assert policy.candidates(LOCAL) == set()
    assert policy.eligible(LOCAL, {3: gone(3, 11)}) == set()


def test_two_scans_too_close_together_are_not_enough():
    policy = policy_after(MetadataScan(10, 0, frozenset({1, 2})), MetadataScan(11, 999, frozenset({1, 2})))
    assert policy.candidates(LOCAL) == set()


def test_two_scans_an_interval_apart_and_a_confirmed_absence_make_a_ledger_eligible():
    policy = policy_after(MetadataScan(10, 0, frozenset({1, 2})), MetadataScan(12, 1000, frozenset({1, 2})))
    assert policy.candidates(LOCAL) == {3}
    assert policy.eligible(LOCAL, {3: gone(3, 12)}) == {3}


def test_without_an_exists_check_or_when_it_finds_the_ledger_nothing_is_deleted():
    policy = policy_after(MetadataScan(10, 0, frozenset()), MetadataScan(12, 5000, frozenset()))
    assert policy.candidates(LOCAL) == LOCAL
    assert policy.eligible(LOCAL, {}) == set()
    assert policy.eligible(LOCAL, {1: ExistsCheck(1, exists=True, zxid=13)}) == set()


def test_an_exists_check_older_than_the_latest_scan_does_not_count():
    policy = policy_after(MetadataScan(10, 0, frozenset()), MetadataScan(12, 5000, frozenset()))
    assert policy.eligible(LOCAL, {2: gone(2, 11), 3: gone(3, 12)}) == {3}


def test_a_ledger_listed_again_in_between_restarts_the_count():
    # A partial listing (the metastore view was wrong once) must not start a deletion that a
    # later complete listing contradicts.
    policy = policy_after(MetadataScan(10, 0, frozenset()), MetadataScan(11, 2000, frozenset({3})),
                          MetadataScan(12, 4000, frozenset()), interval_ms=1500)
    assert 3 not in policy.candidates(LOCAL)
    policy.observe_scan(MetadataScan(13, 5000, frozenset()))
    assert 3 not in policy.candidates(LOCAL), "absent only 1000 ms apart since it was last listed"
    policy.observe_scan(MetadataScan(14, 6000, frozenset()))
    assert 3 in policy.candidates(LOCAL)


def test_scans_out_of_zxid_order_are_ignored():
    policy = policy_after(MetadataScan(20, 0, frozenset()), MetadataScan(5, 5000, frozenset()))
    assert policy.candidates(LOCAL) == set()


def test_only_local_ledgers_are_considered_and_bad_config_is_refused():
    policy = policy_after(MetadataScan(10, 0, frozenset()), MetadataScan(12, 5000, frozenset()))
    assert policy.candidates({7}) == {7}
    assert policy.candidates(set()) == set()
    with pytest.raises(ValueError):
        GcPolicy(-1)
