"""A request that fails changes nothing, so the leader answers it without a transaction
(statemachine.Refusal): no zxid, no log record, no quorum round. Its answer must still
come in order: after every transaction the leader prepared before it, on the node the
client is connected to. The simulated cluster checks the second part on every answer
(sim.cluster raises InvariantViolation if a node answers a refusal before delivering
what it was ordered after); these stories make refusals happen where it matters."""

from __future__ import annotations

from sim.cluster import SimCluster
from zab.core import zxid as Z

SETTLE_MS = 10_000


def settled(c: SimCluster) -> SimCluster:
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    return c


def done(c: SimCluster, *ops) -> None:
    assert c.run_until(lambda: all(o.status != "pending" for o in ops), SETTLE_MS), c.describe_failure()


def test_the_loser_of_a_compare_and_set_race_is_refused_after_the_winner_commits():
    c = settled(SimCluster(3, seed=5))
    leader = c.leader()
    f1, f2 = [n for n in c.nodes if n != leader]
    first = c.create(f1, "k", "a")
    done(c, first)
    a, b = c.set_data(f1, "k", "b", version=0), c.set_data(f2, "k", "c", version=0)
    done(c, a, b)
    winner, loser = (a, b) if a.status == "acked" else (b, a)
    assert (winner.status, loser.status) == ("acked", "refused"), c.describe_failure()
    assert loser.error == "BadVersion"
    # Ordered after the winner: its node had delivered the winner when it answered (checked
    # by the simulation), so a read there after the refusal sees the winner's version 1.
    assert loser.result.zxid >= winner.zxid
    assert c.read(loser.node, "k") == (winner.value, 1)
    after = c.set_data(leader, "k", "d", version=1)
    done(c, after)
    assert Z.counter_of(after.zxid) == Z.counter_of(winner.zxid) + 1, "a refusal spent a zxid"
    settled(c).check_final()


def test_a_refusal_on_the_leader_waits_for_the_proposal_before_it():
    c = settled(SimCluster(3, seed=7))
    leader = c.leader()
    create = c.create(leader, "k", "a")
    again = c.create(leader, "k", "b")  # refused against the future state: create is not committed yet
    assert c.run_until(lambda: again.status != "pending", SETTLE_MS), c.describe_failure()
    assert create.status == "acked", "the refusal was answered before the write prepared before it"
    assert again.status == "refused" and again.error == "NodeExists" and again.result.zxid == create.zxid
    settled(c).check_final()


def test_refusals_queued_behind_a_slow_commit_keep_their_order():
    c = settled(SimCluster(3, seed=13))
    leader = c.leader()
    f1 = next(n for n in c.nodes if n != leader)
    ops = [c.create(f1, "k", "v0")]
    ops += [c.create(f1, "k", f"x{i}") for i in range(5)]  # all refused: the create is prepared first
    ops.append(c.set_data(f1, "k", "v1", version=0))
    ops += [c.set_data(f1, "k", f"y{i}", version=0) for i in range(5)]
    done(c, *ops)
    assert [o.status for o in ops] == ["acked"] + ["refused"] * 5 + ["acked"] + ["refused"] * 5, c.describe_failure()
    assert [o.error for o in ops] == [None] + ["NodeExists"] * 5 + [None] + ["BadVersion"] * 5
    assert [o.result.zxid for o in ops[1:6]] == [ops[0].zxid] * 5
    assert [o.result.zxid for o in ops[7:]] == [ops[6].zxid] * 5
    assert Z.counter_of(ops[6].zxid) == Z.counter_of(ops[0].zxid) + 1


def test_a_malformed_request_is_refused_without_a_transaction():
    c = settled(SimCluster(3, seed=17))
    leader = c.leader()
    follower = next(n for n in c.nodes if n != leader)
    before = c.peer(leader).last_zxid
    bad = c.submit(follower, b"not an envelope")
    done(c, bad)
    assert bad.status == "refused" and bad.error == "MarshallingError"
    assert c.peer(leader).last_zxid == before
    good = c.create(follower, "k", "v")
    done(c, good)
    assert good.status == "acked"
