"""Stories of the simulator's bookie journals (sim/bookie_journal.py) and AutoRecovery
(sim/autorecovery.py, sim/replication_op.py): one seed, one scheduler, no sleeping."""

from __future__ import annotations

import re

import sim.replication_op
from bookie.entry import Digester, DigestType
from ledger import actions as A
from ledger.read_op import ReadEntryOp
from sim.autorecovery import SimAutoRecovery, check_rereplicated
from sim.cluster import SimCluster
from sim.explore import explore, run
from sim.ledger_schedule import story_from_seed
from sim.ledger_world import LedgerWorld
from sim.mixed_schedule import plan_from_seed

DIGESTER = Digester(DigestType.CRC32C, b"secret")


def _on_metastore(seed: int = 5, bookies: int = 5) -> LedgerWorld:
    c = SimCluster(3, seed=seed, tick_ms=10)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    return LedgerWorld(bookies=bookies, metastore=c, journal=True)


def _closed_ledger(world: LedgerWorld, entries: int, ensemble=(1, 2, 3), qw: int = 2, qa: int = 2) -> int:
    lid = world.create_ledger(ensemble, qw, qa).ledger_id
    w = world.writer("w", lid)
    for i in range(entries):
        world.append("w", b"entry %d" % i)
    world.close("w")
    assert world.run_until(lambda: w.done, 5_000), "\n".join(world.log)
    assert w.result.is_closed and w.result.last_entry == entries - 1
    return lid


def _read_all(world: LedgerWorld, lid: int, entries: int) -> list[bytes]:
    metadata, _ = world.meta.read(lid)
    payloads = []
    for e in range(entries):
        reader = world.start_op(f"read{e}", lid, ReadEntryOp(metadata, e, DIGESTER))
        assert world.run_until(lambda: reader.done, 5_000)
        assert reader.error is None, reader.error
        payloads.append(reader.result.payload)
    return payloads


# -- journals ---------------------------------------------------------------------------------------
def test_a_bookie_answers_an_add_only_after_its_fsync_and_a_crash_before_it_loses_the_add() -> None:
    """Entry 0 is acknowledged (its fsyncs done). Bookie 2's fsync of entry 1 is still in flight
    when it crashes: the add is lost from its disk, never acknowledged by it, and the writer
    replaces it; after a restart bookie 2 replays its journal and holds entry 0, not entry 1."""
    world = LedgerWorld(seed=3, bookies=4, journal=True, fsync_ms=(20, 20), keep_unsynced=False)
    lid = world.create_ledger((1, 2), 2, 2).ledger_id
    w = world.writer("w", lid)
    world.append("w", b"entry 0")
    assert world.run_until(lambda: w.acked == [0], 1_000)
    world.append("w", b"entry 1")
    assert world.run_until(lambda: world.bookies[2].journal.syncing_to is not None, 1_000)
    assert world.bookies[2].has(lid, 1) is None, "an unsynced add is not readable yet"
    world.crash_bookie(2)
    assert world.bookies[2].journal.lost_records > 0
    assert world.run_until(lambda: w.acked == [0, 1], 2_000), "\n".join(w.trace)
    world.restart_bookie(2)
    assert world.bookies[2].has(lid, 0) is not None and world.bookies[2].has(lid, 1) is None
    assert 2 not in world.meta.read(lid)[0].last_fragment.ensemble, "the writer replaced bookie 2"


def test_a_fence_is_answered_only_once_durable_and_survives_a_crash_after_the_answer() -> None:
    """A recoverer's fence is answered only after its FENCE record is fsynced; a crash after the
    answer keeps the fence (replayed from the journal), so the old writer's add is still refused."""
    world = LedgerWorld(seed=4, bookies=3, journal=True, fsync_ms=(5, 5))
    lid = world.create_ledger((1, 2, 3), 3, 2).ledger_id
    w = world.writer("w", lid)
    world.append("w", b"entry 0")
    assert world.run_until(lambda: w.acked == [0], 1_000)
    r = world.recoverer("r", lid)
    assert world.run_until(lambda: r.done, 2_000)
    for b in (1, 2, 3):
        world.crash_bookie(b)
        world.restart_bookie(b)
        assert world.bookies[b].rules.is_fenced(lid), f"bookie {b} forgot an acknowledged fence"
    world.append("w", b"entry 1")
    assert world.run_until(lambda: w.broken_at is not None, 2_000)
    world.check_closed_ledger(lid)


