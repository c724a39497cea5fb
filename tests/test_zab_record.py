"""The txn log record codec: round trips, torn and corrupt frames, and fuzzing."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from zab.storage.record import (
    MAX_DATA_BYTES,
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    decode_record,
    encode_record,
    encoded_size,
    offset_after,
    scan_records,
    scan_zxids,
)
from zab.storage.storage_errors import CorruptRecordError, RecordError, RecordReason, TornRecordError
from zab.core.txn import Txn

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
txns_strategy = st.builds(Txn, zxid=U64, session_id=U64, cxid=U64, data=st.binary(max_size=200))


def sample(n: int, start: int = 1) -> list[Txn]:
    return [Txn(zxid=start + i, session_id=7, cxid=i, data=b"x" * i) for i in range(n)]


def test_round_trip_and_layout():
    txn = Txn(zxid=0x1_00000002, session_id=3, cxid=4, data=b"hello")
    rec = encode_record(txn)
    assert len(rec) == encoded_size(5)
    length, crc = struct.unpack_from(">II", rec)
    assert length == 24 + 5 and crc == crc32c(rec[8:])
    assert struct.unpack_from(">QQQ", rec, 8) == (0x1_00000002, 3, 4)
    assert decode_record(rec) == (txn, len(rec))


def test_scan_of_clean_buffer_reports_every_record_and_offset():
    records = [encode_record(t) for t in sample(5)]
    buf = b"".join(records)
    result = scan_records(buf)
    assert result.txns == sample(5)
    assert result.offsets == [sum(map(len, records[:i])) for i in range(5)]
    assert result.valid_end == len(buf) and result.stop is None


def test_every_truncation_of_the_last_record_is_torn():
    good = b"".join(encode_record(t) for t in sample(3))
    last = encode_record(Txn(zxid=10, session_id=1, cxid=1, data=b"tail-data"))
    for cut in range(1, len(last)):
        result = scan_records(good + last[:cut])
        assert result.txns == sample(3)
        assert result.valid_end == len(good)
        if last[:cut].strip(b"\0"):
            assert result.stop == RecordReason.TORN == "torn"
        else:  # the first bytes of the big-endian length: indistinguishable from zero fill
            assert result.stop is None and result.zero_fill


def test_zero_fill_is_never_a_record_and_ends_a_scan_cleanly():
    good = encode_record(sample(1)[0])
    for zeros in (1, 7, 8, 100, 4096):
        result = scan_records(good + bytes(zeros))
        assert result.txns == sample(1) and result.valid_end == len(good)
        assert result.stop is None and result.zero_fill
    with pytest.raises(TornRecordError):
        decode_record(bytes(64))


def test_bytes_after_zero_fill_make_it_a_torn_tail():
    good = encode_record(sample(1)[0])
    for tail in (b"\x01", encode_record(sample(2)[1])):
        result = scan_records(good + bytes(4096) + tail)
        assert result.txns == sample(1) and result.valid_end == len(good)
        assert result.stop == RecordReason.TORN and not result.zero_fill


def test_flipped_bit_is_corrupt():
    rec = bytearray(encode_record(Txn(zxid=1, session_id=2, cxid=3, data=b"abc")))
    for i in range(4, len(rec)):  # every byte but the length field
        mutated = bytearray(rec)
        mutated[i] ^= 0x01
        with pytest.raises(CorruptRecordError) as info:
            decode_record(bytes(mutated))
        assert info.value.reason == "corrupt" and info.value.offset == 0


@pytest.mark.parametrize("length", [1, 23, MAX_RECORD_BYTES + 1, 0xFFFFFFFF])
def test_absurd_length_is_corrupt_without_allocating(length):
    buf = struct.pack(">II", length, 0) + b"\x00" * 40
    with pytest.raises(CorruptRecordError):
        decode_record(buf)
    assert scan_records(buf).stop == RecordReason.CORRUPT


def test_oversized_data_is_refused_on_encode():
    with pytest.raises(ValueError):
        encode_record(Txn(zxid=1, session_id=0, cxid=0, data=bytes(MAX_DATA_BYTES + 1)))
    with pytest.raises(ValueError):
        encode_record(Txn(zxid=-1, session_id=0, cxid=0, data=b""))
    # The largest legal record round-trips.
    big = Txn(zxid=1, session_id=0, cxid=0, data=bytes(MAX_DATA_BYTES))
    assert decode_record(encode_record(big))[0] == big


def test_decode_at_offset_and_bad_offsets():
    a, b = sample(2)
    buf = encode_record(a) + encode_record(b)
    txn, end = decode_record(buf, len(encode_record(a)))
    assert txn == b and end == len(buf)
    with pytest.raises(ValueError):
        decode_record(buf, len(buf) + 1)
    with pytest.raises(ValueError):
        scan_records(buf, -1)
    assert scan_records(buf, len(buf)).stop is None


def test_scan_accepts_memoryview():
    buf = b"".join(encode_record(t) for t in sample(3))
    assert scan_records(memoryview(buf)[RECORD_HEADER_BYTES - 8 :]).txns == sample(3)


# --- fuzzing: only documented errors, always a clean result from scan -------------


def _check_scan(buf: bytes) -> None:
    result = scan_records(buf)
    assert len(result.txns) == len(result.offsets)
    assert 0 <= result.valid_end <= len(buf)
    assert (result.stop is None) == (result.valid_end == len(buf) or result.zero_fill)
    assert not result.zero_fill or not buf[result.valid_end :].strip(b"\0")
    try:
        txn, end = decode_record(buf)
    except RecordError as err:
        assert err.reason in (RecordReason.TORN, RecordReason.CORRUPT)
    else:
        assert 0 < end <= len(buf) and result.txns[0] == txn


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(buf):
    _check_scan(buf)


@settings(max_examples=200, deadline=None)
@given(st.lists(txns_strategy, min_size=1, max_size=5), st.data())
def test_fuzz_mutated_valid_encodings(txns, data):
    txns = [Txn(zxid=1000 * (i + 1) + t.zxid % 1000, session_id=t.session_id, cxid=t.cxid, data=t.data)
            for i, t in enumerate(txns)]  # increasing, as in a log
    buf = bytearray(b"".join(encode_record(t) for t in txns))
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    tail = data.draw(st.sampled_from([b"", b"\x00" * 16, b"\xff" * 9]))
    mutated = bytes(buf[:cut]) + tail
    _check_scan(mutated)
    # Whatever scan keeps is a prefix that re-encodes to exactly the kept bytes.
    result = scan_records(mutated)
    assert b"".join(encode_record(t) for t in result.txns) == mutated[: result.valid_end]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF), st.binary(max_size=64))
def test_fuzz_arbitrary_headers(length, crc, rest):
    _check_scan(struct.pack(">II", length, crc) + rest)


@settings(max_examples=200, deadline=None)
@given(st.lists(txns_strategy, min_size=0, max_size=6), st.data())
def test_scanning_zxids_checks_what_decoding_checks_and_skipping_lands_where_decoding_would(txns, data):
    """TxnLog.open checks every record with scan_zxids (no Txn, no copy of data) and read_after
    passes over those it does not want by offset_after: the same verdicts, zxids, offsets and
    ends as scan_records, on whole buffers and on damaged ones."""
    txns = [Txn(zxid=1000 * (i + 1) + t.zxid % 1000, session_id=t.session_id, cxid=t.cxid, data=t.data)
            for i, t in enumerate(txns)]  # increasing, as in a log
    buf = bytearray(b"".join(encode_record(t) for t in txns))
    if buf and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        buf += bytes(data.draw(st.integers(0, 40)))  # a preallocated tail
    full, light = scan_records(bytes(buf)), scan_zxids(bytes(buf))
    assert light.txns == [t.zxid for t in full.txns]
    assert (light.offsets, light.valid_end, light.stop, light.zero_fill) == \
        (full.offsets, full.valid_end, full.stop, full.zero_fill)
    whole = bytes(buf[:full.valid_end])  # offset_after walks records already checked
    for zxid in [data.draw(st.integers(0, 1000 * (len(txns) + 1)))] + [t.zxid + d for t in full.txns for d in (-1, 0)]:
        expected = next((o for t, o in zip(full.txns, full.offsets) if t.zxid > zxid), full.valid_end)
        assert offset_after(whole, 0, zxid) == expected, zxid
