"""The ZooKeeper client-protocol codec (metastore/wire/jute.py).

Three kinds of evidence that we speak the protocol:
- byte fixtures written by hand from zookeeper.jute (a reader can check each
  field against the spec);
- kazoo's own serializers: what kazoo sends decodes with our decoder into the
  records we expect, and what we send is parsed by kazoo's deserializers into
  the values kazoo's users see;
- round trips of every record, request and reply under hypothesis.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo import exceptions as kz_exceptions
from kazoo.protocol import connection as kz_connection
from kazoo.protocol import serialization as kz
from kazoo.protocol.states import EVENT_TYPE_MAP, ZnodeStat
from kazoo.security import ACL as KzACL
from kazoo.security import Id as KzId

from metastore.wire import jute, jute_records
from metastore.wire.jute_codec import I32, KINDS, REQUEST_HEADER
from metastore.wire.jute import (ACL, REQUEST_BODIES, RESPONSE_BODIES, AuthPacket, CheckResult,
    CheckVersionRequest, ConnectRequest, ConnectResponse, Create2Response, CreateRequest, CreateResponse,
    DeleteRequest, DeleteResult, Err, ErrorResult, EventType, ExistsRequest, ExistsResponse, FrameReader,
    GetACLRequest, GetACLResponse, GetChildren2Request, GetChildren2Response, GetChildrenRequest,
    GetChildrenResponse, GetDataRequest, GetDataResponse, GetSASLRequest, Id, JuteError, KeeperState,
    MultiRequest, MultiResponse, OpCode, ReconfigRequest, ReplyHeader, RequestHeader,
    SetACLRequest, SetACLResponse, SetDataRequest, SetDataResponse, SetSASLResponse, Stat, SyncRequest,
    SyncResponse, UnknownOpcode, WatcherEvent, Xid, decode_connect_request, decode_connect_response,
    decode_notification, decode_record, decode_reply, decode_request, encode_connect_request,
    encode_connect_response, encode_notification, encode_record, encode_reply, encode_request,
    four_letter_word, frame, reply_xid)

from metastore_fixtures import RECORDS, acls, blobs, data, i32, i64, names, paths, request_body, response_body, stats

CHECKS = settings(max_examples=40, deadline=None, database=None, derandomize=True)
ROUND_TRIPS = settings(CHECKS, max_examples=15)  # per record / opcode: about 120 of them
MAX = jute.DEFAULT_MAX_BUFFER_BYTES

def unhex(s: str) -> bytes:
    """Hex digits, with spaces and a "# comment" allowed on each line."""
    return bytes.fromhex("".join(line.split("#")[0].replace(" ", "") for line in s.splitlines()))


OPEN_ACL = (ACL(31, Id("world", "anyone")),)
OPEN_ACL_HEX = "00000001 0000001f 00000005 776f726c64 00000006 616e796f6e65"  # count 1, ALL, "world", "anyone"


# --- the vocabulary ---------------------------------------------------------------------

def test_every_record_has_a_strategy_and_a_schema():
    records = {getattr(jute_records, name) for name in jute_records.__all__}
    assert set(RECORDS) == records
    assert set(KINDS) == records


def test_error_codes_are_kazoos():
    for err in Err:
        assert kz_exceptions.EXCEPTIONS[err.value].code == err.value, err
    assert {code for code in kz_exceptions.EXCEPTIONS} <= {e.value for e in Err}


def test_event_types_and_xids_are_kazoos():
    assert set(EVENT_TYPE_MAP) <= {e.value for e in EventType}
    kazoo_xids = (kz_connection.WATCH_XID, kz_connection.PING_XID, kz_connection.AUTH_XID)
    assert kazoo_xids == (Xid.NOTIFICATION, Xid.PING, Xid.AUTH)
    assert (kz.Ping.type, kz.Close.type, kz.Auth.type, kz.SASL.type) == (
        OpCode.PING, OpCode.CLOSE_SESSION, OpCode.AUTH, OpCode.SASL)


# --- byte fixtures, computed by hand from zookeeper.jute ----------------------------------

KAZOO_NEW_SESSION = unhex("""
    00000000                       # protocolVersion 0
    0000000000000000               # lastZxidSeen 0
    00002710                       # timeOut 10000 ms
    0000000000000000               # sessionId 0: a new session
    00000010 00000000000000000000000000000000   # passwd: 16 zero bytes
