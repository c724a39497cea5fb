"""The client-protocol codec (metastore/wire/jute.py) under hostile input.

Random bytes, random bodies behind every opcode, every prefix of a valid
encoding, lying lengths and counts, and random mutations give only a clean
result or JuteError (UnknownOpcode is one): never another exception, never a
hang, never an allocation much larger than the input. Whatever decodes cleanly
encodes back to bytes that decode to the same thing.
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from metastore_fixtures import RECORDS, request_body, response_body

from metastore.wire.jute import (REQUEST_BODIES, RESPONSE_BODIES, ConnectRequest, ConnectResponse, CreateRequest,
                            FrameReader, JuteError, OpCode, ReplyHeader, RequestHeader, UnknownOpcode, WatcherEvent,
                            decode_connect_request, decode_connect_response, decode_notification, decode_record,
                            decode_reply, decode_request, encode_connect_request, encode_connect_response,
                            encode_notification, encode_record, encode_reply, encode_request, frame)

FUZZ = settings(max_examples=120, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
SMALL_MAX = 1 << 12  # jute.maxbuffer for these tests
# Decoding a payload may allocate a few copies of it, never much more.
ALLOCATION_LIMIT_BYTES = 1 << 20
I32 = struct.Struct(">i")
OPCODES = sorted(set(REQUEST_BODIES) | {OpCode.DELETE_CONTAINER, OpCode.CREATE_SESSION, OpCode.NOTIFICATION})


def clean(decode, payload):
    """Decode: only a result or JuteError may come out; returns the result or the error."""
    try:
        return decode(payload)
    except JuteError as e:
        assert type(e) in (JuteError, UnknownOpcode)
        assert str(e)
        return e


def server_side(payload: bytes) -> list:
    return [clean(decode_request, payload), clean(decode_connect_request, payload)]


def client_side(payload: bytes) -> list:
    results = [clean(decode_connect_response, payload), clean(decode_notification, payload)]
    return results + [clean(lambda p: decode_reply(p, op, SMALL_MAX), payload) for op in RESPONSE_BODIES]


def reencodes(request) -> None:
    """A request that decoded cleanly encodes to bytes that decode to the same request."""
    if not isinstance(request, JuteError):
        header, body = request
        assert decode_request(encode_request(header, body)) == request


# --- random input -------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=200))
@example(b"")
@example(b"\x00\x00\x00\x01\x00\x00\x00\x0b")  # ping, with a non-special xid
@example(b"\x00\x00\x00\x01\x00\x00\x00\x0b\x00")  # ping with a trailing byte
@example(b"\x00\x00\x00\x01\x00\x00\x00\x0e")  # multi without its closing header
@example(b"\x00\x00\x00\x01\x00\x00\x00\x03\xff\xff\xff\xff\x02")  # exists: null path, watch byte 2
def test_random_bytes(data: bytes) -> None:
    reencodes(server_side(data)[0])
    client_side(data)


@FUZZ
@given(xid=st.integers(-(2**31), 2**31 - 1), op=st.sampled_from(OPCODES), body=st.binary(max_size=120))
@example(xid=1, op=OpCode.CREATE, body=b"\x00\x00\x00\x02\xff\xfe")  # path not UTF-8
@example(xid=1, op=OpCode.CREATE, body=b"\x00\x00\x00\x00\xff\xff\xff\xff\x7f\xff\xff\xff")  # 2^31 ACLs
@example(xid=1, op=OpCode.MULTI, body=b"\x00\x00\x00\x04\x00\xff\xff\xff\xff")  # a getData op inside a multi
@example(xid=1, op=OpCode.SET_WATCHES, body=b"\x00" * 8 + b"\xff\xff\xff\xfe")  # vector count -2
def test_random_bodies_behind_every_opcode(xid: int, op: int, body: bytes) -> None:
    result = clean(decode_request, I32.pack(xid) + I32.pack(op) + body)
    reencodes(result)
    if isinstance(result, UnknownOpcode):
        assert (result.xid, result.opcode) == (xid, op)


@FUZZ
@given(op=st.sampled_from(list(RESPONSE_BODIES)), body=st.binary(max_size=120))
def test_random_reply_bodies(op: OpCode, body: bytes) -> None:
    result = clean(lambda p: decode_reply(p, op), encode_reply(ReplyHeader(1, 2, 0)) + body)
    if not isinstance(result, JuteError):
        header, decoded = result
        assert decode_reply(encode_reply(header, decoded), op) == result


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
@settings(FUZZ, max_examples=25)
@given(data=st.binary(max_size=80))
def test_random_bytes_as_every_record(cls: type, data: bytes) -> None:
    result = clean(lambda p: decode_record(cls, p, SMALL_MAX), data)
    if not isinstance(result, JuteError):
        assert decode_record(cls, bytes(encode_record(result)), SMALL_MAX) == result


# --- valid encodings, cut short or damaged ---------------------------------------------------------

requests = st.sampled_from(list(REQUEST_BODIES)).flatmap(
    lambda op: st.tuples(st.builds(RequestHeader, st.integers(-(2**31), 2**31 - 1), st.just(op)), request_body(op)))
replies = st.sampled_from(list(RESPONSE_BODIES)).flatmap(lambda op: st.tuples(st.just(op), response_body(op)))


@FUZZ
@given(requests)
def test_every_prefix_of_a_request(request) -> None:
    payload = encode_request(*request)
    for n in range(len(payload)):
        with pytest.raises(JuteError):
            decode_request(payload[:n])
    framed = frame(payload)
    for n in range(len(framed)):  # a frame cut short: nothing yet, no error
        reader = FrameReader(SMALL_MAX)
        assert reader.feed(framed[:n]) == [] and reader.pending_bytes == n
        assert reader.feed(framed[n:]) == [payload]


@FUZZ
@given(replies)
def test_every_prefix_of_a_reply(reply) -> None:
    op, body = reply
    payload = encode_reply(ReplyHeader(9, 10, 0), body)
    for n in range(len(payload)):
        with pytest.raises(JuteError):
            decode_reply(payload[:n], op)


@FUZZ
@given(RECORDS[ConnectRequest], RECORDS[ConnectResponse], RECORDS[WatcherEvent])
def test_every_prefix_of_a_handshake_and_a_notification(request, response, event) -> None:
    """The read-only byte is optional: only the prefix without it decodes."""
    cases = ((encode_connect_request(request), decode_connect_request, request.read_only is not None),
             (encode_connect_response(response), decode_connect_response, True),
             (encode_notification(event), decode_notification, False))
    for payload, decode, optional_last_byte in cases:
        for n in range(len(payload) - optional_last_byte):
            with pytest.raises(JuteError):
                decode(payload[:n])


def mutate(draw, buf: bytes) -> bytes:
    out = bytearray(buf)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "set", "length", "insert", "delete"]))
        pos = draw(st.integers(min_value=0, max_value=max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and out:
            out[pos] = draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
        elif op == "length":  # a lying length or count
            out[pos:pos + 4] = I32.pack(draw(st.sampled_from([-2, -1, 0, 1, SMALL_MAX + 1, 2**31 - 1])))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and out:
            del out[pos:pos + draw(st.integers(min_value=1, max_value=8))]
    return bytes(out)


@FUZZ
@given(requests, st.data())
def test_mutated_requests(request, data) -> None:
    mutated = mutate(data.draw, encode_request(*request))
    reencodes(server_side(mutated)[0])


@FUZZ
@given(replies, st.data())
def test_mutated_replies(reply, data) -> None:
    op, body = reply
    client_side(mutate(data.draw, encode_reply(ReplyHeader(9, 10, 0), body)))


@settings(FUZZ, max_examples=60)
@given(st.lists(requests, min_size=1, max_size=4), st.data())
def test_mutated_streams(reqs, data) -> None:
    stream = mutate(data.draw, b"".join(frame(encode_request(*r)) for r in reqs))
    reader = FrameReader(SMALL_MAX)
    chunk = data.draw(st.integers(min_value=1, max_value=64))
    try:
        for i in range(0, len(stream), chunk):
            for payload in reader.feed(stream[i:i + chunk]):
                server_side(payload)
    except JuteError:
        pass
    assert reader.pending_bytes <= 4 + SMALL_MAX


# --- limits and allocation -----------------------------------------------------------------------

def test_lengths_are_checked_against_max_bytes() -> None:
    big_path = CreateRequest("/" + "x" * 200, b"", (), 0)
    payload = encode_request(RequestHeader(1, OpCode.CREATE), big_path)
    assert decode_request(payload, max_bytes=201)[1] == big_path
    with pytest.raises(JuteError, match="exceeds the limit of 200"):
        decode_request(payload, max_bytes=200)


LYING = {
    "path-2GiB": I32.pack(1) + I32.pack(OpCode.CREATE) + I32.pack(2**31 - 1) + b"/",
    "data-1MiB": I32.pack(1) + I32.pack(OpCode.SET_DATA) + I32.pack(1) + b"/" + I32.pack(0xFFFFF) + bytes(64),
    "acl-count": I32.pack(1) + I32.pack(OpCode.CREATE) + I32.pack(1) + b"/" + I32.pack(0) + I32.pack(2**31 - 1),
    "watch-count": I32.pack(-8) + I32.pack(OpCode.SET_WATCHES) + bytes(8) + I32.pack(2**30) + bytes(400),
    "multi-no-end": I32.pack(1) + I32.pack(OpCode.MULTI) + (I32.pack(OpCode.CHECK) + b"\0" + I32.pack(-1)
                                                             + I32.pack(1) + b"/" + I32.pack(0)) * 200,
    "children-count": encode_reply(ReplyHeader(1, 1, 0)) + I32.pack(2**31 - 1) + bytes(4000),
}


@pytest.mark.parametrize("payload", list(LYING.values()), ids=list(LYING))
def test_lying_lengths_allocate_nothing_large(payload: bytes) -> None:
    tracemalloc.start()
    try:
        results = server_side(payload) + client_side(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT_BYTES
    assert isinstance(results[0], JuteError)


def test_frame_reader_refuses_a_lying_length_before_buffering() -> None:
    reader = FrameReader(SMALL_MAX)
    assert reader.feed(I32.pack(SMALL_MAX + 1)[:3]) == []
    with pytest.raises(JuteError, match="outside"):
        reader.feed(I32.pack(SMALL_MAX + 1)[3:] + bytes(100))
    with pytest.raises(JuteError, match="outside"):
        FrameReader(SMALL_MAX).feed(I32.pack(-5))


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=5), st.integers(min_value=1, max_value=50))
def test_frame_reader_on_random_chunks(chunks, size) -> None:
    reader = FrameReader(SMALL_MAX)
    try:
        for chunk in chunks:
            for i in range(0, len(chunk), size):
                for payload in reader.feed(chunk[i:i + size]):
                    assert len(payload) <= SMALL_MAX
    except JuteError:
        return
    assert reader.pending_bytes < 4 + SMALL_MAX
