"""A leader's own ACK of a proposal of an earlier leadership: its log writer's fsync can finish
after the node stepped down, was truncated as a follower and came to lead again with a shorter
history (bench/large_tree.py found it: the leader ended with "refused its own message"). It is
dropped; an ACK of our own epoch beyond what we proposed is still our bug and ends the node."""

from __future__ import annotations

import pytest

from sim.cluster import SimCluster
from zab.core import zxid as Z
from zab.core.messages import Ack


def test_a_stale_ack_from_the_leaders_own_earlier_leadership_is_dropped():
    c = SimCluster(voters=3, seed=3)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    leader = c.leader()
    epoch = c.peer(leader).role_state.epoch
    assert c.peer(leader).last_zxid < Z.make(epoch - 1, 1 << 20)  # nothing proposed yet in this epoch
    c.forge(leader, leader, Ack(Z.make(epoch - 1, 1 << 20)))  # beyond our history, of an older epoch
    c.run(100)
    assert c.leader() == leader and c.peer(leader).role_state.epoch == epoch
    more = [c.create(leader, f"m{n}", "v") for n in range(3)]
    assert c.run_until(lambda: all(op.status == "acked" for op in more), 2_000), c.describe_failure()
    assert c.run_until(c.converged, 2_000), c.describe_failure()
    c.check_final()


def test_an_ack_of_our_own_epoch_we_never_proposed_is_still_our_bug():
    c = SimCluster(voters=3, seed=4)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    leader = c.leader()
    epoch = c.peer(leader).role_state.epoch
    c.forge(leader, leader, Ack(Z.make(epoch, 1 << 20)))
    with pytest.raises(AssertionError, match="refused its own message"):
        c.run(100)