""")


def test_connect_request_with_and_without_the_read_only_byte():
    old_client = decode_connect_request(KAZOO_NEW_SESSION)
    assert old_client == ConnectRequest(0, 0, 10000, 0, bytes(16), None)
    assert decode_connect_request(KAZOO_NEW_SESSION + b"\x01").read_only is True
    assert decode_connect_request(KAZOO_NEW_SESSION + b"\x00").read_only is False
    assert encode_connect_request(old_client) == KAZOO_NEW_SESSION
    with pytest.raises(JuteError, match="trailing"):
        decode_connect_request(KAZOO_NEW_SESSION + b"\x00\x00")


def test_connect_response_bytes():
    resp = ConnectResponse(0, 4000, 0x0102030405060708, b"\x11" * 16, False)
    wire = unhex("00000000 00000fa0 0102030405060708 00000010" + "11" * 16 + "00")
    assert encode_connect_response(resp) == wire
    assert decode_connect_response(wire) == resp
    assert decode_connect_response(wire[:-1]) == resp  # a server too old to send the read-only byte


def test_create_request_bytes():
    wire = unhex(f"""
        00000001 00000001             # xid 1, type create
        00000002 2f61                 # path "/a"
        00000002 6869                 # data b"hi"
        {OPEN_ACL_HEX}
        00000001                      # flags EPHEMERAL
    """)
    request = (RequestHeader(1, OpCode.CREATE), CreateRequest("/a", b"hi", OPEN_ACL, 1))
    assert decode_request(wire) == request
    assert encode_request(*request) == wire


def test_multi_with_a_check_and_a_create_bytes():
    wire = unhex(f"""
        00000007 0000000e                       # xid 7, type multi
        0000000d 00 ffffffff                    # MultiHeader(check, done=false, err=-1)
        00000002 2f61 00000003                  # CheckVersionRequest("/a", 3)
        00000001 00 ffffffff                    # MultiHeader(create, false, -1)
        00000004 2f612f62 00000000 {OPEN_ACL_HEX} 00000000   # CreateRequest("/a/b", b"", OPEN, PERSISTENT)
        ffffffff 01 ffffffff                    # MultiHeader(-1, done=true, -1)
    """)
    ops = ((OpCode.CHECK, CheckVersionRequest("/a", 3)), (OpCode.CREATE, CreateRequest("/a/b", b"", OPEN_ACL, 0)))
    assert decode_request(wire) == (RequestHeader(7, OpCode.MULTI), MultiRequest(ops))
    assert encode_request(RequestHeader(7, OpCode.MULTI), MultiRequest(ops)) == wire


def test_multi_response_bytes():
    ok = MultiResponse((CheckResult(), CreateResponse("/a/b")))
    assert encode_reply(ReplyHeader(7, 9, 0), ok) == unhex("""
        00000007 0000000000000009 00000000      # ReplyHeader(7, zxid 9, OK)
        0000000d 00 00000000                    # check result: no body
        00000001 00 00000000 00000004 2f612f62  # create result "/a/b"
        ffffffff 01 ffffffff
    """)
    failed = MultiResponse((ErrorResult(Err.BAD_VERSION), ErrorResult(Err.RUNTIME_INCONSISTENCY)))
    wire = unhex("""
        00000007 0000000000000009 00000000      # a failed multi is still err 0 in the ReplyHeader
        ffffffff 00 ffffff99 ffffff99           # error -103 (BadVersion), in the header and the body
        ffffffff 00 fffffffe fffffffe           # error -2: not run
        ffffffff 01 ffffffff
    """)
    assert encode_reply(ReplyHeader(7, 9, 0), failed) == wire
    assert decode_reply(wire, OpCode.MULTI) == (ReplyHeader(7, 9, 0), failed)


def test_error_reply_bytes():
    wire = unhex("00000005 0000000100000002 ffffff9b")  # xid 5, zxid 0x100000002, err -101 NoNode
    assert encode_reply(ReplyHeader(5, 0x1_0000_0002, Err.NO_NODE)) == wire
    assert decode_reply(wire, OpCode.GET_DATA) == (ReplyHeader(5, 0x1_0000_0002, -101), None)
    # Some ZooKeeper versions follow an error header with an empty record: ignored.
    assert decode_reply(wire + unhex("ffffffff"), OpCode.CREATE)[1] is None
    with pytest.raises(ValueError, match="no body"):
        encode_reply(ReplyHeader(5, 1, Err.NO_NODE), SetDataResponse(Stat()))


def test_notification_bytes():
    event = WatcherEvent(EventType.NODE_DATA_CHANGED, KeeperState.SYNC_CONNECTED, "/a")
    wire = unhex("ffffffff ffffffffffffffff 00000000  00000003 00000003 00000002 2f61")
    assert encode_notification(event) == wire
    assert reply_xid(wire) == Xid.NOTIFICATION
    assert decode_notification(wire) == event
    with pytest.raises(JuteError, match="not a notification"):
        decode_notification(encode_reply(ReplyHeader(3, 1, 0)))


def test_requests_without_a_body():
    for xid, op in ((Xid.PING, OpCode.PING), (12, OpCode.CLOSE_SESSION), (13, OpCode.WHO_AM_I)):
        wire = unhex("%08x %08x" % (xid & 0xFFFFFFFF, op & 0xFFFFFFFF))
        assert decode_request(wire) == (RequestHeader(xid, op), None)
        assert encode_request(RequestHeader(xid, op)) == wire


def test_malformed_fields_say_what_is_wrong():
    exists = unhex("00000001 00000003 00000002 2f61")  # xid 1, exists "/a", then the watch byte
    assert decode_request(exists + b"\x01")[1] == ExistsRequest("/a", True)
    with pytest.raises(JuteError, match="EXISTS request xid=1: boolean byte at offset 14 is 2"):
        decode_request(exists + b"\x02")
    with pytest.raises(JuteError, match="truncated boolean"):
        decode_request(exists)
    with pytest.raises(JuteError, match="runs past the end"):
        decode_request(unhex("00000001 00000009 00000003 2f61"))  # sync: a 3-byte path with 2 bytes left
    with pytest.raises(JuteError, match="negative length -2"):
        decode_request(unhex("00000001 00000009 fffffffe"))
    with pytest.raises(JuteError, match="not UTF-8"):
        decode_request(unhex("00000001 00000009 00000001 ff"))
    with pytest.raises(JuteError, match="trailing"):
        decode_request(unhex("00000001 00000009 00000001 2f 00"))
    assert decode_request(unhex("00000001 00000009 ffffffff"))[1] == SyncRequest("")  # null reads as ""


def test_unknown_and_server_only_opcodes_carry_the_xid():
    for op in (999, OpCode.DELETE_CONTAINER, OpCode.CREATE_SESSION, OpCode.NOTIFICATION, OpCode.ERROR):
        with pytest.raises(UnknownOpcode) as caught:
            decode_request(unhex("0000002a") + I32.pack(op) + b"anything")
        assert (caught.value.xid, caught.value.opcode) == (42, op)
        assert isinstance(caught.value, JuteError)


def test_multi_rejects_ops_of_the_other_kind():
    mixed = MultiRequest(((OpCode.GET_DATA, GetDataRequest("/a", False)),))
    payload = encode_request(RequestHeader(1, OpCode.MULTI_READ), mixed)
    as_multi = payload[:4] + I32.pack(OpCode.MULTI) + payload[8:]
    with pytest.raises(JuteError, match="cannot hold"):
        decode_request(as_multi)
    with pytest.raises(TypeError):
        encode_request(RequestHeader(1, OpCode.CREATE), DeleteRequest("/a", -1))


def test_four_letter_words():
    assert four_letter_word(b"ruok") == "ruok"
    assert four_letter_word(b"envi") == "envi"
    assert four_letter_word(b"\x00\x00\x00\x2d") is None  # a 45-byte ConnectRequest frame
    assert four_letter_word(b"RUOK") is None
    for word in jute.FOUR_LETTER_WORDS:
        assert I32.unpack(word.encode())[0] > jute.DEFAULT_MAX_FRAME_BYTES


def test_frames_split_anywhere():
    payloads = [b"", b"x", KAZOO_NEW_SESSION, bytes(300)]
    stream = b"".join(frame(p) for p in payloads)
    for cut in range(len(stream) + 1):
        reader = FrameReader()
        assert reader.feed(stream[:cut]) + reader.feed(stream[cut:]) == payloads
        assert reader.pending_bytes == 0
    reader = FrameReader()
    assert [p for b in stream for p in reader.feed(bytes([b]))] == payloads


def test_frame_reader_rejects_negative_and_oversized_lengths():
    with pytest.raises(JuteError, match="outside"):
        FrameReader().feed(unhex("ffffffff 00"))
    with pytest.raises(JuteError, match="outside"):
        FrameReader(max_bytes=100).feed(unhex("00000065"))
    assert FrameReader(max_bytes=100).feed(frame(bytes(100))) == [bytes(100)]
    with pytest.raises(JuteError):  # "ruok" read as a length: 1.9 GB
        FrameReader().feed(b"ruok")


# --- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
@ROUND_TRIPS
@given(data=st.data())
def test_every_record_round_trips(cls, data):
    rec = data.draw(RECORDS[cls])
    assert decode_record(cls, bytes(encode_record(rec)), MAX) == rec


@pytest.mark.parametrize("op", list(REQUEST_BODIES), ids=lambda op: op.name)
@ROUND_TRIPS
@given(data=st.data(), xid=i32)
def test_every_request_round_trips(op, data, xid):
    body = data.draw(request_body(op))
    assert decode_request(encode_request(RequestHeader(xid, op), body)) == (RequestHeader(xid, op), body)


@pytest.mark.parametrize("op", list(RESPONSE_BODIES), ids=lambda op: op.name)
@ROUND_TRIPS
@given(data=st.data(), header=st.builds(ReplyHeader, i32, i64, st.just(0)))
def test_every_reply_round_trips(op, data, header):
    body = data.draw(response_body(op))
    assert decode_reply(encode_reply(header, body), op) == (header, body)


# --- kazoo's bytes -> our decoder ----------------------------------------------------------------

def kazoo_request(request, xid: int = 1) -> bytes:
    """The payload kazoo's connection writes for a request (ConnectionHandler._submit)."""
    return REQUEST_HEADER.pack(xid, request.type) + bytes(request.serialize())


