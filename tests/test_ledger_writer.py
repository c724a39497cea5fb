"""The writer core (ledger/writer.py) and the writer's close (ledger/close_op.py), event by event."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import errors as B
from bookie.entry import NO_ENTRY, Digester, DigestType, parse_header, password_key
from ledger import actions as A
from ledger.close_op import CloseOp
from ledger.errors import (NoSuchLedger, CloseConflict, LedgerClosedUnderWriter, LedgerFenced, LedgerInRecovery,
                           NotEnoughBookies, OutcomeUnknown)
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from ledger.writer import Writer, WriterState

DIGESTER = Digester(DigestType.CRC32C, b"pw")


def metadata(ensemble=(1, 2, 3), qw=3, qa=2, **kw) -> LedgerMetadata:
    return LedgerMetadata(7, len(ensemble), qw, qa, (Fragment(0, tuple(ensemble)),), DigestType.CRC32C,
                          password_key(b"pw", b"check"), 0, **kw)


def sends(actions, kind=A.SendAdd):
    return sorted((a.bookie, a.entry_id) for a in actions if isinstance(a, kind))


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def test_append_sends_to_the_write_quorum_and_acknowledges_after_qa_acks():
    w = Writer(metadata((1, 2, 3, 4), qw=3, qa=2), 0, DIGESTER)
    e0, out = w.append(b"zero")
    assert e0 == 0 and sends(out) == [(1, 0), (2, 0), (3, 0)]
    e1, out = w.append(b"one")
    assert sends(out) == [(2, 1), (3, 1), (4, 1)]
    assert w.step(A.AddAcked(1, 0)) == []
    assert of(w.step(A.AddAcked(3, 0)), A.Acknowledge) == [A.Acknowledge((0,))]
    assert w.lac == 0


def test_an_entry_is_acknowledged_only_when_every_lower_entry_is():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    for p in (b"a", b"b", b"c"):
        w.append(p)
    for b in (1, 2):
        assert w.step(A.AddAcked(b, 2)) == []
        assert w.step(A.AddAcked(b, 1)) == []
    assert w.lac == NO_ENTRY
    w.step(A.AddAcked(1, 0))
    assert w.step(A.AddAcked(3, 0)) == [A.Acknowledge((0, 1, 2))]
    assert w.lac == 2 and w.length == 3


def test_the_lac_is_piggybacked_on_each_add():
    w = Writer(metadata(), 0, DIGESTER)
    _, out0 = w.append(b"x")
    w.step(A.AddAcked(1, 0))
    w.step(A.AddAcked(2, 0))
    _, out1 = w.append(b"yy")
    assert parse_header(out0[0].data).lac == NO_ENTRY
    header = parse_header(out1[0].data)
    assert header.lac == 0 and header.length == 3


def test_acks_from_bookies_outside_the_write_quorum_never_count():
    w = Writer(metadata((1, 2, 3, 4), qw=2, qa=2), 0, DIGESTER)
    w.append(b"x")  # entry 0 -> bookies 1, 2
    assert w.step(A.AddAcked(3, 0)) == []
    assert w.step(A.AddAcked(1, 0)) == []
    assert of(w.step(A.AddAcked(2, 0)), A.Acknowledge)


def test_explicit_lac_once_the_writer_goes_quiet():
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"x")
    w.step(A.AddAcked(1, 0))
    out = w.step(A.AddAcked(2, 0))
    assert out == [A.Acknowledge((0,)), A.RequestIdle()]
    assert w.step(A.Idle()) == [A.SendLac(1, 0), A.SendLac(2, 0), A.SendLac(3, 0)]


def change_to(w: Writer, failed: int, new: int) -> A.WriteMetadata:
    out = w.step(A.AddFailed(failed, w.lac + 1, B.BookieUnavailable("down")))
    (choose,) = of(out, A.ChooseBookies)
    assert failed in choose.exclude and choose.count == 1
    (write,) = w.step(A.BookiesChosen((new,)))
    return write


def test_ensemble_change_starts_a_fragment_at_the_first_unacknowledged_entry():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    for p in (b"a", b"b", b"c"):
        w.append(p)
    w.step(A.AddAcked(1, 0))
    w.step(A.AddAcked(2, 0))             # entry 0 acknowledged
    write = change_to(w, failed=3, new=4)
    assert write.expected_version == 0
    assert write.metadata.fragments == (Fragment(0, (1, 2, 3)), Fragment(1, (1, 2, 4)))
    # Acks meanwhile are held: not even entry 1 with two acks from surviving bookies is acknowledged.
    w.step(A.AddAcked(1, 1))
    assert w.step(A.AddAcked(2, 1)) == []
    out = w.step(A.MetadataWritten(1))
    assert sends(out) == [(4, 1), (4, 2)]           # unacknowledged entries go to the new bookie
    assert of(out, A.Acknowledge) == [A.Acknowledge((1,))]  # 1 and 2 ack it, both recorded for entry 1


def test_acks_from_the_replaced_bookie_never_count_deferred_failure_1591():
    """#1591 / #4651: bookie 3 acked entry 0, then failed entry 1. The new fragment starts at 0 (nothing
    acknowledged), without bookie 3: 3's ack of entry 0 must not count once the metadata says 1 2 4."""
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    w.append(b"a")
    w.append(b"b")
    w.step(A.AddAcked(3, 0))
    write = change_to(w, failed=3, new=4)
    assert write.metadata.fragments == (Fragment(0, (1, 2, 4)),)
    assert w.step(A.AddAcked(1, 0)) == []   # held: CAS in flight (and 3 + 1 would be two acks)
    out = w.step(A.MetadataWritten(1))
    assert not of(out, A.Acknowledge)       # only bookie 1 counts now
    assert of(w.step(A.AddAcked(4, 0)), A.Acknowledge) == [A.Acknowledge((0,))]


