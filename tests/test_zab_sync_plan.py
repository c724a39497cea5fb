"""How the leader synchronizes a learner, from the zxid the learner reports."""

from __future__ import annotations

from zab.core import zxid as Z
from zab.core.history import History
from zab.core.messages import SyncMode
from zab.core.sync_plan import SyncPlan, plan_sync
from zab.core.txn import Txn


def history(*zxids: tuple[int, int], base: int = 0) -> History:
    return History(base, [Txn(Z.make(e, c), 0, 0, b"") for e, c in zxids])


LEADER = history((1, 1), (1, 2), (1, 3), (3, 1), (3, 2))


def test_same_history_gets_an_empty_diff():
    assert plan_sync(LEADER, Z.make(3, 2), Z.make(3, 2)) == SyncPlan(SyncMode.DIFF, Z.make(3, 2))


def test_a_prefix_gets_a_diff_from_its_last_zxid():
    assert plan_sync(LEADER, Z.make(3, 2), Z.make(1, 2)) == SyncPlan(SyncMode.DIFF, Z.make(1, 2))
    assert plan_sync(LEADER, Z.make(3, 2), 0) == SyncPlan(SyncMode.DIFF, 0)


def test_skipped_proposals_are_truncated_to_the_last_common_point():
    # The learner has (1, 4), (1, 5): proposed in epoch 1, never committed (paper figure 3).
    assert plan_sync(LEADER, Z.make(3, 2), Z.make(1, 5)) == SyncPlan(SyncMode.TRUNC, Z.make(1, 3))
    # A learner of a failed epoch 2 leader is cut back to the end of epoch 1 (figure 4).
    assert plan_sync(LEADER, Z.make(3, 2), Z.make(2, 7)) == SyncPlan(SyncMode.TRUNC, Z.make(1, 3))


def test_a_learner_ahead_of_the_leader_is_truncated_to_the_leader_last_zxid():
    assert plan_sync(LEADER, Z.make(3, 2), Z.make(3, 9)) == SyncPlan(SyncMode.TRUNC, Z.make(3, 2))


def test_a_learner_behind_the_in_memory_window_gets_a_snapshot():
    trimmed = history((3, 1), (3, 2), base=Z.make(1, 3))
    assert plan_sync(trimmed, Z.make(3, 2), Z.make(1, 1)) == SyncPlan(SyncMode.SNAP, Z.make(3, 2))
    # At the base exactly it still gets a DIFF.
    assert plan_sync(trimmed, Z.make(3, 2), Z.make(1, 3)) == SyncPlan(SyncMode.DIFF, Z.make(1, 3))


def test_truncation_point_below_the_window_means_a_snapshot():
    # (1, 4) is not in memory; the floor would be the base, which proves nothing.
    trimmed = history((3, 1), base=Z.make(1, 3))
    assert plan_sync(trimmed, Z.make(3, 1), Z.make(1, 4)).mode is SyncMode.SNAP