def as_kazoo_acls(acl: tuple[ACL, ...]) -> list:
    return [KzACL(a.perms, KzId(a.id.scheme, a.id.id)) for a in acl]


def decoded(request) -> object:
    header, body = decode_request(kazoo_request(request))
    assert header == RequestHeader(1, request.type)
    return body


@CHECKS
@given(path=paths, value=data, acl=acls, flags=i32, version=i32, watch=st.booleans())
def test_kazoo_requests_decode(path, value, acl, flags, version, watch):
    watcher = (lambda event: None) if watch else None
    assert decoded(kz.Create(path, value, as_kazoo_acls(acl), flags)) == CreateRequest(path, value, acl, flags)
    assert decoded(kz.Create2(path, value, as_kazoo_acls(acl), flags)) == CreateRequest(path, value, acl, flags)
    assert decoded(kz.Delete(path, version)) == DeleteRequest(path, version)
    assert decoded(kz.Exists(path, watcher)) == ExistsRequest(path, watch)
    assert decoded(kz.GetData(path, watcher)) == GetDataRequest(path, watch)
    assert decoded(kz.SetData(path, value, version)) == SetDataRequest(path, value, version)
    assert decoded(kz.GetACL(path)) == GetACLRequest(path)
    assert decoded(kz.SetACL(path, as_kazoo_acls(acl), version)) == SetACLRequest(path, acl, version)
    assert decoded(kz.GetChildren(path, watcher)) == GetChildrenRequest(path, watch)
    assert decoded(kz.GetChildren2(path, watcher)) == GetChildren2Request(path, watch)
    assert decoded(kz.Sync(path)) == SyncRequest(path)
    assert decoded(kz.CheckVersion(path, version)) == CheckVersionRequest(path, version)


