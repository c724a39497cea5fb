"""Every decoder of the bookie's on-disk records under hypothesis: journal records, entry log
records, file headers, the checkpoint file and the cookie.

Round trips give back what was encoded; truncated, mutated, oversized or random bytes give
a typed StorageError (or None for a file header), never another exception, a hang or a huge
allocation.
"""

from __future__ import annotations

import os
import struct
import tracemalloc

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie.checkpoint import HEADER_BYTES as CHECKPOINT_HEADER_BYTES
from bookie.checkpoint import Checkpoint, CheckpointCorrupt, decode_checkpoint, encode_checkpoint
from bookie.cookie import Cookie, CookieCorrupt, decode_cookie, encode_cookie
from bookie.errors import StorageError
from bookie.index import Index, Location
from bookie.storage_codec import (ENTRY_LOG_MAGIC, FILE_HEADER_BYTES, JOURNAL_MAGIC, CorruptRecord, JournalRecord,
                                  Kind, TornRecord, decode_entry_record, decode_file_header, decode_journal_record,
                                  encode_entry_record, encode_file_header, encode_journal_record, scan_entry_log,
                                  scan_journal)

SOAK = os.environ.get("QUIRE_SOAK") == "1"
FUZZ = settings(max_examples=3000 if SOAK else 200, derandomize=not SOAK, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
u63 = st.integers(min_value=0, max_value=2**63 - 1)
lacs = st.integers(min_value=-1, max_value=2**63 - 1)
blobs = st.binary(min_size=1, max_size=200)

journal_records = st.one_of(
    st.builds(JournalRecord, st.just(Kind.ADD), u63, u63, blobs),
    st.builds(JournalRecord, st.just(Kind.KEY), u63, st.just(0), st.binary(min_size=32, max_size=32)),
    st.builds(JournalRecord, st.just(Kind.FENCE), u63),
    st.builds(JournalRecord, st.just(Kind.LAC), u63, lacs),
    st.builds(JournalRecord, st.just(Kind.DELETE), u63),
)


def _decodes_or_typed_error(decode, data: bytes) -> None:
    try:
        decode(data)
    except StorageError:
        pass


# --- journal records ----------------------------------------------------------------------


@FUZZ
@given(st.lists(journal_records, max_size=8))
def test_journal_records_round_trip_and_scan(records):
    buf = b"".join(encode_journal_record(r) for r in records)
    scan = scan_journal(buf)
    assert scan.records == records and scan.end == len(buf) and scan.stop is None


@FUZZ
@given(st.lists(journal_records, max_size=8), st.integers(min_value=1, max_value=5000),
       st.binary(max_size=64))
def test_zero_fill_after_the_records_is_a_clean_end_and_anything_after_it_is_not(records, zeros, tail):
    body = b"".join(encode_journal_record(r) for r in records)
    scan = scan_journal(body + bytes(zeros))
    assert (scan.records, scan.end, scan.stop, scan.zero_fill) == (records, len(body), None, True)
    if tail.strip(b"\0"):
        scan = scan_journal(body + bytes(zeros) + tail)
        assert scan.records == records and scan.end == len(body)
        assert isinstance(scan.stop, (TornRecord, CorruptRecord)) and not scan.zero_fill


@FUZZ
@given(journal_records, st.data())
def test_every_prefix_of_a_journal_record_is_torn(record, data):
    raw = encode_journal_record(record)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(TornRecord):
        decode_journal_record(raw[:cut])


@FUZZ
@given(journal_records, st.data())
def test_a_mutated_journal_record_is_refused_or_still_a_record(record, data):
    raw = bytearray(encode_journal_record(record))
    position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    try:
        decode_journal_record(bytes(raw))
    except (TornRecord, CorruptRecord):
        return
    # A flip in the length field can only "succeed" by naming a shorter, still checksummed body:
    # with CRC-32C over the body, a single-byte change of the body is always caught.
    assert position < 4


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_never_break_the_journal_scanner(data):
    scan = scan_journal(data)
    assert 0 <= scan.end <= len(data)
    _decodes_or_typed_error(decode_journal_record, data)


def test_an_oversized_journal_length_is_corrupt_without_allocating():
    raw = struct.pack(">II", 0xFFFFFFFF, 0) + b"x" * 64
    tracemalloc.start()
    try:
        decode_journal_record(raw)
    except CorruptRecord:
        pass
    else:
        raise AssertionError("accepted")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_checksummed_body_of_an_unknown_kind_or_wrong_size_is_corrupt():
    for body in (struct.pack(">BQ", 99, 1), struct.pack(">BQ", Kind.LAC, 1) + b"\x00" * 3,
                 struct.pack(">BQ", Kind.ADD, 1) + b"\x01"):
        raw = struct.pack(">II", len(body), crc32c(body)) + body
        try:
            decode_journal_record(raw)
        except CorruptRecord:
            continue
        raise AssertionError(body)


# --- entry log records and file headers --------------------------------------------------------


@FUZZ
@given(st.lists(st.tuples(u63, u63, blobs), max_size=6))
def test_entry_records_round_trip_and_scan(items):
    buf = encode_file_header(ENTRY_LOG_MAGIC, 7) + b"".join(encode_entry_record(*item) for item in items)
    found, end, stop = scan_entry_log(buf)
    assert stop is None and end == len(buf)
    assert [(lg, e, n) for lg, e, _, n in found] == [(lg, e, len(d)) for lg, e, d in items]
    for (lg, e, data), (_, _, offset, _) in zip(items, found):
        assert decode_entry_record(buf, offset)[:3] == (lg, e, data)


@FUZZ
@given(st.tuples(u63, u63, blobs), st.data())
def test_damaged_entry_records_are_typed_errors(item, data):
    raw = bytearray(encode_entry_record(*item))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(min_value=0, max_value=len(raw) - 1))]
        expected: type = TornRecord
    else:
        position = data.draw(st.integers(min_value=4, max_value=len(raw) - 1))  # past the length field
        raw[position] ^= data.draw(st.integers(min_value=1, max_value=255))
        expected = CorruptRecord
    with pytest.raises(expected):
        decode_entry_record(bytes(raw))


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_never_break_the_entry_log_scanner_or_headers(data):
    found, end, _ = scan_entry_log(data, 0)
    assert 0 <= end <= len(data)
    _decodes_or_typed_error(decode_entry_record, data)
    header = decode_file_header(data, JOURNAL_MAGIC)
    assert header is None or (len(data) >= FILE_HEADER_BYTES and isinstance(header, int))


