"""The records of the ZooKeeper client protocol, as dataclasses.

Names and field order follow zookeeper.jute (modules org.apache.zookeeper.data
and org.apache.zookeeper.proto), fields in Python spelling (`lastZxidSeen` ->
last_zxid_seen). Their byte layouts live in metastore/wire/jute_codec.py.

Conventions for values jute can mark null (length -1):
- `buffer` fields that carry znode data keep null as None (ZooKeeper tells a
  null payload from an empty one, and kazoo shows None); other buffers decode
  null as b"".
- `ustring` fields decode null as "" (kazoo writes every empty string as null),
  except ReconfigRequest's, where null means "not given" and stays None.
- `vector` fields decode null as () and are tuples, so records stay hashable.
Encoders write what the record holds: None as -1, "" and () as length 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from metastore.core.acl import ACL, Id  # the ACL model's records are the wire's records too
from metastore.core.stat import Stat

__all__ = [
    "Stat", "Id", "ACL", "ClientInfo", "ConnectRequest", "ConnectResponse", "RequestHeader", "ReplyHeader",
    "MultiHeader", "AuthPacket", "WatcherEvent", "ErrorResponse", "SetWatches", "SetWatches2",
    "CreateRequest", "CreateTTLRequest", "CreateResponse", "Create2Response", "DeleteRequest",
    "ExistsRequest", "ExistsResponse", "GetDataRequest", "GetDataResponse", "SetDataRequest",
    "SetDataResponse", "GetACLRequest", "GetACLResponse", "SetACLRequest", "SetACLResponse",
    "GetChildrenRequest", "GetChildrenResponse", "GetChildren2Request", "GetChildren2Response",
    "SyncRequest", "SyncResponse", "CheckVersionRequest", "CheckWatchesRequest", "RemoveWatchesRequest",
    "AddWatchRequest", "GetEphemeralsRequest", "GetEphemeralsResponse", "GetAllChildrenNumberRequest",
    "GetAllChildrenNumberResponse", "WhoAmIResponse", "ReconfigRequest", "GetSASLRequest", "SetSASLResponse",
    "DeleteResult", "CheckResult", "ErrorResult", "MultiRequest", "MultiResponse",
]


def _record(cls):
    # Slots and a field hash, but not frozen: a frozen dataclass's __init__ sets each field through
    # object.__setattr__, about 3x the cost of a plain one, and records are built for every request.
    # Records are never changed after they are built (treat them as immutable).
    return dataclass(slots=True, unsafe_hash=True)(cls)


# --- org.apache.zookeeper.data -------------------------------------------------

@_record
class ClientInfo:
    auth_scheme: str
    user: str


# --- handshake and envelopes ---------------------------------------------------

@_record
class ConnectRequest:
    """The first frame a client sends, with no RequestHeader."""

    protocol_version: int
    last_zxid_seen: int
    time_out: int  # requested session timeout, ms
    session_id: int  # 0 for a new session
    passwd: bytes
    read_only: bool | None = None  # None: an old client that does not send the byte


@_record
class ConnectResponse:
    """The first frame a server sends, with no ReplyHeader. time_out <= 0 means the session expired."""

    protocol_version: int
    time_out: int  # negotiated session timeout, ms
    session_id: int
    passwd: bytes
    read_only: bool = False


@_record
class RequestHeader:
    xid: int
    type: int  # OpCode; decode_request returns an OpCode member


@_record
class ReplyHeader:
    xid: int
    zxid: int  # the server's last committed zxid when it answered
    err: int   # Err


@_record
class MultiHeader:
    type: int
    done: bool
    err: int


@_record
class AuthPacket:
    type: int  # always 0 in practice
    scheme: str
    auth: bytes


@_record
class WatcherEvent:
    type: int   # EventType
    state: int  # KeeperState
    path: str


@_record
class ErrorResponse:
    """The body of an addWatch reply (always err 0) and of a failed multi op."""

    err: int


@_record
class SetWatches:
    relative_zxid: int
    data_watches: tuple[str, ...]
    exist_watches: tuple[str, ...]
    child_watches: tuple[str, ...]


@_record
class SetWatches2:
    relative_zxid: int
    data_watches: tuple[str, ...]
    exist_watches: tuple[str, ...]
    child_watches: tuple[str, ...]
    persistent_watches: tuple[str, ...]
    persistent_recursive_watches: tuple[str, ...]


# --- operations ------------------------------------------------------------------

@_record
class CreateRequest:
    """create, create2 and createContainer (the opcode tells which)."""

    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    flags: int  # CreateMode


@_record
class CreateTTLRequest:
    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    flags: int
    ttl: int  # ms


@_record
class CreateResponse:
    path: str  # the created path (with the sequence suffix, if any)


@_record
class Create2Response:
    path: str
    stat: Stat


@_record
class DeleteRequest:
    path: str
    version: int  # -1: any version


@_record
class ExistsRequest:
    path: str
    watch: bool


@_record
class ExistsResponse:
    stat: Stat


@_record
class GetDataRequest:
    path: str
    watch: bool


@_record
class GetDataResponse:
    data: bytes | None
    stat: Stat


@_record
class SetDataRequest:
    path: str
    data: bytes | None
    version: int  # -1: any version


@_record
class SetDataResponse:
    stat: Stat


@_record
class GetACLRequest:
    path: str


@_record
class GetACLResponse:
    acl: tuple[ACL, ...]
    stat: Stat


@_record
class SetACLRequest:
    path: str
    acl: tuple[ACL, ...]
    version: int  # expected aversion, -1: any


@_record
class SetACLResponse:
    stat: Stat


@_record
class GetChildrenRequest:
    path: str
    watch: bool


@_record
class GetChildrenResponse:
    children: tuple[str, ...]


@_record
class GetChildren2Request:
    path: str
    watch: bool


@_record
class GetChildren2Response:
    children: tuple[str, ...]
    stat: Stat


@_record
class SyncRequest:
    path: str


@_record
class SyncResponse:
    path: str


@_record
class CheckVersionRequest:
    path: str
    version: int


@_record
class CheckWatchesRequest:
    path: str
    type: int  # WatcherType


@_record
class RemoveWatchesRequest:
    path: str
    type: int  # WatcherType


@_record
class AddWatchRequest:
    path: str
    mode: int  # AddWatchMode


@_record
class GetEphemeralsRequest:
    prefix_path: str


@_record
class GetEphemeralsResponse:
    ephemerals: tuple[str, ...]


@_record
class GetAllChildrenNumberRequest:
    path: str


@_record
class GetAllChildrenNumberResponse:
    total_number: int


@_record
class WhoAmIResponse:
    client_info: tuple[ClientInfo, ...]


@_record
class ReconfigRequest:
    """Decoded so that a server can answer it (Quire answers RECONFIG_DISABLED)."""

    joining_servers: str | None
    leaving_servers: str | None
    new_members: str | None
    cur_config_id: int


@_record
class GetSASLRequest:
    """The body of a sasl request: the client's SASL token (metastore/edge/sasl_edge.py)."""

    token: bytes | None


@_record
class SetSASLResponse:
    token: bytes | None


# --- multi -------------------------------------------------------------------------

@_record
class DeleteResult:
    """A delete op's result inside a MultiResponse (it has no body)."""


@_record
class CheckResult:
    """A check op's result inside a MultiResponse (it has no body)."""


@_record
class ErrorResult:
    """A multi op that did not take effect: the op that failed carries its error; ops
    before it carry 0 (they succeeded, then were rolled back), ops after it
    RUNTIME_INCONSISTENCY (not run). kazoo turns 0 into RolledBackError."""

    err: int


@_record
class MultiRequest:
    """multi (create, create2, createContainer, createTTL, delete, setData, check ops)
    or multiRead (getData and getChildren ops): pairs of (op code, request record)."""

    ops: tuple[tuple[int, object], ...]


@_record
class MultiResponse:
    """One result per op, in order: CreateResponse (create), Create2Response (create2,
    createContainer, createTTL), DeleteResult, SetDataResponse, CheckResult,
    GetDataResponse, GetChildrenResponse or ErrorResult."""

    results: tuple[object, ...]
