"""The bookie wire protocol (bookie/protocol.py): exact bytes, round trips, and fuzzed decoders.

Every decoder must answer anything malformed (truncated, oversized, random,
bit-flipped) with DecodeError and nothing else: a bookie closes the one
connection that sent it, and never crashes.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import errors
from bookie import protocol as P
from bookie.entry import Digester, DigestType

KEY = bytes(range(32))
MAX_ID = 2**63 - 1


def packaged(ledger: int = 7, entry: int = 3, payload: bytes = b"hello") -> bytes:
    return Digester(DigestType.CRC32C, b"pw").package(ledger, entry, entry - 1, 100, payload)


def body_of(frame: bytes) -> bytes:
    [body] = P.FrameSplitter(1 << 20).feed(frame)
    return body


# --- exact bytes ----------------------------------------------------------------------

def test_an_add_frame_is_length_crc_version_type_request_id_then_the_fields():
    entry = packaged()
    frame = P.encode_add(0x0102, 7, 3, KEY, entry, recovery=True)
    body = struct.pack(">BBQQQB", 1, 1, 0x0102, 7, 3, 0x01) + KEY + entry
    assert frame == struct.pack(">II", len(body), crc32c(body)) + body


def test_an_error_answer_carries_status_and_a_message():
    frame = P.encode_response(P.Response(9, P.Kind.FENCE, P.Status.UNAUTHORIZED, message="wrong key"))
    body = struct.pack(">BBQBH", 1, 0x86, 9, 4, 9) + b"wrong key"
    assert frame == struct.pack(">II", len(body), crc32c(body)) + body


def test_every_status_maps_to_one_error_class_and_back():
    for status, cls in P.ERROR_OF_STATUS.items():
        assert P.status_of(cls("x")) is status
        assert isinstance(P.Response(1, P.Kind.READ, status).error(), cls)
    assert set(P.ERROR_OF_STATUS.values()) >= {
        errors.NoSuchLedger, errors.NoSuchEntry, errors.LedgerFenced, errors.Unauthorized, errors.EntryTooLarge,
        errors.BookieReadOnly, errors.Overloaded, errors.BadRequest, errors.EntryCorrupt}


# --- round trips ----------------------------------------------------------------------

REQUESTS = [
    P.AddEntry(1, 7, 3, KEY, packaged(), recovery=False),
    P.AddEntry(2, 7, 3, KEY, packaged(), recovery=True),
    P.ReadEntry(3, 7, 3),
    P.ReadEntry(4, 7, 0, fence=True, master_key=KEY),
    P.ReadLac(5, MAX_ID),
    P.LongPoll(6, 7, -1, 30_000),
    P.WriteLac(7, 7, 12, KEY),
    P.Fence(8, 7, KEY),
]

RESPONSES = [
    P.Response(1, P.Kind.ADD, P.Status.OK, 7, 3),
    P.Response(2, P.Kind.READ, P.Status.OK, 7, 3, data=packaged()),
    P.Response(3, P.Kind.READ_LAC, P.Status.OK, 7, lac=-1),
    P.Response(4, P.Kind.LONG_POLL, P.Status.OK, 7, lac=4, data=packaged(7, 4)),
    P.Response(5, P.Kind.LONG_POLL, P.Status.OK, 7, lac=3, data=None),
    P.Response(6, P.Kind.WRITE_LAC, P.Status.OK, 7),
    P.Response(7, P.Kind.FENCE, P.Status.OK, 7, lac=11),
    P.Response(8, P.Kind.READ, P.Status.NO_SUCH_ENTRY, message="ledger 7 entry 9 is not here"),
    P.Response(9, P.Kind.ADD, P.Status.FENCED, message="fenced"),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_requests_round_trip(req):
    assert P.decode_request(body_of(P.encode_request(req))) == req


@pytest.mark.parametrize("resp", RESPONSES, ids=lambda r: f"{r.kind.name}-{r.status.name}")
def test_responses_round_trip(resp):
    assert P.decode_response(body_of(P.encode_response(resp))) == resp


def test_frames_split_across_reads_and_coalesced_in_one_read():
    stream = b"".join(P.encode_request(r) for r in REQUESTS)
    splitter = P.FrameSplitter(1 << 20)
    bodies = []
    for i in range(0, len(stream), 5):
        bodies += splitter.feed(stream[i:i + 5])
    assert [P.decode_request(b) for b in bodies] == REQUESTS
    assert [P.decode_request(b) for b in P.FrameSplitter(1 << 20).feed(stream)] == REQUESTS


# --- malformed input ------------------------------------------------------------------

def test_an_oversized_frame_is_refused_before_it_is_buffered_with_its_request_id():
    frame = P.encode_add(42, 7, 3, KEY, packaged(payload=b"x" * 1000))
    with pytest.raises(P.DecodeError) as e:
        P.FrameSplitter(500).feed(frame[:30])
    assert e.value.request_id == 42


def test_a_corrupt_frame_fails_its_checksum():
    frame = bytearray(P.encode_request(REQUESTS[0]))
    frame[-1] ^= 0x40
    with pytest.raises(P.DecodeError, match="checksum"):
        P.FrameSplitter(1 << 20).feed(bytes(frame))


def test_an_add_whose_entry_names_another_entry_is_refused():
    body = body_of(P.encode_add(5, 7, 4, KEY, packaged(7, 3)))
    with pytest.raises(P.DecodeError, match="carries the entry of ledger 7 entry 3") as e:
        P.decode_request(body)
    assert e.value.request_id == 5


def test_the_hot_path_add_answer_is_the_general_encoding():
    assert P.encode_add_ok(5, 7, 3) == P.encode_response(P.Response(5, P.Kind.ADD, P.Status.OK, 7, 3))


def test_unknown_versions_types_and_flags_are_refused_with_the_request_id():
    read = body_of(P.encode_request(P.ReadEntry(9, 7, 3)))
    for damaged in (b"\x02" + read[1:], read[:1] + b"\x77" + read[2:], read[:-1] + b"\x80"):
        with pytest.raises(P.DecodeError) as e:
            P.decode_request(damaged)
        assert e.value.request_id == 9


def _reframe(body: bytes) -> bytes:
    return struct.pack(">II", len(body), crc32c(body)) + body


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bodies_never_raise_anything_but_decode_error(body):
    for decode in (P.decode_request, P.decode_response):
        try:
            decode(body)
        except P.DecodeError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REQUESTS + RESPONSES), st.data())
def test_truncated_or_mutated_messages_raise_only_decode_error(message, data):
    frame = P.encode_request(message) if not isinstance(message, P.Response) else P.encode_response(message)
    body = bytearray(body_of(frame))
    cut = data.draw(st.integers(0, len(body)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, max(0, len(body) - 1)), st.integers(1, 255)), max_size=4))
    for pos, mask in flips:
        if pos < len(body):
            body[pos] ^= mask
    for candidate in (bytes(body[:cut]), bytes(body)):
        for decode in (P.decode_request, P.decode_response):
            try:
                decode(candidate)
            except P.DecodeError:
                pass
        try:
            P.FrameSplitter(300).feed(_reframe(candidate))
        except P.DecodeError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(8, 200))
def test_random_streams_split_or_raise_decode_error(chunks, max_frame):
    splitter = P.FrameSplitter(max_frame)
    try:
        for chunk in chunks:
            for body in splitter.feed(chunk):
                assert len(body) <= max_frame
    except P.DecodeError:
        pass


# --- extreme values: every value in range round-trips, every one out of range is refused --------

IDS = st.one_of(st.integers(0, 3), st.sampled_from([MAX_ID - 1, MAX_ID]), st.integers(0, MAX_ID))
LACS = st.one_of(st.integers(-1, 3), st.sampled_from([MAX_ID - 1, MAX_ID]), st.integers(-1, MAX_ID))
U64 = st.integers(0, 2**64 - 1)
KEY32 = st.binary(min_size=32, max_size=32)


@st.composite
def extreme_requests(draw):
    rid, ledger = draw(U64), draw(IDS)
    match draw(st.sampled_from(list(P.Kind))):
        case P.Kind.ADD:
            entry = draw(IDS)
            data = Digester(DigestType.CRC32C, b"pw").package(ledger, entry, min(draw(LACS), entry - 1),
                                                              draw(U64), draw(st.binary(max_size=16)))
            return P.AddEntry(rid, ledger, entry, draw(KEY32), data, draw(st.booleans()))
        case P.Kind.READ:
            fence = draw(st.booleans())
            return P.ReadEntry(rid, ledger, draw(IDS), fence, draw(KEY32) if fence else None)
        case P.Kind.READ_LAC:
            return P.ReadLac(rid, ledger)
        case P.Kind.LONG_POLL:
            return P.LongPoll(rid, ledger, draw(LACS), draw(st.integers(0, 2**32 - 1)))
        case P.Kind.WRITE_LAC:
            return P.WriteLac(rid, ledger, draw(LACS), draw(KEY32))
        case P.Kind.FENCE:
            return P.Fence(rid, ledger, draw(KEY32))


@settings(derandomize=True, database=None, max_examples=400, deadline=None)
@given(extreme_requests())
def test_requests_with_extreme_values_in_range_round_trip(req):
    assert P.decode_request(body_of(P.encode_request(req))) == req


@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(st.sampled_from([P.Kind.ADD, P.Kind.READ, P.Kind.READ_LAC, P.Kind.LONG_POLL, P.Kind.WRITE_LAC,
                        P.Kind.FENCE]), st.integers(MAX_ID + 1, 2**64 - 1), U64)
def test_a_ledger_id_beyond_a_java_long_is_refused_with_its_request_id(kind, ledger, rid):
    """Java's negative ledger ids arrive as u64 above 2**63 - 1: refused, never stored."""
    fields = {P.Kind.ADD: struct.pack(">QB", 0, 0) + KEY + struct.pack(">QQqQB", ledger, 0, -1, 0, 1) + bytes(4),
              P.Kind.READ: struct.pack(">QB", 0, 0), P.Kind.READ_LAC: b"", P.Kind.LONG_POLL: struct.pack(">qI", -1, 0),
              P.Kind.WRITE_LAC: struct.pack(">q", -1) + KEY, P.Kind.FENCE: KEY}[kind]
    with pytest.raises(P.DecodeError) as e:
        P.decode_request(struct.pack(">BBQQ", P.VERSION, kind, rid, ledger) + fields)
    assert e.value.request_id == rid


@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(U64, IDS, IDS, LACS, st.one_of(st.none(), st.binary(max_size=16)), st.sampled_from(list(P.Status)))
def test_responses_with_extreme_values_round_trip(rid, ledger, entry, lac, data, status):
    kind_fields = [(P.Kind.ADD, {"entry_id": entry}), (P.Kind.READ, {"entry_id": entry, "data": data or b""}),
                   (P.Kind.READ_LAC, {"lac": lac}), (P.Kind.FENCE, {"lac": lac}),
                   (P.Kind.LONG_POLL, {"lac": lac, "data": data}), (P.Kind.WRITE_LAC, {})]
    for kind, fields in kind_fields:
        if status is P.Status.OK:
            resp = P.Response(rid, kind, status, ledger, **fields)
        else:
            resp = P.Response(rid, kind, status, message="x" * (len(data or b"") * 64))  # up to the 1024-byte cap
        assert P.decode_response(body_of(P.encode_response(resp))) == resp
