"""The named logs' pure parts (stream/): positions, record sets, segment and log metadata, and the
operations on the segment list, with their codecs fuzzed (anyone with metastore access can write
a log's znodes; an entry of a segment could come from any ledger writer)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, strategies as st

from stream.errors import CorruptMetadata, CorruptRecordSet, PositionTruncated, RecordTooLarge, TxidOutOfOrder
from stream.log_metadata import LogMetadata, LogPaths, LogSettings, check_name
from stream.position import HEAD, Position
from stream.record_set import HEAD_BYTES, RECORD_OVERHEAD, RecordSetBuilder, decode
from stream.segment import Segment, SegmentState
from stream.segment_list import SegmentList

FUZZ = dict(max_examples=300, deadline=None)


def test_positions_order_by_segment_entry_and_slot_and_read_back():
    assert HEAD < Position(1, 0, 0) < Position(1, 0, 1) < Position(1, 1, 0) < Position(2, 0, 0)
    assert Position.parse(str(Position(3, 14, 15))) == Position(3, 14, 15)
    for bad in ("1:2", "a:b:c", "1:2:3:4", "-1:0:0", "1:2:٣"):
        with pytest.raises(ValueError, match="segment:entry:slot"):
            Position.parse(bad)
    with pytest.raises(ValueError):
        Position(1, -1, 0)


records = st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=40)), min_size=1, max_size=20)


@given(records, st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_a_record_set_reads_back_exactly(pairs, before, bytes_before):
    builder = RecordSetBuilder(1 << 20)
    txid = 0
    for gap, payload in pairs:
        txid += gap + 1
        builder.add(txid, payload)
    got = decode(builder.encode(before, bytes_before))
    assert got.payloads == [p for _, p in pairs] and got.count == len(pairs)
    assert (got.records_before, got.bytes_before) == (before, bytes_before)
    assert got.txids == sorted(set(got.txids)) and got.txids[-1] == txid == builder.last_txid
    assert builder.first_txid == got.txids[0]


def test_the_builder_keeps_txids_increasing_and_sets_bounded():
    builder = RecordSetBuilder(HEAD_BYTES + 2 * RECORD_OVERHEAD + 10, last_txid=5)
    with pytest.raises(TxidOutOfOrder, match="greater"):
        builder.add(5, b"x")
    with pytest.raises(RecordTooLarge, match="max_entry_bytes"):
        builder.add(6, b"x" * 11 + bytes(RECORD_OVERHEAD))
    assert builder.add(6, b"12345") == 0 and builder.fits(5) and not builder.fits(6)
    with pytest.raises(ValueError, match="full"):
        builder.add(7, b"123456")
    with pytest.raises(ValueError, match="empty"):
        RecordSetBuilder(100).encode(0, 0)


SAMPLE = RecordSetBuilder(1 << 10)
SAMPLE.add(7, b"seven")
SAMPLE.add(9, b"")
SAMPLE_BYTES = SAMPLE.encode(3, 30)


def test_every_prefix_and_extension_of_a_record_set_is_refused():
    for end in range(len(SAMPLE_BYTES)):
        with pytest.raises(CorruptRecordSet):
            decode(SAMPLE_BYTES[:end])
    with pytest.raises(CorruptRecordSet, match="after"):
        decode(SAMPLE_BYTES + b"\0")


def test_a_record_set_with_txids_out_of_order_or_out_of_range_is_refused():
    head = struct.pack(">BIQQ", 1, 3, 0, 0)
    def records(*txids):
        return head + b"".join(struct.pack(">QI", t, 1) + b"x" for t in txids)
    assert decode(records(1, 2, 3)).txids == [1, 2, 3]
    with pytest.raises(CorruptRecordSet, match="transaction id 2 after 2"):
        decode(records(1, 2, 2))
    with pytest.raises(CorruptRecordSet, match="transaction id 1 after 5"):
        decode(records(5, 1, 9))
    with pytest.raises(CorruptRecordSet, match="out of range"):
        decode(records(1, 2, 1 << 63))


@given(st.data())
def test_record_set_mutations_are_refused_or_read_consistently(data):
    raw = bytearray(SAMPLE_BYTES)
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        got = decode(bytes(raw))
    except CorruptRecordSet:
        return
    builder = RecordSetBuilder(1 << 10)
    for txid, payload in zip(got.txids, got.payloads):
        builder.add(txid, payload)
    assert builder.encode(got.records_before, got.bytes_before) == bytes(raw)


@given(st.binary(max_size=200))
def test_random_bytes_are_no_record_set(data):
    try:
        decode(data)
    except CorruptRecordSet:
        pass


def segment(seq, state=SegmentState.COMPLETED, **totals) -> Segment:
    s = Segment(seq, 100 + seq, SegmentState.IN_PROGRESS, 1000 * seq)
    if state is SegmentState.COMPLETED:
        s = s.complete(first_txid=totals.get("first", 10 * seq), last_txid=totals.get("last", 10 * seq + 9),
                       last_entry=totals.get("entry", 4), last_slot=totals.get("slot", 1),
                       records=totals.get("records", 10), size=totals.get("size", 100), now_ms=1000 * seq + 500)
    return s


def test_segment_and_log_metadata_read_back():
    for s in (segment(1), segment(2, SegmentState.IN_PROGRESS), segment(3, records=0, first=-1, last=-1, entry=-1,
                                                                         slot=-1, size=0)):
        assert Segment.decode(s.encode()) == s
    log = LogMetadata(5, LogSettings(retention_ms=7), epoch=3, next_segment=9, truncated_before=Position(2, 1, 0))
    assert LogMetadata.decode(log.encode()) == log


def test_metadata_that_does_not_add_up_is_refused_with_the_field_named():
    good = json.loads(segment(1).encode())
    for change, match in [({"state": "open"}, "state"), ({"records": -1}, "records"), ({"seq": 0}, "seq"),
                          ({"records": 0}, "totals"), ({"extra": 1}, "unknown"), ({"ledger_id": True}, "ledger_id")]:
        with pytest.raises(CorruptMetadata, match=match):
            Segment.decode(json.dumps({**good, **change}).encode())
    in_progress = json.loads(segment(2, SegmentState.IN_PROGRESS).encode())
    with pytest.raises(CorruptMetadata, match="no totals"):
        Segment.decode(json.dumps({**in_progress, "records": 3}).encode())
    log = json.loads(LogMetadata(5, LogSettings()).encode())
    for change, match in [({"version": 2}, "version"), ({"truncated_before": "x"}, "position"),
                          ({"ack_quorum": 4}, "ack_quorum"), ({"max_entry_bytes": 1 << 30}, "max_entry_bytes")]:
        with pytest.raises(CorruptMetadata, match=match):
            LogMetadata.decode(json.dumps({**log, **change}).encode())
    for junk in (b"", b"[]", b"\xff", b"{" * 100_000, b"1" * 70_000):
        with pytest.raises(CorruptMetadata):
            LogMetadata.decode(junk)


@given(st.dictionaries(st.sampled_from(sorted(json.loads(segment(1).encode()))),
                       st.one_of(st.integers(-2, 1 << 64), st.text(max_size=5), st.none(), st.booleans()), max_size=11))
def test_any_segment_json_is_refused_or_consistent(fields):
    try:
        s = Segment.decode(json.dumps(fields).encode())
    except CorruptMetadata:
        return
    assert Segment.decode(s.encode()) == s


def test_names_are_checked():
    assert LogPaths("/streams", "orders").segment(7) == "/streams/orders/segments/0000000007"
    for bad in ("", ".", "..", "-x", "a/b", "a" * 201, "é"):
        with pytest.raises(ValueError, match="name"):
            check_name(bad)
    assert LogPaths.seq_of("0000000007") == 7 and LogPaths.seq_of("7") is None and LogPaths.seq_of("000000000x") is None


def listing(*segments: Segment, next_segment=None, truncated=HEAD, **settings) -> SegmentList:
    log = LogMetadata(0, LogSettings(**settings), next_segment=next_segment or (segments[-1].seq + 1 if segments else 1),
                      truncated_before=truncated)
    return SegmentList(log, 4, segments, {s.seq: 2 for s in segments})


def test_a_takeover_completes_the_last_owners_segment_and_starts_its_own_in_one_change():
    before = listing(segment(1), segment(2, SegmentState.IN_PROGRESS))
    after = before.take_over().completed(2, first_txid=20, last_txid=29, last_entry=3, last_slot=0, records=5, size=9,
                                         now_ms=7)
    after, started = after.started(555, 8)
    assert started == Segment(3, 555, SegmentState.IN_PROGRESS, 8) and after.in_progress == started
    change = before.change_to(after)
    assert change.log_version == 4 and change.log.epoch == 1 and change.log.next_segment == 4
    assert [(s.seq, v) for s, v in change.put] == [(2, 2), (3, None)] and change.delete == ()
    applied = before.applied(change)
    assert applied == SegmentList(after.log, 5, after.segments, {1: 2, 2: 3, 3: 0})
    with pytest.raises(ValueError, match="in progress"):
        after.started(556, 9)
    with pytest.raises(ValueError, match="not the log's in-progress"):
        before.completed(1, first_txid=1, last_txid=1, last_entry=0, last_slot=0, records=1, size=1, now_ms=1)


def test_a_list_that_breaks_its_rules_is_refused():
    with pytest.raises(CorruptMetadata, match="only a log's last"):
        listing(segment(1, SegmentState.IN_PROGRESS), segment(2))
    with pytest.raises(CorruptMetadata, match="next segment"):
        listing(segment(1), next_segment=1)
    with pytest.raises(CorruptMetadata, match="distinct"):
        listing(segment(2), segment(1), next_segment=3)


def test_truncation_deletes_whole_segments_hides_the_rest_and_never_goes_back():
    before = listing(segment(1), segment(2), segment(3, SegmentState.IN_PROGRESS))
    after = before.truncated(Position(2, 1, 0))
    assert [s.seq for s in after.segments] == [2, 3] and after.log.truncated_before == Position(2, 1, 0)
    assert [s.seq for s, _ in before.change_to(after).delete] == [1]
    assert after.truncated(Position(1, 0, 0)) == after  # never back
    with pytest.raises(PositionTruncated, match="head"):
        after.first_readable(Position(2, 0, 5))
    with pytest.raises(ValueError, match="past the last completed"):
        before.truncated(Position(2, 4, 3))
    assert before.truncated(Position(2, 4, 2)).log.truncated_before == Position(2, 4, 2)
    whole = before.truncated(Position(3, 0, 0))  # after every completed record: segments 1 and 2 go
    assert [s.seq for s in whole.segments] == [3] and whole.log.truncated_before == Position(3, 0, 0)
    with pytest.raises(ValueError, match="past the last completed"):
        before.truncated(Position(3, 0, 1))


def test_retention_by_age_and_by_size_names_the_first_segment_kept():
    segments = (segment(1, size=100), segment(2, size=100), segment(3, size=100), segment(4, SegmentState.IN_PROGRESS))
    assert listing(*segments).retention_point(10_000) is None
    assert listing(*segments, retention_ms=1000).retention_point(3000) == Position(2, 0, 0)  # completed at 1.5 s
    assert listing(*segments, retention_ms=1000).retention_point(3600) == Position(3, 0, 0)  # and 2.5 s
    assert listing(*segments, retention_bytes=150).retention_point(0) == Position(3, 0, 0)
    assert listing(*segments, retention_bytes=300).retention_point(0) is None


def test_a_txid_is_found_by_the_segments_ranges():
    lst = listing(segment(1), segment(2), segment(3, SegmentState.IN_PROGRESS))
    assert lst.segment_for_txid(0).seq == 1 and lst.segment_for_txid(19).seq == 1 and lst.segment_for_txid(20).seq == 2
    assert lst.segment_for_txid(25).seq == 2 and lst.segment_for_txid(30).seq == 3
    assert listing(segment(1)).segment_for_txid(99) is None


@given(st.dictionaries(st.sampled_from(sorted(json.loads(LogMetadata(1, LogSettings()).encode()))),
                       st.one_of(st.integers(-2, 1 << 64), st.text(max_size=12), st.none(), st.booleans()), max_size=13))
def test_any_log_metadata_json_is_refused_or_consistent(fields):
    try:
        log = LogMetadata.decode(json.dumps(fields).encode())
    except CorruptMetadata:
        return
    assert LogMetadata.decode(log.encode()) == log
