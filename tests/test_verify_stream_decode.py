"""The log verifier's checks (replay/verify_stream_decode.py) on hand-made logs: a consistent one
passes, and each kind of damage is a violation of the check named for it."""

from __future__ import annotations

from dataclasses import replace

from bookie.entry import DigestType
from ledger.metadata import Fragment, LedgerMetadata
from replay.verify_stream_decode import (RECORDS, SEGMENTS, SUBSCRIPTIONS, TRUNCATION, EntrySummary, LogFindings,
                                         LogView, check_log, summarize)
from stream.log_metadata import LogMetadata, LogSettings
from stream.position import Position
from stream.record_set import RecordSetBuilder
from stream.segment import Segment, SegmentState


def _log(truncated=Position(0, 0, 0), subscriptions=None):
    """Segment 1 (ledger 10): entries of 2 and 3 records, txids 0..4; segment 2 (ledger 11), in
    progress: one entry of 1 record acknowledged (LAC 0), txid 5."""
    s1 = Segment(1, 10, SegmentState.IN_PROGRESS, 1).complete(first_txid=0, last_txid=4, last_entry=1, last_slot=2,
                                                             records=5, size=50, now_ms=2)
    s2 = Segment(2, 11, SegmentState.IN_PROGRESS, 3)
    view = LogView("orders", LogMetadata(0, LogSettings(), epoch=2, next_segment=3, truncated_before=truncated),
                   [s1, s2], subscriptions or {})
    summaries = {(10, 0): EntrySummary(0, 2, 0, 1, 0, 20, True), (10, 1): EntrySummary(2, 3, 2, 4, 20, 30, True),
                 (11, 0): EntrySummary(0, 1, 5, 5, 0, 10, True)}
    return view, summaries, {10: 0, 11: 0}


def ledger(ledger_id: int, last_entry: int | None) -> LedgerMetadata:
    m = LedgerMetadata(ledger_id, 3, 3, 2, (Fragment(0, (1, 2, 3)),), DigestType.CRC32C, b"", 0)
    return m if last_entry is None else m.closed(last_entry, 50)


def findings(view, summaries, lacs, ledgers=None) -> dict[str, list[str]]:
    found = LogFindings()
    check_log(view, summaries, lacs, {10: ledger(10, 1), 11: ledger(11, None)} if ledgers is None else ledgers,
              found)
    return {k: v for k, v in found.violations.items() if v}


def test_a_consistent_log_passes():
    view, summaries, lacs = _log(Position(1, 1, 0), {"billing": Position(2, 0, 0)})
    assert findings(view, summaries, lacs) == {}


def test_each_kind_of_damage_is_caught_by_its_check():
    view, summaries, lacs = _log()
    assert set(findings(view, {k: v for k, v in summaries.items() if k != (10, 1)}, lacs)) == {RECORDS}
    assert set(findings(view, summaries | {(10, 1): replace(summaries[(10, 1)], records_before=1)}, lacs)) == {RECORDS}
    assert set(findings(view, summaries | {(11, 0): replace(summaries[(11, 0)], first_txid=4, last_txid=4)},
                        lacs)) == {RECORDS}
    two_on_one = replace(view, segments=[view.segments[0], replace(view.segments[1], ledger_id=10)])
    assert SEGMENTS in findings(two_on_one, summaries, lacs)
    assert set(findings(_log(Position(2, 5, 0))[0], summaries, lacs)) == {TRUNCATION}  # past the last record
    assert set(findings(_log(Position(2, 0, 0))[0], summaries, lacs)) == {TRUNCATION}  # segment 1 should be gone
    assert set(findings(_log(subscriptions={"b": Position(2, 3, 0)})[0], summaries, lacs)) == {SUBSCRIPTIONS}
    assert set(findings(view, summaries, lacs, {10: ledger(10, 2), 11: ledger(11, None)})) == {SEGMENTS}  # closed elsewhere
    assert set(findings(view, summaries, lacs, {11: ledger(11, None)})) == {SEGMENTS}  # its ledger is gone


def test_a_payload_summarizes_its_record_set_and_anything_else_is_none():
    builder = RecordSetBuilder(1 << 10, 6)
    for txid in (7, 8):
        builder.add(txid, b"x" * 5)
    payload = builder.encode(4, 40)
    assert summarize(payload) == EntrySummary(4, 2, 7, 8, 40, 10, True)
    assert summarize(payload[:-1]) is None and summarize(b"short") is None
