"""One simulator: a ledger whose metadata lives in the simulated metastore, so that one seed
mixes Zab leader changes with ledger recoveries (sim/ledger_meta.py, sim/mixed_schedule.py)."""

from __future__ import annotations

import pytest

import ledger.driver
import ledger.manager
import sim.ledger_meta
from ledger import actions as A
from ledger.metadata import LedgerState, encode, ledger_path
from sim.cluster import SimCluster
from sim.explore import explore, parse_schedule, run
from sim.ledger_meta import LEDGER_ACL, LEDGER_ROOT, METADATA_RETRY_MS
from sim.ledger_world import LedgerWorld
from sim.mixed_schedule import plan_from_seed, run_mixed


def _world(seed: int = 1, voters: int = 3) -> tuple[SimCluster, LedgerWorld]:
    c = SimCluster(voters, seed=seed, tick_ms=10)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    return c, LedgerWorld(bookies=5, metastore=c)


def _written_ledger(c: SimCluster, world: LedgerWorld, entries: int) -> int:
    """A ledger on bookies 1-3 (Qw 3, Qa 2) holding `entries` acknowledged entries; its writer crashed."""
    lid = world.create_ledger((1, 2, 3), 3, 2).ledger_id
    w = world.writer("w", lid)
    for i in range(entries):
        world.append("w", b"entry %d" % i)
    assert world.run_until(lambda: len(w.acked) == entries, 5_000)
    world.crash_client("w")
    return lid


def _metadata_everywhere(c: SimCluster, lid: int) -> set[bytes]:
    """The ledger znode's bytes on every metastore node, read from each node's own tree."""
    path = ledger_path(LEDGER_ROOT, lid)
    return {c.peer(i).sm.tree.node(path).data for i in c.alive()}


def test_the_simulator_uses_the_real_ledger_managers_layout_acl_and_retry() -> None:
    assert LEDGER_ROOT == ledger.manager.DEFAULT_ROOT
    assert LEDGER_ACL == ledger.manager.LEDGER_ACL
    assert METADATA_RETRY_MS == ledger.driver.METADATA_RETRY_S * 1000


def test_a_recovery_closes_the_ledger_through_a_new_metastore_leader() -> None:
    """The recoverer marks the ledger IN_RECOVERY through leader L1; its fences are held while L1
    crashes and the ensemble elects another leader; the close then commits in the new epoch, and
    every metastore node holds exactly the metadata the recoverer wrote."""
    c, world = _world()
    lid = _written_ledger(c, world, entries=10)
    first_leader = c.leader()
    fences = world.hold(lambda m: isinstance(m.action, A.SendFence))
    r = world.recoverer("r", lid)
    assert world.run_until(lambda: world.meta.writes and world.meta.writes[0].status == "acked", 5_000)
    assert world.meta.read(lid)[0].state is LedgerState.IN_RECOVERY

    c.crash(first_leader)
    assert c.run_until(lambda: c.leader() not in (None, first_leader) and c.converged(), 10_000)
    world.release(fences)
    assert world.run_until(lambda: r.done, 10_000), "\n".join(world.log)

    assert r.result.is_closed and r.result.last_entry == 9
    mark, close = world.meta.writes[0], world.meta.writes[-1]
    assert close.status == "acked" and close.zxid >> 32 > mark.zxid >> 32, "the close committed in a new epoch"
    c.restart(first_leader)
    assert c.run_until(c.converged, 10_000)
    assert _metadata_everywhere(c, lid) == {encode(r.result)}
    assert world.check_closed_ledger(lid) == r.result


def test_a_close_whose_answer_is_lost_with_its_node_is_found_committed_by_the_re_read() -> None:
    """r's session is on follower F. The leader commits r's closing CAS, then F crashes before it
    answers: to r a ConnectionLoss, which the driver reports as MetadataBadVersion. The write did
    land: r re-reads through another node, finds its own CLOSED record and completes with it,
    never closing twice."""
    c, world = _world(seed=2)
    lid = _written_ledger(c, world, entries=6)
    leader = c.leader()
    follower = min(i for i in c.alive() if i != leader)
    r = world.recoverer("r", lid)
    world.meta.connect("r", follower)

    def closed_at_leader_only() -> bool:
        writes = world.meta.writes
        return (len(writes) == 2 and writes[1].status == "pending"
                and world.meta.read_on(leader, lid)[0].is_closed)
    assert world.run_until(closed_at_leader_only, 10_000), "\n".join(world.log)
    c.crash(follower)
    assert world.run_until(lambda: r.done, 10_000), "\n".join(world.log)

    close = world.meta.writes[1]
    assert close.status == "unknown" and world.meta.connection_losses >= 1
    assert len(world.meta.writes) == 2, "r wrote again although its close had landed"
    assert r.result == world.meta.read(lid)[0] and r.result.last_entry == 5
    assert _metadata_everywhere(c, lid) == {encode(r.result)}


def test_without_a_metastore_leader_a_recoverer_waits_and_then_finishes() -> None:
    """Two of three metastore voters down: the mark cannot commit and every read is refused
    (ConnectionLoss), so recovery waits, retrying as the driver does; once a voter is back it
    completes."""
    c, world = _world(seed=3)
    lid = _written_ledger(c, world, entries=4)
    down = [i for i in c.alive() if i != c.leader()]
    for i in down:
        c.crash(i)
    r = world.recoverer("r", lid)
    world.run(3_000)
    assert not r.done and world.meta.connection_losses > 0
    assert world.meta.read(lid)[0].state is LedgerState.OPEN
    c.restart(down[0])
    assert world.run_until(lambda: r.done, 20_000), "\n".join(world.log)
    assert r.result.is_closed and r.result.last_entry == 3


@pytest.mark.parametrize("seed", [1, 6])
def test_a_printed_mixed_schedule_replays_to_the_same_outcome(seed: int) -> None:
    outcome = explore(seed, 12, mixed=True)
    assert outcome.ok, outcome.report()
    assert parse_schedule(outcome.schedule) == plan_from_seed(seed, 12)
    assert run(parse_schedule(outcome.schedule)) == outcome


def test_a_mixed_run_is_one_schedule_on_one_clock() -> None:
    c, world = run_mixed(plan_from_seed(4, 12))
    assert world.sched is c.sched and world.rng is c.rng and world.now == c.now
    assert world.meta.writes, "the ledger's metadata went through the metastore"


def _pretend_written(self, name, ledger_id, action) -> None:
    """Mutant: a CAS whose outcome is unknown reported as written (the real driver reports it as
    MetadataBadVersion, so that the operation re-reads)."""
    if isinstance(action, A.WriteMetadata):
        self._answer(name, A.MetadataWritten(action.expected_version + 1))
    else:
        _real_connection_loss(self, name, ledger_id, action)


_real_connection_loss = sim.ledger_meta.ZabMetadata._connection_loss


def test_a_model_that_trusts_an_unknown_cas_is_caught_by_the_mixed_oracles(monkeypatch) -> None:
    monkeypatch.setattr(sim.ledger_meta.ZabMetadata, "_connection_loss", _pretend_written)
    failures = [o for o in (explore(s, 14, mixed=True) for s in range(16)) if not o.ok]
    assert failures, "no seed noticed a recovery that believed a CAS which never committed"
    assert all("InvariantViolation" in o.failure for o in failures)