def test_appends_during_an_ensemble_change_wait_for_the_new_ensemble():
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"a")
    change_to(w, failed=2, new=5)
    _, out = w.append(b"b")
    assert out == []
    assert sends(w.step(A.MetadataWritten(1))) == [(1, 1), (3, 1), (5, 0), (5, 1)]


def test_lost_cas_reread_finds_our_change_committed():
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"a")
    write = change_to(w, failed=2, new=5)
    assert w.step(A.MetadataBadVersion()) == [A.ReadMetadata()]
    out = w.step(A.MetadataRead(write.metadata, 1))
    assert sends(out) == [(5, 0)] and w.metadata == write.metadata


@pytest.mark.parametrize("state, error", [(LedgerState.IN_RECOVERY, LedgerFenced),
                                           (LedgerState.CLOSED, LedgerClosedUnderWriter)])
def test_lost_cas_and_the_ledger_is_no_longer_open_fails_outstanding_appends(state, error):
    m = metadata()
    w = Writer(m, 0, DIGESTER)
    w.append(b"a")
    w.append(b"b")
    change_to(w, failed=2, new=5)
    w.step(A.MetadataBadVersion())
    other = m.with_state(state) if state is LedgerState.IN_RECOVERY else m.closed(NO_ENTRY, 0)
    (fail,) = w.step(A.MetadataRead(other, 1))
    assert fail.entry_ids == (0, 1) and isinstance(fail.error, error) and isinstance(fail.error, OutcomeUnknown)
    assert w.state is WriterState.BROKEN
    with pytest.raises(error):
        w.append(b"c")


def test_lost_cas_on_a_still_open_ledger_proposes_again_on_the_new_version():
    m = metadata((1, 2, 3, 4), qw=3, qa=2)
    w = Writer(m, 0, DIGESTER)
    w.append(b"a")
    change_to(w, failed=2, new=5)
    w.step(A.MetadataBadVersion())
    rereplicated = m.with_fragment(0, (1, 2, 3, 6))       # someone else's change of the ensemble
    out = w.step(A.MetadataRead(rereplicated, 4))
    (choose,) = of(out, A.ChooseBookies)
    (write,) = w.step(A.BookiesChosen((7,)))
    assert write.expected_version == 4 and write.metadata.last_fragment.ensemble == (1, 7, 3, 6)


