"""The ledger scenarios of FAULTS.md, as stories on simulated bookies (sim/ledger_world.py).

Each story runs the real pure operations (Writer, RecoveryOp, ReadEntryOp) against SimBookies over a
seeded network, shapes the interleaving with hold/drop rules, and ends with the oracles: every
acknowledged entry is in the closed ledger with Qa genuine copies on the bookies the metadata records;
recoverers agree; a fenced writer gets no acknowledgement after its failure. Where a story guards
against a known bug, a "mutant" of the operation with that bug shows the oracle catching it.
"""

from __future__ import annotations

import pytest

from bookie.entry import NO_ENTRY, Digester, DigestType
from ledger import actions as A
from ledger.errors import LedgerFenced, LedgerInRecovery, OutcomeUnknown
from ledger.metadata import Fragment, LedgerState
from ledger.read_op import ReadEntryOp
from ledger.recovery_op import RecoveryOp
from ledger.writer import Writer
from sim.ledger_world import InvariantViolation, LedgerWorld


def adds_to(client: str, *bookies: int):
    return lambda m: m.client == client and isinstance(m.action, A.SendAdd) and m.bookie in bookies


def writer_with(world: LedgerWorld, ensemble=(1, 2, 3), qw=3, qa=2, **kw):
    ledger = world.create_ledger(ensemble, qw, qa)
    world.writer("w", ledger.ledger_id, **kw)
    return ledger.ledger_id


def recover(world: LedgerWorld, lid: int, name: str = "r", timeout_ms: int = 5_000, **kw):
    r = world.recoverer(name, lid, **kw)
    assert world.run_until(lambda: r.done, timeout_ms), f"recovery stuck: {r.trace[-5:]}"
    assert r.error is None, r.error
    return r


def test_happy_path_append_close_read_back():
    world = LedgerWorld(seed=1)
    lid = writer_with(world, (1, 2, 3, 4), qw=3, qa=2)
    ids = [world.append("w", f"entry {i}".encode()) for i in range(40)]
    w = world.clients["w"]
    assert world.run_until(lambda: len(w.acked) == 40)
    assert w.acked == ids
    world.close("w")
    assert world.run_until(lambda: w.result is not None)
    closed = world.check_closed_ledger(lid)
    assert (closed.last_entry, closed.length) == (39, sum(len(f"entry {i}") for i in range(40)))
    reader = world.start_op("read", lid, ReadEntryOp(closed, 17, Digester(DigestType.CRC32C, b"secret")))
    assert world.run_until(lambda: reader.done)
    assert reader.result.payload == b"entry 17"


def test_seed_000_recovery_example_on_simulated_bookies():
    """Seed 000's picture: the bookies report LAC 9, 10, 11; entry 12 is on bookies 1 and 3 (it was
    packaged while the writer's LAC was 9), 13 nowhere. The ledger closes at 12 with 12 re-replicated."""
    world = LedgerWorld(seed=0)
    lid = writer_with(world, explicit_lac=False)
    w = world.clients["w"]
    for i in range(10):
        world.append("w", b"x%d" % i)
    world.run_until(lambda: len(w.acked) == 10)                   # every bookie has 0..9, LAC 9 is known
    hold2 = world.hold(adds_to("w", 2))
    world.append("w", b"x10")
    world.append("w", b"x11")
    world.append("w", b"x12")                                     # all three packaged with LAC 9
    world.run(50)
    world.crash_client("w")
    world.bookies[2].entries[lid].update({e: world.bookies[1].has(lid, e) for e in (10, 11)})
    world.bookies[2].write_lac(lid, 10, w.key)                    # bookie 2: LAC 10, no entry 12
    world.bookies[3].write_lac(lid, 11, w.key)                    # bookie 3: LAC 11
    assert [world.bookies[b].read_lac(lid) for b in (1, 2, 3)] == [9, 10, 11]
    assert [world.bookies[b].has(lid, 12) is not None for b in (1, 2, 3)] == [True, False, True]
    world.rules.remove(hold2)
    r = recover(world, lid)
    assert r.result.last_entry == 12 and r.op.lac in (10, 11)
    assert world.bookies[2].has(lid, 12) is not None              # re-added to the whole write quorum
    world.check_closed_ledger(lid)


