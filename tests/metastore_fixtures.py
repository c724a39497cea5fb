"""Shared by the metastore's codec tests: hypothesis strategies for every jute record and
body (the client protocol's wire records), and `answer`, a request answered as the leader would."""

from __future__ import annotations

from hypothesis import strategies as st

from metastore.core.state_machine import MetastoreStateMachine
from metastore.wire.jute import (ACL, REQUEST_BODIES, RESPONSE_BODIES, AddWatchRequest, AuthPacket,
    CheckResult, CheckVersionRequest, CheckWatchesRequest, ClientInfo, ConnectRequest, ConnectResponse,
    Create2Response, CreateRequest, CreateResponse, CreateTTLRequest, DeleteRequest, DeleteResult,
    ErrorResponse, ErrorResult, ExistsRequest, ExistsResponse, GetACLRequest, GetACLResponse,
    GetAllChildrenNumberRequest, GetAllChildrenNumberResponse, GetChildren2Request, GetChildren2Response,
    GetChildrenRequest, GetChildrenResponse, GetDataRequest, GetDataResponse, GetEphemeralsRequest,
    GetEphemeralsResponse, GetSASLRequest, Id, MultiHeader, MultiRequest, MultiResponse, OpCode,
    ReconfigRequest, RemoveWatchesRequest, ReplyHeader, RequestHeader, SetACLRequest, SetACLResponse,
    SetDataRequest, SetDataResponse, SetSASLResponse, SetWatches, SetWatches2, Stat, SyncRequest,
    SyncResponse, WatcherEvent, WhoAmIResponse)

from zab.core.statemachine import Refusal


def answer(sm: MetastoreStateMachine, zxid: int, session: int, request: bytes):
    """What a client gets, as the leader would do it: a refusal spends no zxid and is answered
    after everything before it (here: applied at once)."""
    prepared = sm.prepare(zxid, session, request)
    if isinstance(prepared, Refusal):
        return sm.refused(sm.last_zxid, prepared.data)
    return sm.apply(zxid, prepared)


# --- strategies: one per record ------------------------------------------------------

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)
paths = st.text(min_size=1, max_size=12).map(lambda s: "/" + s)
blobs = st.binary(max_size=24)
data = st.none() | blobs
stats = st.builds(Stat, i64, i64, i64, i64, i32, i32, i32, i64, i32, i32, i64)
ids = st.builds(Id, text, text)
acls = st.lists(st.builds(ACL, i32, ids), max_size=3).map(tuple)
names = st.lists(text, max_size=4).map(tuple)
opt_text = st.none() | text

