"""The peer wire codec (zab/wire/codec.py) under fuzzing.

Round trips: every message type encodes and decodes back to itself, alone,
framed, and split at any point of a byte stream. Hostile input: random bytes,
every prefix of a valid encoding, mutations of valid encodings and oversized
length headers give only a clean result or zab.errors.FrameError (a
ProtocolError): never another exception, never a hang, never a huge allocation.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import tracemalloc

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zab.wire import codec
from zab.wire.codec import (FrameDecoder, decode_hello, decode_message, encode_frame, encode_hello, encode_message,
                       frame)
from zab.errors import FrameError, ProtocolError
from zab.core.messages import (EnsembleInfo, Ack, AckEpoch, AckNewLeader, Commit, FollowerInfo, Inform, LeaderInfo, Message, NewLeader,
                          Notification, Ping, Proposal, ReadIndexAck, ReadIndexProbe, Refused, Reject, Request,
                          ServerState, SnapAck, SnapChunk, SnapEnd, Sync, SyncMode, SyncReply, SyncRequest, SyncTxns,
                          UpToDate)
from zab.core.txn import Txn

# QUIRE_SOAK=1 (or pytest --soak): many more examples, and new ones on every run.
SOAK = os.environ.get("QUIRE_SOAK") == "1"
FUZZ = settings(max_examples=5000 if SOAK else 300, derandomize=not SOAK, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
SMALL_MAX_FRAME = 1 << 16
# Decoding one frame may allocate a few copies of it, never much more.
ALLOCATION_LIMIT_BYTES = 8 * SMALL_MAX_FRAME + (1 << 20)

u64 = st.integers(min_value=0, max_value=2**64 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
blobs = st.binary(max_size=64)
txns = st.builds(Txn, u64, u64, u64, blobs)

MESSAGES: dict[type, st.SearchStrategy] = {
    Notification: st.builds(Notification, i64, u64, i64, u64, st.sampled_from(ServerState)),
    FollowerInfo: st.builds(FollowerInfo, u64, u64, st.booleans(), u64),
    LeaderInfo: st.builds(LeaderInfo, u64, st.booleans()),
    AckEpoch: st.builds(AckEpoch, u64, u64),
    Sync: st.builds(Sync, st.sampled_from(SyncMode), u64, st.none() | blobs),
    SyncTxns: st.builds(SyncTxns, st.lists(txns, max_size=5).map(tuple)),
    NewLeader: st.builds(NewLeader, u64, u64),
    AckNewLeader: st.builds(AckNewLeader, u64),
    UpToDate: st.builds(UpToDate, u64),
    Proposal: st.builds(Proposal, txns),
    Ack: st.builds(Ack, u64),
    Commit: st.builds(Commit, u64),
    Inform: st.builds(Inform, txns),
    Request: st.builds(Request, u64, u64, blobs),
    Reject: st.builds(Reject, u64, u64),
    Ping: st.builds(Ping, st.lists(u64, max_size=5).map(tuple)),
    SyncRequest: st.builds(SyncRequest, u64, u64),
    SyncReply: st.builds(SyncReply, u64, u64, u64),
    Refused: st.builds(Refused, u64, u64, u64, blobs),
    ReadIndexProbe: st.builds(ReadIndexProbe, u64),
    ReadIndexAck: st.builds(ReadIndexAck, u64),
    SnapChunk: st.builds(SnapChunk, u64, blobs, st.integers(0, 2**32 - 1)),
    SnapAck: st.builds(SnapAck, u64),
    SnapEnd: st.builds(SnapEnd, u64, blobs),
    EnsembleInfo: st.builds(EnsembleInfo, u64, blobs),
}
messages = st.one_of(*MESSAGES.values())
# Wire fields are unsigned or signed 64-bit; Python ints are not, so out-of-range
# values must fail on encode (struct.error), never produce a frame that decodes differently.
cluster_names = st.text(max_size=40)
sender_ids = st.integers(min_value=0, max_value=2**64 - 1)


def test_every_message_type_has_a_strategy() -> None:
    assert set(MESSAGES) == set(codec._TYPES), "add a strategy for the new message type"
    assert set(MESSAGES) == {t for t in Message.__args__}


def decode_stream(data: bytes, max_frame_bytes: int = SMALL_MAX_FRAME) -> list[Message]:
    decoder = FrameDecoder(max_frame_bytes)
    return [decode_message(p) for p in decoder.feed(data)]


def clean(fn, *args):
    """Call fn: only a result or FrameError may come out; returns the result or the error."""
    try:
        return fn(*args)
    except FrameError as e:
        assert isinstance(e, ProtocolError)
        return e


# -- round trips ---------------------------------------------------------------------------
@FUZZ
@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg
    assert decode_stream(encode_frame(msg)) == [msg]


@pytest.mark.parametrize("kind", list(MESSAGES), ids=lambda t: t.__name__)
@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(data=st.data())
def test_each_message_type_round_trips(kind: type, data: st.DataObject) -> None:
    msg = data.draw(MESSAGES[kind])
    assert type(decode_message(encode_message(msg))) is kind
    assert decode_message(encode_message(msg)) == msg


@FUZZ
@given(st.lists(messages, max_size=8), st.lists(st.integers(min_value=0, max_value=4000), max_size=6))
def test_stream_split_anywhere_decodes_the_same(msgs: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    out: list[Message] = []
    for a, b in zip(points, points[1:]):
        out += [decode_message(p) for p in decoder.feed(stream[a:b])]
    assert out == msgs
    assert decoder.pending_bytes == 0


def test_stream_fed_one_byte_at_a_time() -> None:
    msgs = [Ping(), Proposal(Txn(1 << 32 | 1, 7, 9, b"x" * 300)), SyncTxns((Txn(5, 0, 0, b""),)), Commit(3)]
    stream = b"".join(encode_frame(m) for m in msgs)
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    out = [decode_message(p) for i in range(len(stream)) for p in decoder.feed(stream[i:i + 1])]
    assert out == msgs


@FUZZ
@given(cluster_names, sender_ids)
def test_hello_round_trip(cluster: str, sender: int) -> None:
    (payload,) = list(FrameDecoder(SMALL_MAX_FRAME).feed(encode_hello(cluster, sender)))
    assert decode_hello(payload) == (cluster, sender)


@pytest.mark.parametrize("msg", [
    Notification(-1, 0, 0, 0, ServerState.LOOKING),  # observers vote for nobody
    Notification(2**63 - 1, 2**64 - 1, -(2**63), 2**64 - 1, ServerState.OBSERVING),
    FollowerInfo(2**64 - 1, 2**64 - 1, True, 2**64 - 1),
    Sync(SyncMode.SNAP, 0, b""),  # an empty snapshot is not "no snapshot"
    Sync(SyncMode.DIFF, 5, None),
    SyncTxns(()),
    Request(0, 0, b""),
], ids=repr)
def test_edge_values_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@pytest.mark.parametrize("msg", [
    LeaderInfo(-1), Ack(2**64), Commit(-5), FollowerInfo(-1, 0, False, 0), Notification(0, -1, 0, 0, ServerState.LOOKING),
])
def test_out_of_range_fields_fail_on_encode(msg: Message) -> None:
    with pytest.raises(struct.error):
        encode_message(msg)


# -- hostile input ---------------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=300))
@example(b"")
@example(bytes([codec.VERSION]))
@example(bytes([codec.VERSION, 0]))
@example(bytes([codec.VERSION, 255]))
@example(bytes([2, 16]))
@example(bytes([codec.VERSION, 6]) + b"\xff\xff\xff\xff")  # SYNCTXNS claiming 4 billion transactions
@example(bytes([codec.VERSION, 14]) + b"\0" * 16 + b"\xff\xff\xff\xff")  # REQUEST blob longer than the frame
@example(bytes([codec.VERSION, 1]) + b"\0" * 32 + b"\x09")  # unknown server state
@example(bytes([codec.VERSION, 5, 7]) + b"\0" * 9)  # unknown sync mode
@example(bytes([codec.VERSION, 2]) + b"\0" * 16 + b"\x02" + b"\0" * 8)  # bool byte 2
@example(bytes([codec.VERSION, 16, 0]))  # trailing byte after PING
def test_decode_message_on_random_bytes(data: bytes) -> None:
    result = clean(decode_message, data)
    if not isinstance(result, FrameError):
        # Whatever decodes cleanly is a message that encodes back to the same bytes,
        # unless a bool byte was not 0/1 (struct reads any non-zero as True).
        assert type(result) in MESSAGES
        reencoded = encode_message(result)
        assert decode_message(reencoded) == result


@FUZZ
@given(st.binary(max_size=300))
@example(b"QZAB")
@example(b"QZAB" + struct.pack(">HQH", codec.VERSION, 1, 10) + b"abc")  # name longer than the frame
@example(b"QZAB" + struct.pack(">HQH", codec.VERSION, 1, 2) + b"\xff\xfe")  # not UTF-8
@example(b"QZAB" + struct.pack(">HQH", 99, 1, 0))
@example(b"QZAB" + struct.pack(">HQH", codec.VERSION, 1, 0) + b"x")  # trailing byte
def test_decode_hello_on_random_bytes(data: bytes) -> None:
    result = clean(decode_hello, data)
    if not isinstance(result, FrameError):
        name, sender = result
        assert isinstance(name, str) and 0 <= sender < 2**64


@FUZZ
@given(st.binary(max_size=600), st.integers(min_value=1, max_value=64))
def test_frame_decoder_on_random_bytes(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    try:
        for i in range(0, len(data), chunk):
            for payload in decoder.feed(data[i:i + chunk]):
                clean(decode_message, payload)
    except FrameError:
        pass
    assert decoder.pending_bytes <= 8 + SMALL_MAX_FRAME


@FUZZ
@given(messages)
def test_every_prefix_of_a_valid_encoding(msg: Message) -> None:
    payload = encode_message(msg)
    for n in range(len(payload)):
        with pytest.raises(FrameError):
            decode_message(payload[:n])
    framed = encode_frame(msg)
    for n in range(len(framed)):
        decoder = FrameDecoder(SMALL_MAX_FRAME)
        assert list(decoder.feed(framed[:n])) == []  # incomplete: nothing yet, no error
        assert decoder.pending_bytes == n
    hello = encode_hello("quire", 3)
    for n in range(8, len(hello)):
        with pytest.raises(FrameError):
            decode_hello(hello[8:n])


def _mutations(draw, buf: bytes) -> bytes:
    out = bytearray(buf)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = draw(st.integers(min_value=0, max_value=max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and out:
            out[pos] = draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and out:
            del out[pos:pos + draw(st.integers(min_value=1, max_value=8))]
    return bytes(out)


@FUZZ
@given(messages, st.data())
def test_mutated_payloads(msg: Message, data: st.DataObject) -> None:
    mutated = _mutations(data.draw, encode_message(msg))
    clean(decode_message, mutated)
    clean(decode_hello, mutated)


@FUZZ
@given(st.lists(messages, min_size=1, max_size=4), st.data())
def test_mutated_streams(msgs: list[Message], data: st.DataObject) -> None:
    """A corrupted stream: the CRC catches payload damage, the length check header damage."""
    stream = b"".join(encode_frame(m) for m in msgs)
    mutated = _mutations(data.draw, stream)
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    try:
        got = [decode_message(p) for p in decoder.feed(mutated)]
    except FrameError:
        return
    # Undetected damage is only possible where it hit nothing but whole frames' boundaries.
    for m in got:
        assert type(m) in MESSAGES


@FUZZ
@given(messages, st.data())
def test_mutated_payload_with_valid_crc(msg: Message, data: st.DataObject) -> None:
    """A peer that computes a correct CRC over nonsense (a bug, not line noise) still
    only gets a FrameError."""
    mutated = _mutations(data.draw, encode_message(msg))
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    for payload in decoder.feed(frame(mutated)):
        clean(decode_message, payload)


# -- size limits and allocation --------------------------------------------------------------
@pytest.mark.parametrize("length", [SMALL_MAX_FRAME + 1, 2**31, 2**32 - 1])
def test_oversized_length_header_is_refused_before_buffering(length: int) -> None:
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    with pytest.raises(FrameError, match="exceeds max_frame_bytes"):
        list(decoder.feed(struct.pack(">II", length, 0)))


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    payload = encode_message(Request(1, 2, b"z" * 100))
    decoder = FrameDecoder(max_frame_bytes=len(payload))
    assert [decode_message(p) for p in decoder.feed(frame(payload))] == [Request(1, 2, b"z" * 100)]
    decoder = FrameDecoder(max_frame_bytes=len(payload) - 1)
    with pytest.raises(FrameError):
        list(decoder.feed(frame(payload)))


def test_a_slow_sender_of_an_oversized_header_never_grows_the_buffer() -> None:
    decoder = FrameDecoder(SMALL_MAX_FRAME)
    with pytest.raises(FrameError):
        list(decoder.feed(struct.pack(">I", 2**32 - 1)[:3]))
        list(decoder.feed(struct.pack(">I", 2**32 - 1)[3:] + b"\0" * 4))
    assert decoder.pending_bytes <= 8


@pytest.mark.parametrize("payload", [
    bytes([codec.VERSION, 6]) + b"\xff\xff\xff\xff",  # SYNCTXNS: 4 billion transactions claimed
    bytes([codec.VERSION, 6]) + struct.pack(">I", 1000) + b"\0" * 28 * 2,
    bytes([codec.VERSION, 10]) + b"\0" * 24 + b"\xff\xff\xff\xff",  # PROPOSAL data of 4 GiB
    bytes([codec.VERSION, 5, 2]) + b"\0" * 8 + b"\x01" + b"\xff\xff\xff\xf0",  # SNAP of 4 GiB
    bytes([codec.VERSION, 14]) + b"\0" * 16 + b"\xff\xff\xff\xff",  # REQUEST data of 4 GiB
    b"QZAB" + struct.pack(">HQH", codec.VERSION, 1, 0xFFFF),  # HELLO name of 64 KiB
], ids=["synctxns-count", "synctxns-short", "proposal-data", "snap-blob", "request-data", "hello-name"])
def test_lying_inner_lengths_allocate_nothing_large(payload: bytes) -> None:
    tracemalloc.start()
    try:
        clean(decode_message, payload)
        clean(decode_hello, payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT_BYTES
    with pytest.raises(FrameError):
        decode_message(payload) if not payload.startswith(b"QZAB") else decode_hello(payload)


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_random_bytes_allocate_nothing_large(data: bytes) -> None:
    tracemalloc.start()
    try:
        decoder = FrameDecoder(SMALL_MAX_FRAME)
        try:
            for payload in decoder.feed(data):
                clean(decode_message, payload)
        except FrameError:
            pass
        clean(decode_message, data)
        clean(decode_hello, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_LIMIT_BYTES


@FUZZ
@given(messages)
def test_encoding_is_deterministic_and_crc_protected(msg: Message) -> None:
    framed = encode_frame(msg)
    assert framed == encode_frame(dataclasses.replace(msg))
    length, crc = struct.unpack(">II", framed[:8])
    assert length == len(framed) - 8 and crc == crc32c(framed[8:])
    damaged = framed[:8] + bytes([framed[8] ^ 0x01]) + framed[9:]
    with pytest.raises(FrameError, match="checksum"):
        list(FrameDecoder(SMALL_MAX_FRAME).feed(damaged))
