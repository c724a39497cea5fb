"""The recovery operation (ledger/recovery_op.py), event by event, and seed 000's example exactly."""

from __future__ import annotations

from bookie import errors as B
from bookie.entry import NO_ENTRY, Digester, DigestType, password_key
from ledger import actions as A
from ledger.errors import WrongPassword
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from ledger.recovery_op import Phase, RecoveryOp

DIGESTER = Digester(DigestType.CRC32C, b"pw")
LID = 7


def metadata(fragments=((0, (1, 2, 3)),), qw=3, qa=2) -> LedgerMetadata:
    frags = tuple(Fragment(first, ens) for first, ens in fragments)
    return LedgerMetadata(LID, len(frags[0].ensemble), qw, qa, frags, DigestType.CRC32C,
                          password_key(b"pw", b"check"), 0)


def entry(entry_id: int, lac: int, payload: bytes = b"p") -> bytes:
    return DIGESTER.package(LID, entry_id, lac, 10 * (entry_id + 1), payload)


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def marked(op: RecoveryOp) -> list:
    (write,) = op.start()
    assert isinstance(write, A.WriteMetadata) and write.metadata.state is LedgerState.IN_RECOVERY
    return op.step(A.MetadataWritten(write.expected_version + 1))


def test_seed_000_recovery_example():
    """Seed 000: three bookies report LAC 9, 10 and 11; the highest, 11, is where reading starts. Entry 12
    is on bookies 1 and 3, entry 13 on none: the ledger closes at 12."""
    op = RecoveryOp(metadata(), 0, DIGESTER, read_window=1)
    fences = marked(op)
    assert fences == [A.SendFence(1), A.SendFence(2), A.SendFence(3)]
    assert op.step(A.FenceAnswered(3, 11)) == []
    reads = op.step(A.FenceAnswered(2, 10))          # (Qw - Qa) + 1 = 2 of the one write quorum: fenced
    assert op.lac == 11 and op.start_entry == 12
    # Reads fence the bookies that have not confirmed a fence yet (#2614): here bookie 1.
    assert reads == [A.SendRead(1, 12, fence=True), A.SendRead(2, 12, fence=False), A.SendRead(3, 12, fence=False)]
    assert op.step(A.FenceAnswered(1, 9)) == []      # late: changes nothing
    twelve = entry(12, 11)
    readds = op.step(A.ReadAnswered(1, 12, twelve))
    assert readds == [A.SendAdd(b, 12, twelve, recovery=True) for b in (1, 2, 3)]  # its whole write quorum
    assert op.step(A.ReadAnswered(3, 12, twelve)) == []
    assert op.step(A.ReadFailed(2, 12, B.NoSuchEntry("no"))) == []
    assert op.step(A.AddAcked(1, 12)) == []
    reads = op.step(A.AddAcked(2, 12))               # Qa copies of 12 again: read on
    assert sorted(reads, key=str) == [A.SendRead(b, 13, fence=False) for b in (1, 2, 3)]  # all fenced now
    assert op.step(A.ReadFailed(1, 13, B.NoSuchEntry("no"))) == []
    (close,) = op.step(A.ReadFailed(3, 13, B.NoSuchEntry("no")))
    assert close.metadata.state is LedgerState.CLOSED
    assert (close.metadata.last_entry, close.metadata.length) == (12, 130)
    (done,) = op.step(A.MetadataWritten(close.expected_version + 1))
    assert done == A.Completed(close.metadata) and op.phase is Phase.DONE


def test_seed_000_example_in_another_answer_order_closes_at_12_too():
    op = RecoveryOp(metadata(), 0, DIGESTER, read_window=16)
    marked(op)
    op.step(A.FenceAnswered(1, 9))
    reads = op.step(A.FenceAnswered(2, 10))
    assert op.start_entry == 11 and {a.entry_id for a in reads} == set(range(11, 27))
    op.step(A.ReadAnswered(2, 11, entry(11, 10)))
    op.step(A.ReadAnswered(3, 12, entry(12, 11)))
    for e in range(13, 27):
        for b in (1, 2):
            op.step(A.ReadFailed(b, e, B.NoSuchEntry("no")))
    for e in (11, 12):
        op.step(A.AddAcked(1, e))
    out = op.step(A.AddAcked(3, 12)) + op.step(A.AddAcked(3, 11))
    (close,) = of(out, A.WriteMetadata)
    assert close.metadata.last_entry == 12


def test_a_timeout_is_never_absence_2281_3405():
    op = RecoveryOp(metadata(), 0, DIGESTER, read_window=1, retry_ticks=1)
    marked(op)
    op.step(A.FenceAnswered(1, NO_ENTRY))
    op.step(A.FenceAnswered(3, NO_ENTRY))
    assert op.step(A.ReadFailed(1, 0, B.NoSuchEntry("no"))) == []
    assert op.step(A.ReadFailed(2, 0, B.BookieUnavailable("timeout"))) == []
    assert op.step(A.ReadFailed(3, 0, B.BookieUnavailable("timeout"))) == []
    assert op.end is None                       # one explicit "no" of the two needed: unknown
    retry = op.step(A.Tick())
    assert retry == [A.SendRead(2, 0, fence=True), A.SendRead(3, 0, fence=False)]  # 3 confirmed its fence
    (close,) = op.step(A.ReadFailed(3, 0, B.NoSuchLedger("no")))
    assert close.metadata.last_entry == NO_ENTRY and close.metadata.length == 0


