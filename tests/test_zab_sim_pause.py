"""A paused node in the simulator (SimCluster.pause / resume: a SIGSTOP, not a crash), and issue
19's story on it: a leader paused past its replacement and resumed must not answer a sync from its
stale state (zab/core/read_index.py), over seeds, pause lengths and the moment of the sync."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from sim.cluster import SimCluster
from zab.core.actions import ClientSync, Synced

SYNC_LIMIT_MS = 10 * 50  # ZabConfig.sync_limit_ticks * the simulator's tick_ms


def test_a_paused_follower_steps_nothing_loses_nothing_and_does_not_replay_its_ticks():
    c = SimCluster(voters=3, seed=5)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    leader = c.leader()
    follower = next(i for i in c.alive() if i != leader)
    ticks, delivered = c.peer(follower).now, c.peer(follower).last_committed
    c.pause(follower)
    ops = [c.create(leader, f"k{n}", "v") for n in range(5)]
    assert c.run_until(lambda: all(op.status == "acked" for op in ops), 2_000), c.describe_failure()
    c.run(SYNC_LIMIT_MS // 2 - c.tick_ms)  # shorter than the leader's patience: the links stay up
    # Frozen: not one tick, message or disk completion stepped; the leader's frames wait for it.
    assert (c.peer(follower).now, c.peer(follower).last_committed) == (ticks, delivered)
    assert c.nodes[follower].held
    c.resume(follower)
    assert c.peer(follower).now == ticks  # the timer fires once, after what was held ...
    c.run(0)
    assert c.peer(follower).now == ticks + 1  # ... and the missed ticks are not replayed
    assert c.run_until(c.converged, 1_000), c.describe_failure()
    assert all(c.read(follower, f"k{n}") == ("v", 0) for n in range(5))
    assert not any(f"disconnects {follower}" in line for line in c.trace)  # nobody dropped it
    c.check_final()


def test_a_follower_paused_for_seconds_of_writes_catches_up_at_resume():
    c = SimCluster(voters=3, seed=8)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    leader = c.leader()
    follower = next(i for i in c.alive() if i != leader)
    c.pause(follower)
    ops = []
    for n in range(30):
        ops.append(c.create(leader, f"k{n}", "v"))
        c.run(100)
    assert all(op.status == "acked" for op in ops)  # the other two are a quorum
    c.resume(follower)
    assert c.run_until(c.converged, 2_000), c.describe_failure()
    assert all(c.read(follower, f"k{n}") == ("v", 0) for n in range(30))
    c.check_final()


def test_a_leader_paused_past_its_replacement_answers_no_sync_the_new_leader_overtook():
    c = SimCluster(voters=3, seed=1)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    old = c.leader()
    v1 = c.create(old, "k", "v1")
    assert c.run_until(lambda: v1.status == "acked", 2_000)
    c.pause(old)
    assert c.run_until(lambda: c.leader() not in (None, old), 5_000), c.describe_failure()
    v2 = c.set_data(c.leader(), "k", "v2")
    assert c.run_until(lambda: v2.status == "acked", 2_000)
    c.inject(old, ClientSync(99, 1))  # held: the old leader reads it at resume, still leading
    c.resume(old)
    c.run(3 * SYNC_LIMIT_MS)
    assert [s for i, s in c.synced if i == old] == []  # its old followers no longer answer its round
    assert c.run_until(c.converged, 5_000) and c.read(old, "k") == ("v2", 1)


def paused_leader_sync(seed: int, pause_ms: int, sync_at_resume: bool, held_ms: int) -> str:
    """Write v1, pause the leader for `pause_ms`, write v2 through a new leader if one is
    elected meanwhile, then hand the old leader a sync `held_ms` before it resumes (held while it
    is paused) or right at resume. If it answers, a read on it right then must not be older than
    every write acknowledged before the sync began. Returns what happened, for the statistics."""
    c = SimCluster(voters=3, seed=seed)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    old = c.leader()
    writes = [c.create(old, "k", "v1")]
    assert c.run_until(lambda: writes[0].status == "acked", 2_000), c.describe_failure()
    resume_at = c.now + pause_ms
    c.pause(old)
    if c.run_until(lambda: c.leader() not in (None, old), resume_at - c.now):
        writes.append(c.set_data(c.leader(), "k", "v2"))
        c.run_until(lambda: writes[-1].status != "pending", resume_at - c.now)
    if not sync_at_resume:
        c.run(max(0, resume_at - held_ms - c.now))
    floor = max(op.version for op in writes if op.status == "acked")  # acknowledged before the sync
    story = f"v{floor + 1} acknowledged before the sync"
    c.inject(old, ClientSync(99, 1))
    c.run(max(0, resume_at - c.now))
    c.resume(old)
    if not c.run_until(lambda: any(i == old and (s.session_id, s.cxid) == (99, 1) for i, s in c.synced),
                       4 * SYNC_LIMIT_MS):
        return f"{story}, sync not answered"
    value = c.read(old, "k")
    assert value is not None and value[1] >= floor, (
        f"a sync answered by node {old} after a {pause_ms} ms pause read {value}, older than version "
        f"{floor} acknowledged before the sync\n{c.describe_failure()}")
    return f"{story}, sync answered"


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**16),
       # from shorter than the followers' patience (no new leader) to several election timeouts; drawn
       # from a list, as integers() would draw mostly the short ones
       pause_ms=st.sampled_from(range(SYNC_LIMIT_MS // 5, 8 * SYNC_LIMIT_MS + 1, 20)),
       sync_at_resume=st.booleans(), held_ms=st.integers(0, 400))
def test_a_sync_through_a_resumed_leader_never_reads_a_value_overwritten_before_it(seed, pause_ms, sync_at_resume,
                                                                                   held_ms):
    event(paused_leader_sync(seed, pause_ms, sync_at_resume, held_ms))  # --hypothesis-show-statistics
