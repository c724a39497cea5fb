"""The key-value client protocol codec: round trips, and clean errors for any bytes at all."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterd import kvwire
from clusterd.kvwire import Delete, FrameDecoder, Get, Put, WireError

keys = st.text(min_size=1, max_size=20)
versions = st.none() | st.integers(min_value=0, max_value=2**63 - 1)
requests = st.one_of(
    st.builds(Get, keys),
    st.builds(Put, keys, st.text(max_size=50), versions),
    st.builds(Delete, keys, versions),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)


def decode_all(data: bytes, max_frame_bytes: int = kvwire.MAX_FRAME_BYTES) -> list[dict]:
    decoder = FrameDecoder(max_frame_bytes)
    decoder.feed(data)
    messages = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    decoder.check_eof()
    return messages


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@given(st.lists(requests, max_size=5))
def test_requests_round_trip_through_frames(reqs: list[kvwire.Request]) -> None:
    data = b"".join(kvwire.encode_frame(kvwire.request_message(r)) for r in reqs)
    assert [kvwire.parse_request(m) for m in decode_all(data)] == reqs


@given(st.lists(requests, min_size=1, max_size=4), st.data())
def test_frames_split_anywhere_decode_the_same(reqs: list[kvwire.Request], data: st.DataObject) -> None:
    stream = b"".join(kvwire.encode_frame(kvwire.request_message(r)) for r in reqs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder, got = FrameDecoder(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        decoder.feed(stream[start:end])
        while (message := decoder.next_message()) is not None:
            got.append(kvwire.parse_request(message))
    assert got == reqs and decoder.buffered == 0


@settings(max_examples=500)
@given(st.binary(max_size=64))
def test_random_bytes_give_messages_or_a_clean_error(data: bytes) -> None:
    try:
        for message in decode_all(data, max_frame_bytes=1024):
            assert isinstance(message, dict)
            try:
                kvwire.parse_request(message)
            except kvwire.BadRequest:
                pass
    except WireError:
        pass


@settings(max_examples=500)
@given(st.lists(st.binary(max_size=30) | st.text(max_size=30).map(str.encode), max_size=4))
def test_well_framed_random_bodies_give_objects_or_a_clean_error(bodies: list[bytes]) -> None:
    try:
        assert all(isinstance(m, dict) for m in decode_all(b"".join(map(raw_frame, bodies))))
    except kvwire.MalformedFrame:
        pass


@given(json_values)
def test_any_json_body_is_a_request_or_a_bad_request(value: object) -> None:
    frame = raw_frame(json.dumps(value).encode())
    if not isinstance(value, dict):
        with pytest.raises(kvwire.MalformedFrame, match="not an object"):
            decode_all(frame)
        return
    [message] = decode_all(frame)
    try:
        kvwire.parse_request(message)
    except kvwire.BadRequest:
        pass


@given(st.lists(requests, min_size=1, max_size=3), st.data())
def test_a_truncated_stream_is_an_error_at_eof_never_a_partial_message(
        reqs: list[kvwire.Request], data: st.DataObject) -> None:
    frames = [kvwire.encode_frame(kvwire.request_message(r)) for r in reqs]
    stream = b"".join(frames)
    boundaries = {sum(map(len, frames[:i])) for i in range(len(frames) + 1)}
    cut = data.draw(st.integers(1, len(stream) - 1).filter(lambda c: c not in boundaries))
    decoder = FrameDecoder()
    decoder.feed(stream[:cut])
    while decoder.next_message() is not None:
        pass
    with pytest.raises(kvwire.MalformedFrame, match="stream ended inside a frame"):
        decoder.check_eof()


@given(st.integers(min_value=1025, max_value=2**32 - 1))
def test_an_oversized_length_is_refused_before_the_body_arrives(length: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.feed(struct.pack(">I", length) + b"{")
    with pytest.raises(kvwire.FrameTooLarge, match=f"frame of {length} bytes"):
        decoder.next_message()


def test_a_frame_at_the_limit_is_accepted() -> None:
    body = json.dumps({"op": "get", "key": "k" * 100}).encode()
    assert decode_all(raw_frame(body), max_frame_bytes=len(body)) == [{"op": "get", "key": "k" * 100}]


@pytest.mark.parametrize("body, problem", [
    (b"", "not UTF-8 JSON"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"{\"op\":", "not UTF-8 JSON"),
    (b"[1, 2]", "not an object"),
    (b"NaN", "not UTF-8 JSON"),
    (b"[" * 100_000, "not UTF-8 JSON"),
])
def test_malformed_bodies(body: bytes, problem: str) -> None:
    with pytest.raises(kvwire.MalformedFrame, match=problem):
        decode_all(raw_frame(body))


@pytest.mark.parametrize("message, problem", [
    ({"key": "a"}, "unknown op None"),
    ({"op": "cas", "key": "a"}, "unknown op 'cas'"),
    ({"op": "get", "key": "a", "value": "x"}, "unexpected fields \\['value'\\]"),
    ({"op": "get"}, "key must be a string"),
    ({"op": "get", "key": ""}, "must not be empty"),
    ({"op": "get", "key": "\ud800"}, "not valid Unicode"),
    ({"op": "get", "key": "k" * 1025}, "more than the limit of 1024"),
    ({"op": "put", "key": "a"}, "value must be a string"),
    ({"op": "put", "key": "a", "value": "v" * ((1 << 20) + 1)}, "more than the limit"),
    ({"op": "put", "key": "a", "value": "v", "version": -1}, "version must be null or"),
    ({"op": "put", "key": "a", "value": "v", "version": True}, "version must be null or"),
    ({"op": "delete", "key": "a", "version": 1.0}, "version must be null or"),
    ({"op": "delete", "key": "a", "version": 2**63}, "version must be null or"),
])
def test_bad_requests(message: dict, problem: str) -> None:
    with pytest.raises(kvwire.BadRequest, match=problem):
        kvwire.parse_request(message)


def test_an_absent_version_means_any() -> None:
    assert kvwire.parse_request({"op": "delete", "key": "a"}) == Delete("a", None)


def test_responses_are_checked_on_the_client_side() -> None:
    ok = {"ok": True, "version": 1}
    assert kvwire.check_response(ok) is ok
    assert kvwire.check_response(kvwire.error_response(kvwire.NO_KEY, "gone"))["error"] == "NoKey"
    for bad in ({}, {"ok": 1}, {"ok": False, "error": "Weird", "message": "?"}, {"ok": False, "error": "NoKey"}):
        with pytest.raises(kvwire.MalformedFrame):
            kvwire.check_response(bad)