def test_no_bookie_to_replace_fails_outstanding_appends():
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"a")
    w.step(A.AddFailed(2, 0, B.BookieUnavailable("down")))
    (fail,) = w.step(A.BookiesChosen(()))
    assert isinstance(fail.error, NotEnoughBookies) and fail.entry_ids == (0,)


def test_fenced_writer_fails_everything_outstanding_and_never_acknowledges_again():
    w = Writer(metadata(), 0, DIGESTER)
    for p in (b"a", b"b"):
        w.append(p)
    w.step(A.AddAcked(1, 0))
    (fail,) = w.step(A.AddFailed(2, 0, B.LedgerFenced("fenced")))
    assert fail.entry_ids == (0, 1) and isinstance(fail.error, LedgerFenced)
    assert isinstance(fail.error, OutcomeUnknown)
    assert w.step(A.AddAcked(3, 0)) == []    # a late ack is no success
    with pytest.raises(LedgerFenced):
        w.append(b"c")
    assert isinstance(w.close()[0].error, LedgerFenced)


def test_a_ledger_deleted_under_its_writer_fails_everything_once():
    """Writer.fail, the driver's verdict (NoSuchLedger from the metastore): every outstanding
    append fails, a close waiting for them fails too, and a second verdict changes nothing."""
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    for p in (b"a", b"b"):
        w.append(p)
    w.close()  # waits for the two appends
    gone = NoSuchLedger("ledger 1")
    fail, failed = w.fail(gone)
    assert (fail.entry_ids, fail.error) == ((0, 1), gone)
    assert isinstance(failed, A.Failed) and failed.error is gone
    assert (w.state, w.error) == (WriterState.BROKEN, gone)
    assert w.fail(NoSuchLedger("again")) == [] and w.error is gone
    with pytest.raises(NoSuchLedger):
        w.append(b"c")


# -- closing as the writer (seed 001) --------------------------------------------------------------

def closed_writer_setup():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    w.append(b"abc")
    w.step(A.AddAcked(1, 0))
    w.step(A.AddAcked(2, 0))
    return w


def test_close_writes_closed_with_the_last_acknowledged_entry():
    w = closed_writer_setup()
    (write,) = w.close()
    assert write.metadata.state is LedgerState.CLOSED
    assert (write.metadata.last_entry, write.metadata.length, write.expected_version) == (0, 3, 0)
    (done,) = w.step(A.MetadataWritten(1))
    assert isinstance(done, A.Completed) and w.state is WriterState.CLOSED


def test_close_waits_for_outstanding_appends():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    w.append(b"a")
    assert w.close() == []
    w.step(A.AddAcked(1, 0))
    out = w.step(A.AddAcked(3, 0))
    assert out[0] == A.Acknowledge((0,)) and isinstance(out[1], A.WriteMetadata)
    assert out[1].metadata.last_entry == 0


def test_close_cas_fails_and_the_ledger_is_still_open_retry():
    m = metadata()
    op = CloseOp(m, 0, 4, 40)
    op.start()
    assert op.step(A.MetadataBadVersion()) == [A.ReadMetadata()]
    (again,) = op.step(A.MetadataRead(m, 3))
    assert again.expected_version == 3 and again.metadata.last_entry == 4


def test_close_cas_fails_and_the_ledger_is_in_recovery_error():
    m = metadata()
    op = CloseOp(m, 0, 4, 40)
    op.start()
    op.step(A.MetadataBadVersion())
    (failed,) = op.step(A.MetadataRead(m.with_state(LedgerState.IN_RECOVERY), 1))
    assert isinstance(failed.error, LedgerInRecovery)


def test_close_cas_fails_and_the_ledger_is_closed_at_our_last_entry_success():
    m = metadata()
    op = CloseOp(m, 0, 4, 40)
    op.start()
    op.step(A.MetadataBadVersion())
    (done,) = op.step(A.MetadataRead(m.closed(4, 40), 2))
    assert isinstance(done, A.Completed) and done.result.last_entry == 4


