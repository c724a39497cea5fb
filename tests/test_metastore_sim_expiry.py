"""Session expiry on the simulated ensemble (`SimCluster(expire_sessions=True)`, sim/sessions.py):
the leader expires sessions on its own ticks exactly as the daemon does (metastore/core/sessions.py
SessionExpiry, fed as metastore/edge/service.py feeds it), in simulated milliseconds.

A creation or touch counts at the next tick's time, so a session expires at least `timeout` after
it was last heard of, and within two ticks (one of rounding, one to the tick that sees it) after."""

from __future__ import annotations

import pytest

from sim.cluster import SimCluster
from sim.sessions import create_ephemeral_request, create_session_request

TIMEOUT_MS = 2_000
TICK_MS = 50  # SimCluster's default tick_ms
COMMIT_MS = 100  # a closeSession decided is committed and delivered everywhere within this


def session_of(node: int, n: int = 0) -> int:
    return (node << 48) | (0x100 + n)  # not (node << 48) | 1, the session of SimCluster.create's writes


def open_session_with_ephemeral(c: SimCluster, node: int, session_id: int, key: str) -> int:
    """A client connected to `node` opens a session and creates the ephemeral `key`, which every
    node then holds. Returns when `node` delivered the session's creation: through the leader, the
    moment its timeout starts."""
    opened = c.submit(node, create_session_request(TIMEOUT_MS, origin=node, time_ms=c.now), session_id=session_id)
    assert c.run_until(lambda: opened.status == "acked", 1_000), c.describe_failure()
    created_at = c.now
    eph = c.submit(node, create_ephemeral_request(key, origin=node, time_ms=c.now), session_id=session_id, key=key)
    assert c.run_until(lambda: eph.status == "acked" and holders(c, key) == set(c.alive()), 1_000), (
        eph.status, eph.error, c.describe_failure())
    return created_at


def holders(c: SimCluster, key: str, nodes=None) -> set[int]:
    return {i for i in (c.alive() if nodes is None else nodes) if c.read(i, key) is not None}


def run_touching(c: SimCluster, ms: int, touches: dict[int, tuple[int, ...]], every_ms: int = 100) -> None:
    """Run `ms`, each node reporting its clients' sessions every `every_ms` as the service does."""
    end = c.now + ms
    while c.now < end:
        for node, sessions in touches.items():
            c.touch(node, *sessions)
        c.run(min(every_ms, end - c.now))


def started(seed: int) -> tuple[SimCluster, int]:
    c = SimCluster(voters=3, seed=seed, expire_sessions=True)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    return c, c.leader()


@pytest.mark.parametrize("seed", range(4))
def test_an_untouched_session_expires_after_its_timeout_and_not_before_on_every_node(seed):
    c, leader = started(seed)
    sid = session_of(leader)
    created_at = open_session_with_ephemeral(c, leader, sid, "eph")
    assert not c.run_until(lambda: holders(c, "eph") != set(c.alive()), created_at + TIMEOUT_MS - c.now)
    assert c.run_until(lambda: not holders(c, "eph"), 2 * TICK_MS + COMMIT_MS), c.describe_failure()
    [expired] = c.sessions.expirations
    assert expired.node == leader and expired.session_id == sid
    assert TIMEOUT_MS <= expired.at - created_at <= TIMEOUT_MS + 2 * TICK_MS
    assert all(sid not in c.peer(i).sm.tree.sessions() for i in c.alive())


def test_an_untouched_session_is_never_expired_before_its_full_timeout():
    c, leader = started(0)
    created_at = open_session_with_ephemeral(c, leader, session_of(leader), "eph")
    c.run(created_at + TIMEOUT_MS - 1 - c.now)
    assert c.sessions.expirations == []


def test_a_session_touched_through_a_follower_survives_and_an_untouched_one_beside_it_does_not():
    c, leader = started(7)
    follower = next(i for i in c.alive() if i != leader)
    kept, dropped = session_of(follower, 0), session_of(follower, 1)
    open_session_with_ephemeral(c, follower, kept, "kept")
    open_session_with_ephemeral(c, follower, dropped, "dropped")
    run_touching(c, 3 * TIMEOUT_MS, {follower: (kept,)})
    assert holders(c, "kept") == set(c.alive())
    assert holders(c, "dropped") == set()
    assert [(e.node, e.session_id) for e in c.sessions.expirations] == [(leader, dropped)]