# -- AutoRecovery ------------------------------------------------------------------------------------
def test_a_lost_bookie_is_re_replicated_and_the_metadata_names_its_replacement() -> None:
    """A closed ledger on bookies 1-3 (Qw 2, Qa 2), metadata in the metastore. Bookie 2 dies for
    good; after the grace period the auditor marks the ledger, a worker copies every entry bookie 2
    held to a bookie outside the ensemble and only then CASes it in through Zab. Bookie 1 then dies
    too: a reader still reads every entry, from the survivors and the replacement."""
    world = _on_metastore()
    ar = SimAutoRecovery(world, grace_ms=200)
    lid = _closed_ledger(world, 20)
    world.lose_bookie(2)
    assert world.run_until(lambda: ar.repaired, 10_000), "\n".join(world.log)
    metadata, version = world.meta.read(lid)
    (fragment,) = metadata.fragments
    assert fragment.ensemble[0] == 1 and fragment.ensemble[2] == 3 and fragment.ensemble[1] in (4, 5)
    assert version == 2, "one CAS to CLOSED, one for the repair"
    ar.check_copied_before_replaced()
    check_rereplicated(world, lid, {2})
    world.crash_bookie(1)
    assert _read_all(world, lid, 20) == [b"entry %d" % i for i in range(20)]


def test_a_bookie_back_within_the_grace_period_causes_no_copying() -> None:
    world = _on_metastore(seed=6)
    ar = SimAutoRecovery(world, grace_ms=500)
    lid = _closed_ledger(world, 10)
    world.crash_bookie(3)
    world.run(300)
    world.restart_bookie(3)
    world.run(1_000)
    assert ar.workers == 0 and not ar.tasks and world.meta.read(lid)[1] == 1


def test_the_worker_repairs_an_earlier_fragment_of_an_open_ledger_and_races_the_writers_close() -> None:
    """Bookie 2 dies while the writer appends: the writer replaces it (an ensemble change), which
    ends fragment 0, and keeps appending. The worker repairs fragment 0 of the still OPEN ledger;
    the writer's close, on the version before the worker's CAS, is refused, re-reads and closes
    on top of it. Then bookie 3 dies too and both fragments are repaired again. No CAS lost
    another's change: the closed ledger has every fragment, and every entry has Qw copies on
    live bookies its metadata names."""
    world = _on_metastore(seed=7, bookies=6)
    ar = SimAutoRecovery(world, grace_ms=50)
    lid = world.create_ledger((1, 2, 3), 3, 2).ledger_id
    w = world.writer("w", lid)
    for i in range(10):
        world.append("w", b"entry %d" % i)
    assert world.run_until(lambda: w.acked == list(range(10)), 2_000)
    world.lose_bookie(2)
    for i in range(10, 30):
        world.append("w", b"entry %d" % i)
        world.run(10)
    assert world.run_until(lambda: len(w.acked) == 30, 5_000), "\n".join(w.trace[-10:])
    assert world.run_until(lambda: ar.repaired, 5_000), "\n".join(world.log)
    world.close("w")
    assert world.run_until(lambda: w.done, 5_000)
    # Which of the workers takes the task depends on the schedule: any one of them, once.
    cas = [(op.status, re.sub(r"^ar\d+ ", "worker ", op.value)) for op in world.meta.writes]
    assert cas[:4] == [("acked", "w OPEN v0"), ("acked", "worker OPEN v1"), ("refused", "w CLOSED v1"),
                       ("acked", "w CLOSED v2")], cas
    world.lose_bookie(3)
    assert world.run_until(lambda: ar.idle() and not world.meta.read(lid)[0].bookies & {2, 3}, 20_000), ar.failures
    metadata = check_rereplicated(world, lid, {2, 3})
    assert [f.first_entry for f in metadata.fragments] == [0, w.result.fragments[1].first_entry]
    assert metadata.last_entry == 29 and w.result.last_entry == 29
    assert _read_all(world, lid, 30) == [b"entry %d" % i for i in range(30)]