def test_close_cas_fails_and_the_ledger_is_closed_elsewhere_error():
    m = metadata()
    op = CloseOp(m, 0, 4, 40)
    op.start()
    op.step(A.MetadataBadVersion())
    (failed,) = op.step(A.MetadataRead(m.closed(5, 50), 2))
    assert isinstance(failed.error, CloseConflict)


def test_appends_beyond_the_window_wait_unsent_until_acks_make_room():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False, max_outstanding=2)
    outs = [w.append(p)[1] for p in (b"a", b"b", b"c")]
    assert [len(o) for o in outs] == [3, 3, 0]
    w.step(A.AddAcked(1, 0))
    out = w.step(A.AddAcked(2, 0))
    assert out[0] == A.Acknowledge((0,)) and sends(out[1:]) == [(1, 2), (2, 2), (3, 2)]


def test_an_overloaded_bookie_is_asked_again_not_replaced():
    w = Writer(metadata(), 0, DIGESTER, retry_ticks=2)
    w.append(b"a")
    assert w.step(A.AddFailed(2, 0, B.Overloaded("busy"))) == []
    assert w.step(A.Tick()) == []
    assert sends(w.step(A.Tick())) == [(2, 0)]
    assert w.change is None and w.ensemble_changes == 0


def test_a_quiet_writers_explicit_lac_goes_out_right_after_the_ack_not_a_tick_later():
    """Appends awaited one at a time with a pause (a tailing reader's writer): the ack that leaves the
    writer quiet asks for Idle (the application's turn, no timer), and Idle sends the explicit LAC
    at once; no Tick is involved, and ticks send nothing."""
    w = Writer(metadata(), 0, DIGESTER)
    for entry_id in range(3):
        w.append(b"x")
        assert w.step(A.AddAcked(1, entry_id)) == []
        assert w.step(A.AddAcked(2, entry_id)) == [A.Acknowledge((entry_id,)), A.RequestIdle()]
        assert w.step(A.Idle()) == [A.SendLac(b, entry_id) for b in (1, 2, 3)]
        assert w.lac_sent == entry_id
    assert w.step(A.AddAcked(3, 2)) == []   # a late ack: nothing new to tell
    assert w.step(A.Tick()) == [] and w.step(A.Idle()) == []


def test_a_tick_stands_in_for_an_idle_that_has_not_come():
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"x")
    w.step(A.AddAcked(1, 0))
    assert w.step(A.AddAcked(2, 0)) == [A.Acknowledge((0,)), A.RequestIdle()]
    assert w.step(A.Tick()) == [A.SendLac(b, 0) for b in (1, 2, 3)]
    assert w.step(A.Idle()) == [] and w.step(A.Tick()) == []


def test_an_append_made_in_the_applications_turn_carries_the_lac_instead():
    """Appends back to back: the application's next append, made before Idle, piggybacks the LAC
    (bookies count it as soon as the add arrives), so no explicit LAC message goes out."""
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"a")
    w.step(A.AddAcked(1, 0))
    assert w.step(A.AddAcked(2, 0)) == [A.Acknowledge((0,)), A.RequestIdle()]
    _, out = w.append(b"b")
    assert parse_header(out[0].data).lac == 0
    assert w.step(A.Idle()) == []
    w.step(A.AddAcked(1, 1))
    assert w.step(A.AddAcked(2, 1)) == [A.Acknowledge((1,)), A.RequestIdle()]  # quiet again: asks again
    assert w.step(A.Idle()) == [A.SendLac(b, 1) for b in (1, 2, 3)]


