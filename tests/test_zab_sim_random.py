"""Random fault schedules over the whole simulated ensemble (sim.cluster.SimCluster).

A scenario is one seed, an ensemble shape, a few configuration knobs and a
list of steps: client writes (creates and compare-and-set setDatas of five
znodes) through any node, crashes (never more than a minority of voters down
at once, except "crash_all" which takes every node down and restarts every
node at once), restarts, partitions (random halves or one node isolated),
heals and runs of simulated time. The invariant oracles of replay.invariants
watch the whole run. Afterwards the network heals, every node
restarts, and the ensemble must converge (liveness), answer every request,
keep taking writes, and pass check_final() plus the history oracles of
sim/zab_schedule.py. A scenario may also let crashes tear or garble the log
append in flight (`tail_faults`, sim/disk.py).

The schedules, their runner and the oracles live in sim/zab_schedule.py (shared
with `python -m sim.explore`); this file draws them with hypothesis and from seeds.
A failing scenario prints itself as a Python literal: paste it into
`run_scenario(...)` (or into REGRESSIONS) and it replays exactly. Scenarios
drawn from a plain seed (`scenario_from_seed`) replay with
`QUIRE_SIM_SEED=<seed> pytest tests/test_zab_sim_random.py -k replay`.
See docs/testing.md.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from metastore.core.state_machine import MetastoreStateMachine
from sim.cluster import ANY_VERSION, SimCluster, create_request
from sim.zab_schedule import Chooser, Scenario, build_scenario, run_scenario, scenario_from_seed

__all__ = ["Scenario", "run_scenario", "scenario_from_seed"]  # the replay recipe in docs/testing.md imports them here

SOAK = os.environ.get("QUIRE_SOAK") == "1"


@st.composite
def scenarios(draw, max_steps: int = 30) -> Scenario:
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    chooser = Chooser(lambda lo, hi: draw(st.integers(min_value=lo, max_value=hi)))
    return build_scenario(seed, chooser, max_steps)


# -- tests ----------------------------------------------------------------------------------
@settings(max_examples=1000 if SOAK else 500, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_random_schedules_keep_every_invariant(sc: Scenario) -> None:
    note(f"replay: run_scenario({sc!r})")
    run_scenario(sc)


@pytest.mark.soak
@settings(max_examples=int(os.environ.get("QUIRE_SOAK_EXAMPLES", "5000")), derandomize=False, deadline=None,
          database=None, suppress_health_check=list(HealthCheck))
@given(scenarios(max_steps=80))
def test_soak_random_schedules(sc: Scenario) -> None:
    """Not derandomized: every soak run explores new schedules."""
    note(f"replay: run_scenario({sc!r})")
    run_scenario(sc)


@pytest.mark.soak
def test_soak_seeds() -> None:
    """Plain seeds, fast to replay: QUIRE_SIM_SEED=<seed> pytest tests/test_zab_sim_random.py -k replay."""
    first = int(os.environ.get("QUIRE_SOAK_SEED", str(time.time_ns() % 2**32)))
    count = int(os.environ.get("QUIRE_SOAK_SEEDS", "3000"))
    print(f"soak: seeds {first}..{first + count - 1}")
    for seed in range(first, first + count):
        try:
            run_scenario(scenario_from_seed(seed, max_steps=80))
        except BaseException as e:
            e.add_note(f"soak seed {seed}: QUIRE_SIM_SEED={seed} QUIRE_SIM_MAX_STEPS=80 "
                       "pytest tests/test_zab_sim_random.py -k replay")
            raise


REPLAY_SEEDS = [int(s) for s in os.environ["QUIRE_SIM_SEED"].split(",")] if "QUIRE_SIM_SEED" in os.environ else [
    0, 1, 2, 3, 7, 42, 1154, 1732, 2355, 2845, 3911, 4643]


@pytest.mark.parametrize("seed", REPLAY_SEEDS)
def test_replay_seed(seed: int) -> None:
    run_scenario(scenario_from_seed(seed, max_steps=int(os.environ.get("QUIRE_SIM_MAX_STEPS", "40"))))


# Scenarios that once failed, kept as exact literals.
REGRESSIONS: list[Scenario] = []


@pytest.mark.parametrize("sc", REGRESSIONS, ids=lambda sc: f"seed{sc.seed}")
def test_regression(sc: Scenario) -> None:
    run_scenario(sc)


# -- the simulator itself -------------------------------------------------------------------
def test_sim_tracks_delivered_prefix_across_snap_sync() -> None:
    # Regression: SimCluster once kept SimNode.prev_delivered across a SNAP install, and the
    # DeliveryOracle then reported a false TotalOrder/PrefixConsistency violation.
    """Story: 3 voters with a 2-transaction sync window. Node 3 is down while 10 writes
    commit, so when it returns the leader has trimmed the history it would need for a
    DIFF and sends a SNAP. Node 3's next delivery follows the snapshot's zxid, not the
    zxid it had delivered before; the oracle must see it that way."""
    c = SimCluster(3, seed=5, sync_window_txns=2, snapshot_every_txns=1_000)
    assert c.run_until(c.converged, 10_000)
    c.create(1, "a", "1")
    assert c.run_until(lambda: c.peer(3).last_committed > 0, 5_000)
    victim = 3 if c.leader() != 3 else 2
    c.crash(victim)
    ops = [c.create(c.leader(), f"k{i}", "v") for i in range(10)]
    assert c.run_until(lambda: all(op.status == "acked" for op in ops), 10_000)
    c.restart(victim)
    assert c.run_until(c.converged, 10_000)
    c.create(c.leader(), "after", "snap")  # the first delivery after the SNAP trips the oracle
    assert c.run_until(lambda: c.read(victim, "after") is not None, 10_000)
    assert c.run_until(c.converged, 10_000)
    c.check_final()


# -- bugs found by the random schedules (fixed in 890a86d; kept as regressions) --------------
# Found by scenario_from_seed(200819, max_steps=60); shrunk by
# deleting steps while the failure persisted (the crash_all/restart_all pairs only steer the RNG).
STALLED_PROPOSALS = Scenario(
    seed=200819, voters=3, observers=0, crash_keeps_unsynced=True, options=(),
    steps=(("crash_all",), ("restart_all",), ("crash_all",), ("restart_all",), ("crash_all",), ("restart_all",),
           ("run", 700), ("run", 300), ("burst", 2, 11), ("crash", 1), ("create", 3, "k3", "v47"),
           ("set", 2, "k1", "v49", ANY_VERSION), ("restart", 1), ("run", 5), ("isolate", 2)))

def test_regression_stalled_proposals_after_resync() -> None:
    """Story (seed 200819): node 3 leads, node 2 follows, node 1 is down. Node 3 proposes
    writes (its own v47 among them); node 2 is cut off before its ACKs arrive. Node 1
    restarts and syncs with the still-established leader 3, receiving the proposals in
    SYNCTXNS: they are now logged on a quorum {1, 3}. Node 2 rejoins the same way. The
    ensemble is 'converged' (equal last zxid and last committed everywhere), yet the
    writes are never committed and v47's client is never answered."""
    run_scenario(STALLED_PROPOSALS)