def test_a_corrupt_copy_is_unknown_and_a_good_copy_elsewhere_wins():
    op = RecoveryOp(metadata(), 0, DIGESTER, read_window=1)
    marked(op)
    op.step(A.FenceAnswered(1, NO_ENTRY))
    op.step(A.FenceAnswered(2, NO_ENTRY))
    bad = bytearray(entry(0, NO_ENTRY))
    bad[-1] ^= 1
    assert op.step(A.ReadAnswered(1, 0, bytes(bad))) == []
    assert op.step(A.ReadFailed(2, 0, B.NoSuchEntry("no"))) == []
    assert op.end is None
    readds = op.step(A.ReadAnswered(3, 0, entry(0, NO_ENTRY)))
    assert len(of(readds, A.SendAdd)) == 3


def test_recovery_starts_at_the_last_fragments_first_entry_2615():
    """Fragments at 0 (bookies 1 2 3) and 10 (1 2 4); the bookies' LACs say 3. Entries 0..9 were all
    acknowledged (the fragment at 10 starts at the first unacknowledged entry): nothing below 10 is read
    again or re-added, and reads go to the last ensemble only."""
    op = RecoveryOp(metadata(((0, (1, 2, 3)), (10, (1, 2, 4)))), 0, DIGESTER, read_window=1)
    assert marked(op) == [A.SendFence(1), A.SendFence(2), A.SendFence(4)]
    op.step(A.FenceAnswered(1, 3))
    reads = op.step(A.FenceAnswered(4, 3))
    assert op.start_entry == 10
    assert sorted(reads, key=str) == [A.SendRead(1, 10), A.SendRead(2, 10, fence=True), A.SendRead(4, 10)]
    op.step(A.ReadFailed(1, 10, B.NoSuchEntry("no")))
    probe = op.step(A.ReadFailed(4, 10, B.NoSuchEntry("no")))
    # Nothing at 10: the ledger ends at 9, whose length is read from its own fragment, without fencing.
    assert sorted(probe, key=str) == [A.SendRead(b, 9) for b in (1, 2, 3)]
    (close,) = op.step(A.ReadAnswered(2, 9, entry(9, 8)))
    assert (close.metadata.last_entry, close.metadata.length) == (9, 100)
    assert close.metadata.fragments == (Fragment(0, (1, 2, 3)),)   # the empty fragment at 10 is dropped


def test_marking_a_ledger_already_in_recovery_goes_straight_to_fencing():
    m = metadata().with_state(LedgerState.IN_RECOVERY)
    op = RecoveryOp(m, 5, DIGESTER)
    assert op.start() == [A.SendFence(1), A.SendFence(2), A.SendFence(3)]


def test_marking_loses_to_an_ensemble_change_marks_again_and_fences_the_new_ensemble():
    m = metadata()
    op = RecoveryOp(m, 0, DIGESTER)
    op.start()
    assert op.step(A.MetadataBadVersion()) == [A.ReadMetadata()]
    changed = m.with_fragment(4, (1, 2, 5))
    (write,) = op.step(A.MetadataRead(changed, 1))
    assert write.expected_version == 1 and write.metadata.last_fragment.ensemble == (1, 2, 5)
    assert op.step(A.MetadataWritten(2)) == [A.SendFence(1), A.SendFence(2), A.SendFence(5)]


def test_recoverers_converge_on_the_first_close():
    m = metadata()
    op = RecoveryOp(m.with_state(LedgerState.IN_RECOVERY), 1, DIGESTER, read_window=1)
    op.start()
    op.step(A.FenceAnswered(1, NO_ENTRY))
    op.step(A.FenceAnswered(2, NO_ENTRY))
    op.step(A.ReadFailed(1, 0, B.NoSuchEntry("no")))
    (close,) = op.step(A.ReadFailed(2, 0, B.NoSuchEntry("no")))
    assert close.metadata.last_entry == NO_ENTRY
    assert op.step(A.MetadataBadVersion()) == [A.ReadMetadata()]
    theirs = m.closed(0, 10)   # another recoverer found entry 0 and closed first
    assert op.step(A.MetadataRead(theirs, 3)) == [A.Completed(theirs)]


def test_a_closed_ledger_needs_no_recovery():
    m = metadata().closed(4, 50)
    assert RecoveryOp(m, 3, DIGESTER).start() == [A.Completed(m)]


def test_wrong_password_fails_recovery():
    op = RecoveryOp(metadata(), 0, DIGESTER)
    marked(op)
    (failed,) = op.step(A.FenceFailed(1, B.Unauthorized("key")))
    assert isinstance(failed.error, WrongPassword)


def test_lost_fences_are_sent_again_until_covered():
    op = RecoveryOp(metadata(), 0, DIGESTER, retry_ticks=2)
    marked(op)
    op.step(A.FenceFailed(1, B.BookieUnavailable("lost")))
    op.step(A.FenceFailed(2, B.NoSuchLedger("not a fence")))
    op.step(A.FenceAnswered(3, 4))
    assert op.step(A.Tick()) == []
    assert op.step(A.Tick()) == [A.SendFence(1), A.SendFence(2)]
    assert op.phase is Phase.FENCING
    op.step(A.FenceAnswered(2, 2))
    assert op.phase is Phase.READING and op.start_entry == 5