class NonFencingReads(RecoveryOp):
    """Mutant: recovery reads that do not fence (the bug of #2614)."""

    def step(self, event):
        return [A.SendRead(a.bookie, a.entry_id, False) if isinstance(a, A.SendRead) else a
                for a in super().step(event)]


def fencing_is_not_enough(recovery_op) -> LedgerWorld:
    """#2614, Qw=3 Qa=2: the old writer's entry 0 reached only bookie 1 (its adds to 2 and 3 are slow);
    the fence to bookie 3 is lost; bookie 1's answer to the recovery read is slow. Bookies 2 and 3 say
    'no entry 0', so recovery closes the ledger empty; then the slow adds land."""
    world = LedgerWorld(seed=2)
    lid = writer_with(world)
    slow_adds = world.hold(adds_to("w", 2, 3))
    world.append("w", b"zero")
    world.run(20)
    world.drop(lambda m: m.client == "r" and isinstance(m.action, A.SendFence) and m.bookie == 3)
    world.hold(lambda m: m.client == "r" and isinstance(m.action, A.SendRead) and m.bookie == 1)
    metadata, version = world.meta.read(lid)
    r = world.start_op("r", lid, recovery_op(metadata, version, Digester(DigestType.CRC32C, b"secret")))
    assert world.run_until(lambda: r.done, 2_000)
    assert r.result.last_entry == NO_ENTRY
    world.release(slow_adds)
    world.run(200)
    return world


def test_fencing_is_not_enough_recovery_reads_fence_too_2614():
    world = fencing_is_not_enough(RecoveryOp)
    w = world.clients["w"]
    assert w.acked == [] and isinstance(w.failed[0], LedgerFenced)   # outcome unknown, never success
    world.check_closed_ledger(1)


def test_fencing_is_not_enough_mutant_is_caught():
    world = fencing_is_not_enough(NonFencingReads)
    assert world.clients["w"].acked == [0]                       # bookie 3 was never fenced: 1 + 3 = Qa
    with pytest.raises(InvariantViolation, match="acknowledged up to 0 but the ledger closed at -1"):
        world.check_closed_ledger(1)


def test_recovery_starts_at_the_current_fragments_first_entry_2615():
    """Entries 0..9 are acknowledged (every copy carries LAC -1: they were pipelined); bookie 3 dies;
    the writer moves entry 10 to a new fragment {1, 2, 4} and crashes before 10 lands anywhere. The
    bookies' LACs say -1, but recovery must start at 10: it never reads or re-adds 0..9."""
    world = LedgerWorld(seed=3)
    lid = writer_with(world, explicit_lac=False)
    w = world.clients["w"]
    for i in range(10):
        world.append("w", b"e%d" % i)
    world.run_until(lambda: len(w.acked) == 10)
    world.crash_bookie(3)
    world.hold(lambda m: m.client == "w" and isinstance(m.action, A.SendAdd) and m.bookie != 3)
    world.append("w", b"e10")
    assert world.run_until(lambda: len(world.meta.read(lid)[0].fragments) == 2)
    world.crash_client("w")
    assert world.meta.read(lid)[0].fragments[1].first_entry == 10
    r = recover(world, lid)
    assert r.op.lac == NO_ENTRY and r.op.start_entry == 10
    assert r.result.last_entry == 9 and len(r.result.fragments) == 1
    touched = {a.entry_id for a in r.requests if isinstance(a, (A.SendAdd, A.SendRead)) and
               (isinstance(a, A.SendAdd) or a.fence)}
    assert min(touched) == 10, "recovery re-read or re-wrote an old fragment"
    assert all(world.bookies[4].has(lid, e) is None for e in range(10))
    world.check_closed_ledger(lid)


class TimeoutsAreAbsence(RecoveryOp):
    """Mutant: a timeout counts as 'no such entry' (the bug of #2281 / #3405)."""

    def step(self, event):
        from bookie import errors as B
        if isinstance(event, A.ReadFailed) and isinstance(event.error, B.BookieUnavailable):
            event = A.ReadFailed(event.bookie, event.entry_id, B.NoSuchEntry("timeout taken for absence"))
        return super().step(event)