def test_leader_commits_outstanding_proposals_acked_through_newleader() -> None:
    """The same bug, step by step on one leader Peer (no simulator, no randomness): a
    learner's NEWLEADER ack counts for the proposals it received in the sync."""
    from zab.core.actions import ClientRequest, Delivered, LogSync, PeerDisconnected, Received, Role, Send, Tick
    from zab.core.config import ZabConfig
    from zab.core.messages import (AckEpoch, AckNewLeader, FollowerInfo, NewLeader, Notification, Ping,
                              ServerState, SyncTxns, UpToDate)
    from zab.core.peer import Peer

    leader = Peer(ZabConfig(my_id=1, voters=frozenset({1, 2, 3})), MetastoreStateMachine())
    leader.start()
    clock = leader.election.logical_clock
    for frm in (2, 3):  # both vote for node 1
        leader.step(Received(frm, Notification(1, 0, 0, clock, ServerState.LOOKING)))
    for _ in range(leader.cfg.election_finalize_ticks + 1):
        leader.step(Tick())
    assert leader.role is Role.LEADING

    def run_then(actions):  # the log writer's part: after the fsync, run what the LogSync carries
        for a in actions:
            if isinstance(a, LogSync):
                for t in a.then:
                    if isinstance(t, Send) and t.to == 1:
                        run_then(leader.step(Received(1, t.msg)))
        return actions

    # Discovery and synchronization with node 2: the leader is established with {1, 2}.
    run_then(leader.step(Received(2, FollowerInfo(0, 0, False, 1))))
    run_then(leader.step(Received(2, AckEpoch(0, 0))))
    out = run_then(leader.step(Received(2, AckNewLeader(1))))
    assert any(isinstance(a, Send) and isinstance(a.msg, UpToDate) for a in out)

    # A write is proposed and logged by the leader; node 2's link breaks before its ACK.
    run_then(leader.step(ClientRequest(7, 1, create_request("k", "v", origin=1))))
    z = leader.last_zxid
    leader.step(PeerDisconnected(2))

    # Node 3 joins the established leader: the proposal reaches it inside the sync.
    run_then(leader.step(Received(3, FollowerInfo(0, 0, False, 1))))
    out = run_then(leader.step(Received(3, AckEpoch(0, 0))))
    assert [t.zxid for a in out if isinstance(a, Send) and isinstance(a.msg, SyncTxns) for t in a.msg.txns] == [z]
    assert [a.msg for a in out if isinstance(a, Send) and isinstance(a.msg, NewLeader)] == [NewLeader(1, z)]
    # Node 3 made it durable before acking NEWLEADER: {1, 3} is a quorum that logged z.
    delivered = [a for a in run_then(leader.step(Received(3, AckNewLeader(1)))) if isinstance(a, Delivered)]
    for _ in range(20):  # time passes; node 3 answers pings
        delivered += [a for a in run_then(leader.step(Tick())) if isinstance(a, Delivered)]
        leader.step(Received(3, Ping()))
    assert leader.role is Role.LEADING
    assert [d.txn.zxid for d in delivered] == [z], f"{z:#x} logged on a quorum but never committed"