@CHECKS
@given(ops=st.lists(st.sampled_from(["create", "delete", "set", "check"]), max_size=5), path=paths, value=blobs)
def test_kazoo_transactions_decode(ops, path, value):
    kazoo_ops = {"create": kz.Create(path, value, as_kazoo_acls(OPEN_ACL), 2), "delete": kz.Delete(path, 4),
                 "set": kz.SetData(path, value, -1), "check": kz.CheckVersion(path, 7)}
    ours = {"create": (OpCode.CREATE, CreateRequest(path, value, OPEN_ACL, 2)),
            "delete": (OpCode.DELETE, DeleteRequest(path, 4)),
            "set": (OpCode.SET_DATA, SetDataRequest(path, value, -1)),
            "check": (OpCode.CHECK, CheckVersionRequest(path, 7))}
    transaction = kz.Transaction([kazoo_ops[op] for op in ops])
    assert decoded(transaction) == MultiRequest(tuple(ours[op] for op in ops))


@CHECKS
@given(last_zxid=i64, timeout=i32, session=i64, passwd=st.binary(min_size=16, max_size=16),
       read_only=st.booleans())
def test_kazoo_connect_decodes(last_zxid, timeout, session, passwd, read_only):
    connect = kz.Connect(0, last_zxid, timeout, session, passwd, read_only)
    assert decode_connect_request(bytes(connect.serialize())) == ConnectRequest(
        0, last_zxid, timeout, session, passwd, read_only)