def test_a_bookie_back_after_the_grace_period_does_not_leave_its_task_stuck() -> None:
    """Found by the sweep (sim.mixed_schedule with a short grace): Qw=1, bookie 1 down past the grace
    period is marked lost, and the repair fails: its entries have no other replica. It comes back
    with the only copy of its entries: the worker taking the task again judges it lost no more, finds
    no lost bookie in the ledger and deletes the task. Nothing was copied, the metadata is unchanged
    and every entry reads back."""
    world = _on_metastore(seed=8)
    ar = SimAutoRecovery(world, grace_ms=100)
    lid = _closed_ledger(world, 6, ensemble=(1, 2), qw=1, qa=1)
    world.crash_bookie(1)
    assert world.run_until(lambda: ar.failures, 2_000)
    assert ar.tasks[lid].lost == {1} and "no readable replica" in ar.failures[-1]
    world.restart_bookie(1)
    assert world.run_until(ar.idle, 30_000), ar.failures[-1:]
    assert ar.repaired == [lid] and world.meta.read(lid)[1] == 1, "only the close: no bookie was replaced"
    assert not any(c.op.stats["entries_copied"] for n, c in world.clients.items() if n.startswith("ar"))
    assert _read_all(world, lid, 6) == [b"entry %d" % i for i in range(6)]


def test_a_ledger_without_a_spare_bookie_is_finished_when_its_bookie_comes_back() -> None:
    """Three bookies, a ledger on all three (Qw 2): bookie 3 down past the grace period cannot be
    replaced ("not enough bookies"). Once it is back the task is finished, the metadata unchanged."""
    world = _on_metastore(seed=10, bookies=3)
    ar = SimAutoRecovery(world, grace_ms=100)
    lid = _closed_ledger(world, 9)
    world.crash_bookie(3)
    assert world.run_until(lambda: ar.failures, 2_000)
    assert "not enough bookies" in ar.failures[-1]
    world.restart_bookie(3)
    assert world.run_until(ar.idle, 30_000), ar.failures[-1:]
    assert world.meta.read(lid)[0].fragments[0].ensemble == (1, 2, 3) and world.meta.read(lid)[1] == 1
    check_rereplicated(world, lid, set())


def test_a_bookie_back_is_read_from_while_one_lost_for_good_is_still_replaced() -> None:
    """Bookies 1 and 2 both down past the grace period, bookie 2 for good (disk wiped): the entries
    whose write quorum is (1, 2) have no readable replica. Bookie 1 comes back: the worker drops it
    from the task, copies those entries from it, and replaces bookie 2 only; bookie 1 stays."""
    world = _on_metastore(seed=11)
    ar = SimAutoRecovery(world, grace_ms=100)
    lid = _closed_ledger(world, 12)
    world.crash_bookie(1)
    world.lose_bookie(2)
    assert world.run_until(lambda: ar.failures, 2_000)
    assert ar.tasks[lid].lost == {1, 2} and "no readable replica" in ar.failures[-1]
    world.restart_bookie(1)
    assert world.run_until(ar.idle, 30_000), ar.failures[-1:]
    (fragment,) = world.meta.read(lid)[0].fragments
    assert fragment.ensemble[0] == 1 and fragment.ensemble[1] in (4, 5) and fragment.ensemble[2] == 3
    ar.check_copied_before_replaced()
    check_rereplicated(world, lid, {2})
    assert _read_all(world, lid, 12) == [b"entry %d" % i for i in range(12)]


