"""Follower lag in bytes (issue 20): what the leader's status says a follower has not
acknowledged, in txn-log record bytes, next to lag_txns; and that the leader's bookkeeping
for it (zab/core/lag.py) stays within what a follower can still ask about."""

from __future__ import annotations

from sim.cluster import SimCluster
from zab.core.lag import RECORD_FIXED_BYTES, ProposedBytes, record_bytes
from zab.core.leader import LeaderRole
from zab.core.txn import Txn
from zab.storage.record import encode_record, encoded_size

SETTLE_MS = 10_000


def test_record_bytes_are_what_the_txn_log_writes():
    txn = Txn(zxid=0x1_0000_0007, session_id=42, cxid=3, data=b"d" * 123)
    assert record_bytes(len(txn.data)) == len(encode_record(txn)) == encoded_size(123)
    assert RECORD_FIXED_BYTES == encoded_size(0)


def test_running_totals_answer_exactly_inside_the_range_and_a_lower_bound_below_it():
    lag = ProposedBytes(base_zxid=0x1_0000_0009)  # an initial history from epoch 1
    for counter, size in enumerate((10, 20, 30, 40), start=1):
        lag.proposed(0x2_0000_0000 + counter, size)
    sizes = [record_bytes(n) for n in (10, 20, 30, 40)]
    assert lag.lag(0x2_0000_0004) == 0
    assert lag.lag(0x2_0000_0002) == sizes[2] + sizes[3]
    assert lag.lag(0x1_0000_0009) == sum(sizes)  # synced to our initial history, nothing acked since
    assert lag.lag(0x1_0000_0003) == sum(sizes)  # older than where we began: all we know of
    lag.trim(0x2_0000_0002)
    assert len(lag) == 3 and lag.oldest_zxid == 0x2_0000_0002
    assert lag.lag(0x2_0000_0002) == sizes[2] + sizes[3]  # the needed point is still exact
    assert lag.lag(0x2_0000_0001) == sizes[2] + sizes[3]  # below it: the lower bound
    lag.trim(0x2_0000_0001)  # a lower need later (a learner rejoined) cannot bring points back
    assert len(lag) == 3
    lag.trim(0x2_0000_0004)
    assert len(lag) == 1 and lag.lag(0x2_0000_0004) == 0


def follower_lags(c: SimCluster, leader: int) -> dict[int, tuple[int, int]]:
    followers = c.peer(leader).status()["followers"]
    return {int(f): (s["lag_txns"], s["lag_bytes"]) for f, s in followers.items()}


def write(c: SimCluster, node: int, n: int, prefix: str) -> None:
    ops = [c.create(node, f"{prefix}{i}", "v" * 50) for i in range(n)]
    assert c.run_until(lambda: all(o.status == "acked" for o in ops), SETTLE_MS), c.describe_failure()


def test_a_paused_follower_lags_by_the_record_bytes_it_has_not_acked_then_catches_up():
    c = SimCluster(3, seed=61)
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    leader = c.leader()
    slow, other = sorted(set(c.nodes) - {leader})
    write(c, leader, 5, "before")
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    assert follower_lags(c, leader) == {slow: (0, 0), other: (0, 0)}

    c.pause(slow)
    write(c, other, 20, "behind")  # the leader and `other` are the quorum
    acked = c.peer(leader).status()["followers"][str(slow)]["acked_zxid"]
    unacked = c.peer(leader).history.after(acked)
    assert len(unacked) == 20
    assert follower_lags(c, leader)[slow] == (20, sum(len(encode_record(t)) for t in unacked))
    assert follower_lags(c, leader)[other] == (0, 0)

    c.resume(slow)
    assert c.run_until(lambda: follower_lags(c, leader).get(slow) == (0, 0), SETTLE_MS), c.describe_failure()
    # Every voter has acked all of it: the leader keeps just the point they are at.
    assert len(c.peer(leader).role_state.proposed_bytes) == 1
    c.check_final()


def test_the_bookkeeping_never_outgrows_the_history_window_while_a_follower_is_stopped():
    c = SimCluster(3, seed=62, sync_window_txns=16)
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    leader = c.leader()
    slow, other = sorted(set(c.nodes) - {leader})
    c.pause(slow)
    write(c, other, 60, "k")
    role = c.peer(leader).role_state
    assert isinstance(role, LeaderRole)
    history = c.peer(leader).history
    # At most one point per transaction of the window, and the one at its base.
    assert len(role.proposed_bytes) <= len(history) + 1
    lag_txns, lag_bytes = follower_lags(c, leader)[slow]
    assert lag_txns == 60
    # Past the window the byte lag is a lower bound: the bytes of the points still kept.
    assert lag_bytes == sum(record_bytes(len(t.data)) for t in history.after(role.proposed_bytes.oldest_zxid)) > 0
    c.resume(slow)
    assert c.run_until(lambda: c.converged() and follower_lags(c, leader).get(slow) == (0, 0), SETTLE_MS), \
        c.describe_failure()
    c.check_final()