@FUZZ
@given(st.integers(min_value=0, max_value=2**64 - 1), st.data())
def test_file_headers_round_trip_and_any_damage_is_none(number, data):
    raw = bytearray(encode_file_header(JOURNAL_MAGIC, number))
    assert decode_file_header(bytes(raw), JOURNAL_MAGIC) == number
    assert decode_file_header(bytes(raw), ENTRY_LOG_MAGIC) is None
    position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    assert decode_file_header(bytes(raw), JOURNAL_MAGIC) is None


# --- checkpoint ---------------------------------------------------------------------------------

entries = st.lists(st.tuples(st.integers(min_value=0, max_value=3), st.one_of(st.integers(0, 50), u63),
                             st.integers(1, 5), st.integers(20, 2**30), st.integers(1, 1000)), max_size=30)


def _index_from(items, fenced: set[int], deleted: set[int]) -> Index:
    index = Index()
    for ledger_id, entry_id, log_id, offset, length in items:
        index.put(ledger_id, entry_id, entry_id - 1, Location(log_id, offset, length), length + 24)
        index.state_for_write(ledger_id).master_key = bytes([ledger_id]) * 32
    for ledger_id in fenced:
        index.state_for_write(ledger_id).fenced = True
    for ledger_id in deleted:
        index.delete(ledger_id)
    return index


@FUZZ
@given(entries, st.sets(st.integers(0, 5), max_size=3), st.sets(st.integers(3, 9), max_size=3), u63)
def test_checkpoints_round_trip(items, fenced, deleted, seq):
    index = _index_from(items, fenced - deleted, deleted)
    logs = {log_id: (1000 + log_id, live) for log_id, live in index.live_bytes.items()}
    decoded = decode_checkpoint(b"".join(encode_checkpoint(Checkpoint(seq, 9, logs, index))))
    assert (decoded.journal_seq, decoded.next_log_id, decoded.logs) == (seq, 9, logs)
    assert decoded.index.deleted == index.deleted
    assert set(decoded.index.ledgers) == set(index.ledgers)
    for ledger_id, state in index.ledgers.items():
        other = decoded.index.ledgers[ledger_id]
        assert sorted(other.entries.items()) == sorted(state.entries.items())
        assert (other.master_key, other.fenced, other.lac, other.last_entry) == (
            state.master_key, state.fenced, state.lac, state.last_entry)


@FUZZ
@given(entries, st.data())
def test_a_damaged_checkpoint_is_corrupt(items, data):
    raw = bytearray(b"".join(encode_checkpoint(Checkpoint(3, 4, {}, _index_from(items, set(), set())))))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(min_value=0, max_value=len(raw) - 1))]
    else:
        position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(CheckpointCorrupt):
        decode_checkpoint(bytes(raw))


def _checksummed(body: bytes) -> bytes:
    head = struct.pack(">4sIQI", b"QBCP", 1, len(body), crc32c(body))
    return head + struct.pack(">I", crc32c(head))


@FUZZ
@given(st.binary(max_size=200))
def test_checksummed_garbage_bodies_are_corrupt_not_crashes(body):
    assert len(_checksummed(body)) == CHECKPOINT_HEADER_BYTES
    _decodes_or_typed_error(decode_checkpoint, _checksummed(body) + body)
    _decodes_or_typed_error(decode_checkpoint, body)


def test_huge_announced_counts_are_refused_before_allocating():
    for body in (struct.pack(">QQI", 1, 1, 0xFFFFFFFF),
                 struct.pack(">QQIII", 1, 1, 0, 0, 1) + struct.pack(">QB32sqqqQI", 1, 0, b"\0" * 32, -1, -1, -1, 0,
                                                                   0xFFFFFFFF)):
        tracemalloc.start()
        try:
            decode_checkpoint(_checksummed(body) + body)
        except CheckpointCorrupt:
            pass
        else:
            raise AssertionError("accepted")
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 1 << 20


# --- cookie -------------------------------------------------------------------------------------

cookies = st.builds(Cookie, st.integers(min_value=0, max_value=2**63 - 1),
                    st.text("0123456789abcdef", min_size=32, max_size=32),
                    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters="="),
                            max_size=40))


@FUZZ
@given(cookies, st.data())
def test_cookies_round_trip_and_damage_is_corrupt(cookie, data):
    raw = bytearray(encode_cookie(cookie))
    assert decode_cookie(bytes(raw)) == cookie
    position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(CookieCorrupt):
        decode_cookie(bytes(raw))


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_are_never_a_cookie(data):
    with pytest.raises(CookieCorrupt):
        decode_cookie(data)
