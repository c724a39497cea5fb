"""The read operations (ledger/read_op.py), event by event."""

from __future__ import annotations

from bookie import errors as B
from bookie.entry import Digester, DigestType, password_key
from ledger import actions as A
from ledger.errors import EntryNotAvailable
from ledger.metadata import Fragment, LedgerMetadata
from ledger.read_op import LongPollOp, ReadEntryOp, ReadLacOp

DIGESTER = Digester(DigestType.CRC32C, b"pw")
LID = 7


def metadata(ensemble=(1, 2, 3, 4), qw=3, qa=2) -> LedgerMetadata:
    return LedgerMetadata(LID, len(ensemble), qw, qa, (Fragment(0, tuple(ensemble)),), DigestType.CRC32C,
                          password_key(b"pw", b"check"), 0)


def entry(entry_id: int, payload: bytes = b"p") -> bytes:
    return DIGESTER.package(LID, entry_id, entry_id - 1, 10, payload)


def test_read_asks_replicas_in_write_set_order_and_moves_on_at_once_after_a_bad_answer():
    op = ReadEntryOp(metadata(), 1, DIGESTER)          # entry 1 lives on bookies 2 3 4
    assert op.start() == [A.SendRead(2, 1)]
    assert op.step(A.ReadFailed(2, 1, B.NoSuchEntry("no"))) == [A.SendRead(3, 1)]
    assert op.step(A.ReadAnswered(3, 1, entry(2))) == [A.SendRead(4, 1)]        # another entry's bytes
    (done,) = op.step(A.ReadAnswered(4, 1, entry(1, b"one")))
    assert done.result.payload == b"one"


def test_speculative_read_after_the_timeout_and_the_first_good_answer_wins():
    op = ReadEntryOp(metadata(), 0, DIGESTER, speculative_ticks=2)
    op.start()
    assert op.step(A.Tick()) == []
    assert op.step(A.Tick()) == [A.SendRead(2, 0)]
    (done,) = op.step(A.ReadAnswered(1, 0, entry(0)))   # the slow first replica answers after all
    assert isinstance(done, A.Completed)
    assert op.step(A.ReadAnswered(2, 0, entry(0))) == []


def test_every_replica_failing_is_entry_not_available():
    op = ReadEntryOp(metadata(), 0, DIGESTER)
    op.start()
    op.step(A.ReadFailed(1, 0, B.BookieUnavailable("down")))
    op.step(A.ReadFailed(2, 0, B.NoSuchEntry("no")))
    (failed,) = op.step(A.ReadFailed(3, 0, B.NoSuchEntry("no")))
    assert isinstance(failed.error, EntryNotAvailable)


def test_read_lac_takes_the_highest_answer_once_the_answers_cover_the_ensemble():
    op = ReadLacOp(metadata())                          # E=4 Qw=3 Qa=2: 2 of each write quorum
    assert op.start() == [A.SendReadLac(b) for b in (1, 2, 3, 4)]
    assert op.step(A.LacAnswered(1, 5)) == []
    assert op.step(A.LacAnswered(2, 9)) == []
    assert op.step(A.LacFailed(4, B.BookieUnavailable("down"))) == []
    assert op.step(A.LacAnswered(3, 7)) == [A.Completed(9)]


def test_read_lac_with_every_bookie_failing_fails():
    op = ReadLacOp(metadata((1, 2, 3)))
    op.start()
    for b in (1, 2):
        op.step(A.LacFailed(b, B.NoSuchLedger("no")))
    (failed,) = op.step(A.LacFailed(3, B.BookieUnavailable("down")))
    assert isinstance(failed, A.Failed)


def test_long_poll_moves_to_the_next_replica_on_failure_and_returns_lac_and_entry():
    op = LongPollOp(metadata(), 5, 4, DIGESTER)        # entry 5 lives on bookies 2 3 4
    assert op.start() == [A.SendLongPoll(2, 5, 4)]
    assert op.step(A.LongPollFailed(2, B.BookieUnavailable("down"))) == [A.SendLongPoll(3, 5, 4)]
    (done,) = op.step(A.LongPollAnswered(3, 5, entry(5, b"five")))
    lac, got = done.result
    assert lac == 5 and got.payload == b"five"


def test_long_poll_timeout_answers_with_the_unchanged_lac():
    op = LongPollOp(metadata(), 5, 4, DIGESTER, first_replica=1)
    assert op.start() == [A.SendLongPoll(3, 5, 4)]
    assert op.step(A.LongPollAnswered(3, 4, None)) == [A.Completed((4, None))]