def test_a_worker_request_is_an_ordinary_bookie_request() -> None:
    """The replication op speaks the ledger operations' actions: recovery adds and plain reads."""
    world = _on_metastore(seed=9)
    SimAutoRecovery(world, grace_ms=100)
    lid = _closed_ledger(world, 8)
    world.lose_bookie(3)
    assert world.run_until(lambda: any(n.startswith("ar") and c.done for n, c in world.clients.items()), 10_000)
    sent = [a for n, c in world.clients.items() if n.startswith("ar") for a in c.requests]
    assert all(isinstance(a, (A.SendRead, A.SendAdd)) for a in sent)
    assert all(a.recovery for a in sent if isinstance(a, A.SendAdd)) and not any(
        a.fence for a in sent if isinstance(a, A.SendRead))
    check_rereplicated(world, lid, {3})


# -- the oracles have teeth: planted bugs are caught ------------------------------------------------
def _cas_before_copying(self, writable):
    """Mutant: the worker CASes the replacement in without copying anything (the real one copies first)."""
    _real_plan(self, writable)
    self.todo.clear()
    self.reading.clear()
    self.phase = "commit"
    return [A.ReadMetadata()]


_real_plan = sim.replication_op.ReplicationOp._plan


def test_a_worker_that_replaces_the_bookie_before_copying_is_caught(monkeypatch) -> None:
    monkeypatch.setattr(sim.replication_op.ReplicationOp, "_plan", _cas_before_copying)
    losing = [s for s in range(100) if any(step[1] == "lose_bookie" for step in plan_from_seed(s, 14).steps)]
    failures = [o for o in (explore(s, 14, mixed=True) for s in losing[:8]) if not o.ok]
    assert failures, "no seed noticed a replacement named in the metadata without the copies"
    assert all("InvariantViolation" in o.failure for o in failures), [o.failure[:200] for o in failures]


def test_a_bookie_that_answers_before_its_fsync_is_caught(monkeypatch) -> None:
    """Mutant: every request's answer is sent at once, not after its records' fsync, so a crash can
    lose what was acknowledged. The ledger stories with journals notice."""
    real_arrive = LedgerWorld._arrive

    def arrive(self, msg):
        real_arrive(self, msg)
        for waiting in self._waiting.values():
            for _, m, answer in waiting:
                self._reply(m, answer)
            waiting.clear()
    monkeypatch.setattr(LedgerWorld, "_arrive", arrive)
    journaled = (story for story in map(story_from_seed, range(400)) if story.journal)
    failure = next((o for o in map(run, journaled) if not o.ok), None)
    assert failure is not None, "no story noticed an acknowledged add lost in a crash"
    assert "InvariantViolation" in failure.failure, failure.failure


def test_a_recovery_replaces_a_dead_bookie_even_if_another_failed_for_a_while() -> None:
    """Found by the mixed sweep (seed 1013 of `python -m sim.explore --mixed --steps 14`): E=Qw=Qa=3
    on bookies 1-3, bookie 4 spare. Bookie 2 dies for good and bookie 3 is down while the recoverer
    re-adds entry 4: both adds fail, and the recoverer asks for two replacements; only bookie 4 is
    eligible, so it replaces neither and retries on ticks. Bookie 3 comes back and takes the re-add,
    but stays a 'failed' bookie: the recoverer keeps asking for two replacements, keeps retrying
    dead bookie 2, and never closes, though replacing 2 by 4 would finish it."""
    world = LedgerWorld(seed=11, bookies=4)
    lid = world.create_ledger((1, 2, 3), 3, 3).ledger_id
    w = world.writer("w", lid)
    for i in range(5):
        world.append("w", b"entry %d" % i)
    assert world.run_until(lambda: len(w.acked) == 5, 1_000)
    world.crash_client("w")
    world.lose_bookie(2)
    world.crash_bookie(3)
    r = world.recoverer("r", lid)
    world.run(300)
    world.restart_bookie(3)
    assert world.run_until(lambda: r.done, 20_000), "the recovery never closed the ledger"
    assert r.result.last_entry == 4 and 2 not in r.result.last_fragment.ensemble