def one_dead_bookie(recovery_op) -> LedgerWorld:
    """Qw=3 Qa=2. Entries 0..4 are on every bookie; entry 5 reached bookies 1 and 3 only (acknowledged).
    The writer dies, bookie 3 dies, and bookie 1 is slow to answer recovery reads for a while. Recovery
    must go on with exactly the coverage quorum (bookies 1 and 2) and wait for 1 instead of taking
    bookie 3's timeout as 'absent'."""
    world = LedgerWorld(seed=4)
    lid = writer_with(world, explicit_lac=False)
    w = world.clients["w"]
    for i in range(5):
        world.append("w", b"e%d" % i)
    world.run_until(lambda: len(w.acked) == 5)
    world.hold(adds_to("w", 2))
    world.append("w", b"e5")
    world.run_until(lambda: len(w.acked) == 6)
    world.crash_client("w")
    world.crash_bookie(3)
    slow = world.hold(lambda m: m.client == "r" and isinstance(m.action, A.SendRead) and m.bookie == 1)
    metadata, version = world.meta.read(lid)
    r = world.start_op("r", lid, recovery_op(metadata, version, Digester(DigestType.CRC32C, b"secret")))
    world.run_until(lambda: r.done, 500)
    world.release(slow)
    assert world.run_until(lambda: r.done, 5_000)
    return world


def test_recovery_progresses_with_the_coverage_quorum_and_a_timeout_is_not_absence_2281_3405():
    world = one_dead_bookie(RecoveryOp)
    r = world.clients["r"]
    assert r.result.last_entry == 5
    world.check_closed_ledger(1)


def test_timeouts_as_absence_mutant_loses_an_acknowledged_entry():
    world = one_dead_bookie(TimeoutsAreAbsence)
    assert world.clients["r"].result.last_entry < 5
    with pytest.raises(InvariantViolation, match="acknowledged up to 5"):
        world.check_closed_ledger(1)


class EagerWriter(Writer):
    """Mutant: acknowledges with the old ensemble while the ensemble-change CAS is in flight (#4651)."""

    def _acknowledge(self):
        change, self.change = self.change, None
        try:
            return super()._acknowledge()
        finally:
            self.change = change if self.change is None else self.change


def deferred_failure(writer_cls) -> LedgerWorld:
    """#1591 / #4651 / #4097: bookie 3 acks entry 0 and then dies; entry 1's failure starts an ensemble
    change from entry 0 (nothing acknowledged yet) replacing 3 by 4. While that CAS is slow, bookie 1
    acks entry 0: with bookie 3's ack that makes two, but the metadata will record {1, 2, 4} for it."""
    world = LedgerWorld(seed=5)
    lid = writer_with(world, writer_cls=writer_cls)
    w = world.clients["w"]
    slow12 = world.hold(adds_to("w", 1, 2))
    world.append("w", b"zero")
    world.run(20)
    world.crash_bookie(3)
    slow_cas = world.hold(lambda m: m.client == "w" and isinstance(m.action, A.WriteMetadata))
    world.append("w", b"one")
    assert world.run_until(lambda: slow_cas.held, 500)
    world.rules.remove(slow12)
    for msg in slow12.held:
        if msg.bookie == 1:
            world._travel(msg)                                    # bookie 2's copies stay lost in the network
    world.run(50)
    world.release(slow_cas)
    world.run_until(lambda: len(w.acked) == 2, 1_000)
    world.run(0)                                                  # the quiet writer's Idle: its explicit LAC leaves
    world.crash_bookie(1)                                         # one failure: Qa - 1 = 1 is tolerated
    world.crash_client("w")
    recover(world, lid)
    return world


def test_never_acknowledge_with_bookies_the_metadata_does_not_record_1591_4651():
    world = deferred_failure(Writer)
    assert world.clients["w"].acked == [0, 1]
    world.restart_bookie(1)
    world.check_closed_ledger(1)


def test_eager_acknowledgement_mutant_is_caught():
    world = deferred_failure(EagerWriter)
    world.restart_bookie(1)
    with pytest.raises(InvariantViolation, match="fewer than Qa"):
        world.check_closed_ledger(1)


def lost_data(limbo: bool) -> LedgerWorld:
    """Qw=3 Qa=2: entry 0 is on bookies 1 and 2 (acknowledged); bookie 3's copy never arrives. The writer
    dies, bookie 2 loses its disk, bookie 1 is slow. In limbo bookie 2 answers 'unknown'; without it,
    'nothing here'."""
    world = LedgerWorld(seed=6)
    lid = writer_with(world, explicit_lac=False)
    w = world.clients["w"]
    world.hold(adds_to("w", 3))
    world.append("w", b"precious")
    world.run_until(lambda: w.acked == [0])
    world.crash_client("w")
    world.bookies[2].wipe(limbo=limbo)
    slow = world.hold(lambda m: m.client == "r" and isinstance(m.action, A.SendRead) and m.bookie == 1)
    r = world.recoverer("r", lid)
    world.run_until(lambda: r.done, 500)
    world.release(slow)
    assert world.run_until(lambda: r.done, 5_000)
    return world