RECORDS: dict[type, st.SearchStrategy] = {
    Stat: stats, Id: ids, ACL: st.builds(ACL, i32, ids), ClientInfo: st.builds(ClientInfo, text, text),
    ConnectRequest: st.builds(ConnectRequest, i32, i64, i32, i64, blobs, st.none() | st.booleans()),
    ConnectResponse: st.builds(ConnectResponse, i32, i32, i64, blobs, st.booleans()),
    RequestHeader: st.builds(RequestHeader, i32, i32), ReplyHeader: st.builds(ReplyHeader, i32, i64, i32),
    MultiHeader: st.builds(MultiHeader, i32, st.booleans(), i32),
    AuthPacket: st.builds(AuthPacket, i32, text, blobs), WatcherEvent: st.builds(WatcherEvent, i32, i32, text),
    ErrorResponse: st.builds(ErrorResponse, i32), ErrorResult: st.builds(ErrorResult, i32),
    SetWatches: st.builds(SetWatches, i64, names, names, names),
    SetWatches2: st.builds(SetWatches2, i64, names, names, names, names, names),
    CreateRequest: st.builds(CreateRequest, paths, data, acls, i32),
    CreateTTLRequest: st.builds(CreateTTLRequest, paths, data, acls, i32, i64),
    CreateResponse: st.builds(CreateResponse, paths), Create2Response: st.builds(Create2Response, paths, stats),
    DeleteRequest: st.builds(DeleteRequest, paths, i32), ExistsRequest: st.builds(ExistsRequest, paths, st.booleans()),
    ExistsResponse: st.builds(ExistsResponse, stats),
    GetDataRequest: st.builds(GetDataRequest, paths, st.booleans()),
    GetDataResponse: st.builds(GetDataResponse, data, stats),
    SetDataRequest: st.builds(SetDataRequest, paths, data, i32), SetDataResponse: st.builds(SetDataResponse, stats),
    GetACLRequest: st.builds(GetACLRequest, paths), GetACLResponse: st.builds(GetACLResponse, acls, stats),
    SetACLRequest: st.builds(SetACLRequest, paths, acls, i32), SetACLResponse: st.builds(SetACLResponse, stats),
    GetChildrenRequest: st.builds(GetChildrenRequest, paths, st.booleans()),
    GetChildrenResponse: st.builds(GetChildrenResponse, names),
    GetChildren2Request: st.builds(GetChildren2Request, paths, st.booleans()),
    GetChildren2Response: st.builds(GetChildren2Response, names, stats),
    SyncRequest: st.builds(SyncRequest, paths), SyncResponse: st.builds(SyncResponse, paths),
    CheckVersionRequest: st.builds(CheckVersionRequest, paths, i32),
    CheckWatchesRequest: st.builds(CheckWatchesRequest, paths, i32),
    RemoveWatchesRequest: st.builds(RemoveWatchesRequest, paths, i32),
    AddWatchRequest: st.builds(AddWatchRequest, paths, i32),
    GetEphemeralsRequest: st.builds(GetEphemeralsRequest, text),
    GetEphemeralsResponse: st.builds(GetEphemeralsResponse, names),
    GetAllChildrenNumberRequest: st.builds(GetAllChildrenNumberRequest, paths),
    GetAllChildrenNumberResponse: st.builds(GetAllChildrenNumberResponse, i32),
    WhoAmIResponse: st.builds(WhoAmIResponse, st.lists(st.builds(ClientInfo, text, text), max_size=3).map(tuple)),
    ReconfigRequest: st.builds(ReconfigRequest, opt_text, opt_text, opt_text, i64),
    GetSASLRequest: st.builds(GetSASLRequest, data), SetSASLResponse: st.builds(SetSASLResponse, data),
    DeleteResult: st.just(DeleteResult()), CheckResult: st.just(CheckResult()),
}


def _op(codes: list[OpCode], cls: type) -> st.SearchStrategy:
    return st.tuples(st.sampled_from(codes), RECORDS[cls])


write_ops = st.one_of(
    _op([OpCode.CREATE, OpCode.CREATE2, OpCode.CREATE_CONTAINER], CreateRequest),
    _op([OpCode.CREATE_TTL], CreateTTLRequest), _op([OpCode.DELETE], DeleteRequest),
    _op([OpCode.SET_DATA], SetDataRequest), _op([OpCode.CHECK], CheckVersionRequest))
read_ops = st.one_of(_op([OpCode.GET_DATA], GetDataRequest), _op([OpCode.GET_CHILDREN], GetChildrenRequest))
multi_requests = st.lists(write_ops, max_size=4).map(lambda ops: MultiRequest(tuple(ops)))
multi_read_requests = st.lists(read_ops, max_size=4).map(lambda ops: MultiRequest(tuple(ops)))
multi_results = st.one_of(*(RECORDS[c] for c in (CreateResponse, Create2Response, DeleteResult, SetDataResponse,
                                                 CheckResult, GetDataResponse, GetChildrenResponse, ErrorResult)))
RECORDS[MultiRequest] = multi_requests | multi_read_requests
RECORDS[MultiResponse] = st.lists(multi_results, max_size=4).map(lambda rs: MultiResponse(tuple(rs)))


def request_body(op: OpCode) -> st.SearchStrategy:
    if op == OpCode.MULTI:
        return multi_requests
    if op == OpCode.MULTI_READ:
        return multi_read_requests
    cls = REQUEST_BODIES[op]
    return RECORDS[cls] if cls is not None else st.none()


def response_body(op: OpCode) -> st.SearchStrategy:
    cls = RESPONSE_BODIES[op]
    return RECORDS[cls] if cls is not None else st.none()