def test_no_explicit_lac_while_appends_are_outstanding_and_never_more_rounds_than_appends():
    """Pipelined: the LAC rides on the next add while the writer is busy; one explicit round once it
    drains. However acks and Idle events arrive, LAC rounds never outnumber appends, and at most
    one Idle is asked for at a time."""
    w = Writer(metadata(), 0, DIGESTER)
    for p in (b"a", b"b", b"c"):
        w.append(p)
    rounds = 0
    for entry_id in range(3):
        w.step(A.AddAcked(1, entry_id))
        out = w.step(A.AddAcked(2, entry_id))
        assert of(out, A.Acknowledge) == [A.Acknowledge((entry_id,))]
        assert of(out, A.RequestIdle) == ([A.RequestIdle()] if entry_id == 2 else [])  # quiet only after 2
        rounds += bool(of(w.step(A.Idle()), A.SendLac))
    assert rounds == 1 and w.lac_sent == 2
    _, out = w.append(b"d")
    assert parse_header(out[0].data).lac == 2  # piggybacked as before
    for b in (1, 2, 3):
        out = w.step(A.AddAcked(b, 3))
        assert len(of(out, A.RequestIdle)) <= 1
    for _ in range(3):
        rounds += bool(of(w.step(A.Idle()), A.SendLac))
    assert rounds == 2 <= w.next_entry


def test_no_explicit_lac_when_disabled_or_once_fenced():
    w = Writer(metadata(), 0, DIGESTER, explicit_lac=False)
    w.append(b"a")
    w.step(A.AddAcked(1, 0))
    assert w.step(A.AddAcked(2, 0)) == [A.Acknowledge((0,))]
    assert w.step(A.Idle()) == [] and w.step(A.Tick()) == []
    w = Writer(metadata(), 0, DIGESTER)
    w.append(b"a")
    w.step(A.AddAcked(1, 0))
    assert w.step(A.AddAcked(2, 0)) == [A.Acknowledge((0,)), A.RequestIdle()]
    w.append(b"b")
    w.step(A.AddFailed(3, 1, B.LedgerFenced("fenced")))
    assert w.state is WriterState.BROKEN and w.step(A.Idle()) == []


@settings(max_examples=200, deadline=None)
@given(data=st.data(), ensemble=st.sampled_from([((1, 2, 3), 3, 2), ((1, 2, 3), 3, 3), ((1, 2, 3, 4), 3, 2),
                                                  ((1, 2, 3, 4, 5), 2, 2)]))
def test_a_run_of_acks_in_one_call_is_the_same_as_one_call_per_ack(data, ensemble):
    """add_acked_many (the driver's batched hot path) against add_acked, ack by ack: the same entries
    acknowledged in the same order, the same adds sent, the same writer state after each run."""
    members, qw, qa = ensemble
    window = data.draw(st.integers(1, 6), label="max outstanding")
    one = Writer(metadata(members, qw=qw, qa=qa), 0, DIGESTER, max_outstanding=window)
    many = Writer(metadata(members, qw=qw, qa=qa), 0, DIGESTER, max_outstanding=window)
    outs: tuple[list, list] = ([], [])
    for _ in range(data.draw(st.integers(1, 12), label="rounds")):
        for _ in range(data.draw(st.integers(0, 4), label="appends")):
            for writer, out in zip((one, many), outs):
                out += writer.append(b"x")[1]
        bookie = data.draw(st.sampled_from(members + (9,)), label="bookie")  # 9: in no write quorum
        # a bookie acks only what it was sent (or what is no longer pending, or out of every quorum)
        sent = [e for e in range(one.next_entry + 2)
                if e not in one.pending or bookie in one.pending[e].sent_to or bookie not in members]
        entries = data.draw(st.lists(st.sampled_from(sent), max_size=8), label="acks")
        for entry_id in entries:
            outs[0].extend(one.add_acked(bookie, entry_id))
        outs[1].extend(many.add_acked_many(bookie, entries))
        acked = [[e for a in of(out, A.Acknowledge) for e in a.entry_ids] for out in outs]
        assert acked[0] == acked[1]
        assert sends(outs[0]) == sends(outs[1])
        assert len(of(outs[0], A.RequestIdle)) == len(of(outs[1], A.RequestIdle))
        assert (one.lac, one.length, one.state) == (many.lac, many.length, many.state)
        assert {e: a.acks for e, a in one.pending.items()} == {e: a.acks for e, a in many.pending.items()}