def test_kazoo_session_requests_decode():
    assert decode_request(kazoo_request(kz.PingInstance, Xid.PING)) == (RequestHeader(-2, OpCode.PING), None)
    assert decode_request(kazoo_request(kz.CloseInstance, 9)) == (RequestHeader(9, OpCode.CLOSE_SESSION), None)
    header, body = decode_request(kazoo_request(kz.Auth(0, "digest", "user:secret"), Xid.AUTH))
    assert (header, body) == (RequestHeader(-4, OpCode.AUTH), AuthPacket(0, "digest", b"user:secret"))
    assert decoded(kz.SASL(b"token")) == GetSASLRequest(b"token")
    assert decoded(kz.Reconfig("server.4=h:2888:3888;2181", None, "", -1)) == ReconfigRequest(
        "server.4=h:2888:3888;2181", None, None, -1)  # kazoo writes "" as null


# --- our bytes -> kazoo's deserializers -------------------------------------------------------------

def kazoo_reads(request_cls, payload: bytes):
    """What kazoo's connection makes of a reply (ConnectionHandler._read_response)."""
    header, offset = kz.ReplyHeader.deserialize(payload, 0)
    assert header.err == 0
    return request_cls.deserialize(payload, offset)


def znode_stat(stat: Stat) -> ZnodeStat:
    return ZnodeStat(*dataclasses.astuple(stat))


def reply(body) -> bytes:
    return encode_reply(ReplyHeader(3, 77, Err.OK), body)