def test_a_bookie_that_lost_its_data_is_not_authoritative_limbo():
    world = lost_data(limbo=True)
    assert world.clients["r"].result.last_entry == 0
    world.check_closed_ledger(1)


def test_a_wiped_bookie_answering_nothing_here_loses_data_which_is_why_cookies_refuse_it():
    world = lost_data(limbo=False)
    assert world.clients["r"].result.last_entry == NO_ENTRY
    with pytest.raises(InvariantViolation):
        world.check_closed_ledger(1)


def test_concurrent_recoverers_converge():
    world = LedgerWorld(seed=7)
    lid = writer_with(world, (1, 2, 3, 4), qw=3, qa=2)
    w = world.clients["w"]
    for i in range(30):
        world.append("w", b"e%d" % i)
    world.run(6)                                                  # crash mid-stream
    world.crash_client("w")
    r1, r2 = world.recoverer("r1", lid), world.recoverer("r2", lid)
    assert world.run_until(lambda: r1.done and r2.done)
    assert r1.result == r2.result == world.meta.read(lid)[0]
    assert r1.result.last_entry >= (w.acked[-1] if w.acked else NO_ENTRY)
    world.check_closed_ledger(lid)


def test_a_live_writer_fenced_mid_stream_gets_outcome_unknown_never_success():
    world = LedgerWorld(seed=8)
    lid = writer_with(world, (1, 2, 3), qw=2, qa=2)
    w = world.clients["w"]
    for i in range(20):
        world.append("w", b"e%d" % i)
    world.run(4)
    r = world.recoverer("r", lid)
    for i in range(20, 40):
        world.run(2)
        if w.broken_at is None:
            world.append("w", b"e%d" % i)
    assert world.run_until(lambda: r.done)
    world.run(200)
    assert w.failed and all(isinstance(e, OutcomeUnknown) for e in w.failed.values())
    assert r.result.state is LedgerState.CLOSED
    world.check_closed_ledger(lid)
    world.close("w")
    assert isinstance(w.error, LedgerFenced)


def test_writer_survives_bookie_crashes_by_changing_ensembles():
    world = LedgerWorld(seed=9, bookies=6)
    lid = writer_with(world, (1, 2, 3), qw=3, qa=2)
    w = world.clients["w"]
    for i in range(60):
        world.append("w", b"e%d" % i)
        world.run(1)
        if i == 15:
            world.crash_bookie(2)
        if i == 35:
            world.crash_bookie(w.op.metadata.last_fragment.ensemble[0])
    assert world.run_until(lambda: len(w.acked) == 60)
    world.run(200)                                                # bookie 1's timeouts come in late
    assert w.op.ensemble_changes == 2 and not {1, 2} & set(w.op.metadata.last_fragment.ensemble)
    world.close("w")
    assert world.run_until(lambda: w.result is not None)
    world.check_closed_ledger(lid)


def test_speculative_read_and_corrupt_replica():
    world = LedgerWorld(seed=10)
    lid = writer_with(world, (1, 2, 3), qw=3, qa=2)
    w = world.clients["w"]
    world.append("w", b"payload")
    world.run_until(lambda: w.acked == [0])
    world.run(50)
    metadata, _ = world.meta.read(lid)
    digester = Digester(DigestType.CRC32C, b"secret")
    world.hold(lambda m: m.client == "slow" and m.bookie == 1)       # the first replica never answers
    r = world.start_op("slow", lid, ReadEntryOp(metadata, 0, digester, speculative_ticks=2))
    assert world.run_until(lambda: r.done, 100) and r.result.payload == b"payload"
    assert [a.bookie for a in r.requests] == [1, 2]
    corrupt = bytearray(world.bookies[1].has(lid, 0))
    corrupt[-1] ^= 0xFF
    world.bookies[1].entries[lid][0] = bytes(corrupt)
    r = world.start_op("corrupt", lid, ReadEntryOp(metadata, 0, digester, speculative_ticks=100))
    assert world.run_until(lambda: r.done, 100) and r.result.payload == b"payload"
    assert [a.bookie for a in r.requests] == [1, 2]