def test_a_new_leader_gives_every_session_a_full_timeout_even_one_its_predecessor_nearly_expired():
    c, old = started(3)
    sid = session_of(old)
    created_at = open_session_with_ephemeral(c, old, sid, "eph")
    c.run(created_at + TIMEOUT_MS - 3 * TICK_MS - c.now)  # three ticks from expiry at the old leader
    c.crash(old)
    assert c.run_until(lambda: c.leader() is not None, 5_000), c.describe_failure()
    new, established_at = c.leader(), c.now
    assert c.sessions.expirations == []
    assert not c.run_until(lambda: holders(c, "eph") != set(c.alive()), TIMEOUT_MS - TICK_MS)
    assert c.run_until(lambda: not holders(c, "eph"), 2 * TICK_MS + COMMIT_MS), c.describe_failure()
    [expired] = c.sessions.expirations
    assert expired.node == new and TIMEOUT_MS - TICK_MS <= expired.at - established_at <= TIMEOUT_MS + 2 * TICK_MS
    c.restart(old)
    assert c.run_until(c.converged, 5_000) and holders(c, "eph") == set(), c.describe_failure()


def test_a_leader_that_leads_again_gives_its_sessions_a_full_timeout_not_its_old_deadlines():
    c, old = started(3)
    sid = session_of(old)
    created_at = open_session_with_ephemeral(c, old, sid, "eph")
    c.run(created_at + TIMEOUT_MS * 6 // 10 - c.now)
    c.partition({old}, set(c.alive()) - {old})  # it steps down before the session's deadline there
    assert c.run_until(lambda: c.leader() not in (None, old), 5_000), c.describe_failure()
    between = c.leader()
    c.heal()
    assert c.run_until(c.converged, 5_000), c.describe_failure()
    c.run(created_at + TIMEOUT_MS + TICK_MS - c.now)  # past the deadline `old` had set, before `between`'s
    assert c.sessions.expirations == []
    c.crash(between)  # `old`, as up to date as the third voter and with the higher id, leads again
    assert c.run_until(lambda: c.leader() is not None, 5_000) and c.leader() == old, c.describe_failure()
    assert not c.run_until(lambda: c.sessions.expirations != [], TIMEOUT_MS - TICK_MS), c.describe_failure()
    assert c.run_until(lambda: not holders(c, "eph"), 2 * TICK_MS + COMMIT_MS), c.describe_failure()
    assert [(e.node, e.session_id) for e in c.sessions.expirations] == [(old, sid)]


def test_during_a_partition_only_the_majority_sides_leader_expires_sessions():
    c, old = started(2)
    f1, f2 = (i for i in c.alive() if i != old)
    on_old, on_f1 = session_of(old), session_of(f1)  # each client stays connected to its node
    open_session_with_ephemeral(c, old, on_old, "on_old")
    open_session_with_ephemeral(c, f1, on_f1, "on_f1")
    touches = {old: (on_old,), f1: (on_f1,)}
    run_touching(c, TIMEOUT_MS, touches)
    c.partition({old}, {f1, f2})
    run_touching(c, 3 * TIMEOUT_MS, touches)
    new = c.leader()
    assert new in (f1, f2)
    # The majority's leader no longer hears the touches made on the old leader's side: that session
    # goes there, once, decided by it. The minority commits nothing: both ephemerals stay on it.
    assert [(e.node, e.session_id) for e in c.sessions.expirations] == [(new, on_old)]
    assert (holders(c, "on_old"), holders(c, "on_f1")) == ({old}, {old, f1, f2})
    c.heal()
    run_touching(c, TIMEOUT_MS, touches)
    assert c.run_until(c.converged, 5_000), c.describe_failure()
    assert (holders(c, "on_old"), holders(c, "on_f1")) == (set(), {old, f1, f2})
    c.check_final()


def test_without_expire_sessions_no_session_ever_expires():
    c = SimCluster(voters=3, seed=1)
    assert c.run_until(c.converged, 10_000)
    leader = c.leader()
    open_session_with_ephemeral(c, leader, session_of(leader), "eph")
    c.run(3 * TIMEOUT_MS)
    assert c.sessions is None and holders(c, "eph") == set(c.alive())