@CHECKS
@given(path=paths, value=data, stat=stats, acl=acls, children=names)
def test_kazoo_reads_our_replies(path, value, stat, acl, children):
    zstat = znode_stat(stat)
    assert kazoo_reads(kz.Create, reply(CreateResponse(path))) == path
    assert kazoo_reads(kz.Create2, reply(Create2Response(path, stat))) == (path, zstat)
    assert kazoo_reads(kz.Exists, reply(ExistsResponse(stat))) == (zstat if stat.czxid != -1 else None)
    assert kazoo_reads(kz.GetData, reply(GetDataResponse(value, stat))) == (value, zstat)
    assert kazoo_reads(kz.SetData, reply(SetDataResponse(stat))) == zstat
    assert kazoo_reads(kz.GetACL, reply(GetACLResponse(acl, stat))) == (as_kazoo_acls(acl), zstat)
    assert kazoo_reads(kz.SetACL, reply(SetACLResponse(stat))) == zstat
    assert kazoo_reads(kz.GetChildren, reply(GetChildrenResponse(children))) == list(children)
    assert kazoo_reads(kz.GetChildren2, reply(GetChildren2Response(children, stat))) == (list(children), zstat)
    assert kazoo_reads(kz.Sync, reply(SyncResponse(path))) == path
    assert kazoo_reads(kz.Reconfig, reply(GetDataResponse(value, stat))) == (value, zstat)
    assert kazoo_reads(kz.SASL, reply(SetSASLResponse(value)))[0] == value


KAZOO_RESULTS = st.one_of(RECORDS[CreateResponse], st.just(DeleteResult()), RECORDS[SetDataResponse],
                          st.just(CheckResult()), st.sampled_from(list(Err)).map(ErrorResult))


def kazoo_result(result):
    """What kazoo's Transaction.deserialize yields for each result."""
    match result:
        case CreateResponse(path=path):
            return path
        case SetDataResponse(stat=stat):
            return znode_stat(stat)
        case ErrorResult(err=err):
            return kz_exceptions.EXCEPTIONS[err]
    return True


@CHECKS
@given(results=st.lists(KAZOO_RESULTS, max_size=5))
def test_kazoo_reads_our_multi_replies(results):
    parsed = kazoo_reads(kz.Transaction, reply(MultiResponse(tuple(results))))
    parsed = [type(p) if isinstance(p, Exception) else p for p in parsed]
    assert parsed == [kazoo_result(r) for r in results]


@CHECKS
@given(timeout=i32, session=i64, passwd=st.binary(min_size=16, max_size=16), read_only=st.booleans())
def test_kazoo_reads_our_connect_response(timeout, session, passwd, read_only):
    payload = encode_connect_response(ConnectResponse(0, timeout, session, passwd, read_only))
    connect, offset = kz.Connect.deserialize(payload, 0)
    assert connect == kz.Connect(0, 0, timeout, session, passwd, read_only)
    assert offset == len(payload)


@CHECKS
@given(event=st.builds(WatcherEvent, st.sampled_from(list(EventType)), st.sampled_from(list(KeeperState)), paths))
def test_kazoo_reads_our_notifications(event):
    payload = encode_notification(event)
    header, offset = kz.ReplyHeader.deserialize(payload, 0)
    assert header.xid == kz_connection.WATCH_XID
    watch, end = kz.Watch.deserialize(payload, offset)
    assert (watch, end) == (kz.Watch(event.type, event.state, event.path), len(payload))


def test_kazoo_reads_our_special_replies():
    ping = kz.ReplyHeader.deserialize(encode_reply(ReplyHeader(Xid.PING, 5, 0)), 0)
    assert ping == (kz.ReplyHeader(-2, 5, 0), 16)
    failed_auth = kz.ReplyHeader.deserialize(encode_reply(ReplyHeader(Xid.AUTH, 5, Err.AUTH_FAILED)), 0)[0]
    assert kz_exceptions.EXCEPTIONS[failed_auth.err] is kz_exceptions.AuthFailedError
    no_node = kz.ReplyHeader.deserialize(encode_reply(ReplyHeader(4, 5, Err.NO_NODE)), 0)[0]
    assert kz_exceptions.EXCEPTIONS[no_node.err] is kz_exceptions.NoNodeError