def test_a_writer_closing_while_a_recoverer_holds_the_ledger_gets_ledger_in_recovery():
    """Seed 001, closing as a writer: the close CAS loses to a recoverer's IN_RECOVERY mark -> error.
    The recoverer then closes the ledger with every entry the writer acknowledged."""
    world = LedgerWorld(seed=11)
    lid = writer_with(world)
    w = world.clients["w"]
    for i in range(5):
        world.append("w", b"e%d" % i)
    world.run_until(lambda: len(w.acked) == 5)
    slow_close = world.hold(lambda m: m.client == "w" and isinstance(m.action, A.WriteMetadata))
    world.close("w")
    held_fences = world.hold(lambda m: m.client == "r" and isinstance(m.action, A.SendFence))
    r = world.recoverer("r", lid)
    world.run(50)
    assert world.meta.read(lid)[0].state is LedgerState.IN_RECOVERY
    world.release(slow_close)
    assert world.run_until(lambda: w.error is not None, 1_000)
    assert isinstance(w.error, LedgerInRecovery)
    world.release(held_fences)
    assert world.run_until(lambda: r.done)
    assert r.result.last_entry == 4
    world.check_closed_ledger(lid)


def test_log_level_fencing_new_owner_recovers_then_cases_the_ledger_list():
    """Ledgers to logs (FAULTS.md): a log is a CAS-protected list of ledgers. The new owner recovers the
    old owner's last ledger (fencing it), adds its own ledger to the list by CAS; the old owner, still
    alive, is fenced on its appends and loses its own CAS on the list, so the log has one history."""
    world = LedgerWorld(seed=12, bookies=4)
    log = {"ledgers": (), "version": 0}

    def cas_list(ledgers: tuple, expected: int) -> bool:
        if log["version"] != expected:
            return False
        log["ledgers"], log["version"] = ledgers, expected + 1
        return True

    old = writer_with(world)
    assert cas_list((old,), 0)
    w = world.clients["w"]
    for i in range(10):
        world.append("w", b"old %d" % i)
    world.run(3)
    seen_version = log["version"]                                 # the new owner reads the list
    r = recover(world, old)
    new = world.create_ledger((2, 3, 4), 3, 2).ledger_id
    assert cas_list((old, new), seen_version)
    world.run(100)
    assert not cas_list((old, world.create_ledger((1, 2, 3), 3, 2).ledger_id), seen_version)  # old owner's roll
    if w.broken_at is None:
        world.append("w", b"zombie")
        world.run(100)
    assert isinstance(next(iter(w.failed.values())), LedgerFenced)
    assert log["ledgers"] == (old, new) and r.result.last_entry >= (w.acked[-1] if w.acked else NO_ENTRY)
    world.check_closed_ledger(old)


def test_recovery_replaces_a_dead_bookie_when_re_adds_cannot_reach_qa():
    """E = Qw = Qa = 3 on bookies 1 2 3, bookie 4 spare. Entries 0..4 are acknowledged (on every
    bookie; the bookies know LAC 3); the writer dies, then bookie 3. Recovery must re-add entry 4 to
    all three of its write quorum: it replaces 3 by 4 for the entries it re-adds, and the close
    records that fragment. A first recoverer dies halfway: the metadata still shows the old ensemble
    (the fragment is written only with the close), and the second one recovers from there."""
    world = LedgerWorld(seed=13, bookies=4)
    lid = writer_with(world, qw=3, qa=3, explicit_lac=False)
    w = world.clients["w"]
    for i in range(5):
        world.append("w", b"e%d" % i)
        world.run_until(lambda: len(w.acked) == i + 1)
    world.crash_client("w")
    world.crash_bookie(3)
    first = world.recoverer("r1", lid)
    assert world.run_until(lambda: any(isinstance(a, A.SendAdd) and a.bookie == 4 for a in first.requests), 2_000)
    world.crash_client("r1")
    assert world.meta.read(lid)[0].fragments == (Fragment(0, (1, 2, 3)),)
    r = recover(world, lid, "r2")
    assert r.result.last_entry == 4 and r.op.start_entry == 4 and r.op.ensemble_changes == 1
    assert r.result.fragments == (Fragment(0, (1, 2, 3)), Fragment(4, (1, 2, 4)))
    world.check_closed_ledger(lid)
