"""The records of the ZooKeeper client protocol, as frozen dataclasses.

Names and field order follow zookeeper.jute (modules org.apache.zookeeper.data
and org.apache.zookeeper.proto), fields in Python spelling (`lastZxidSeen` ->
last_zxid_seen). Their byte layouts live in metastore/jute_codec.py.

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

from metastore.acl import ACL, Id  # the ACL model's records are the wire's records too
from metastore.stat import Stat

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


def _frozen(cls):
    return dataclass(frozen=True, slots=True)(cls)


# --- org.apache.zookeeper.data -------------------------------------------------

@_frozen
class ClientInfo:
    auth_scheme: str
    user: str


# --- handshake and envelopes ---------------------------------------------------

@_frozen
class ConnectRequest:
    """The first frame a client sends, with no RequestHeader."""

    protocol_version: int
    last_zxid_seen: int
    time_out: int  # requested session timeout, ms
    session_id: int  # 0 for a new session
    passwd: bytes
    read_only: bool | None = None  # None: an old client that does not send the byte


@_frozen
class ConnectResponse:
    """The first frame a server sends, with no ReplyHeader. time_out <= 0 means the session expired."""

    protocol_version: int
    time_out: int  # negotiated session timeout, ms
    session_id: int
    passwd: bytes
    read_only: bool = False


@_frozen
class RequestHeader:
    xid: int
    type: int  # OpCode; decode_request returns an OpCode member


@_frozen
class ReplyHeader:
    xid: int
    zxid: int  # the server's last committed zxid when it answered
    err: int   # Err


@_frozen
class MultiHeader:
    type: int
    done: bool
    err: int


@_frozen
class AuthPacket:
    type: int  # always 0 in practice
    scheme: str
    auth: bytes


@_frozen
class WatcherEvent:
    type: int   # EventType
    state: int  # KeeperState
    path: str


@_frozen
class ErrorResponse:
    """The body of an addWatch reply (always err 0) and of a failed multi op."""

    err: int


@_frozen
class SetWatches:
    relative_zxid: int
    data_watches: tuple[str, ...]
    exist_watches: tuple[str, ...]
    child_watches: tuple[str, ...]


@_frozen
class SetWatches2:
    relative_zxid: int
    data_watches: tuple[str, ...]
    exist_watches: tuple[str, ...]
    child_watches: tuple[str, ...]
    persistent_watches: tuple[str, ...]
    persistent_recursive_watches: tuple[str, ...]


# --- operations ------------------------------------------------------------------

@_frozen
class CreateRequest:
    """create, create2 and createContainer (the opcode tells which)."""

    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    flags: int  # CreateMode


@_frozen
class CreateTTLRequest:
    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    flags: int
    ttl: int  # ms


@_frozen
class CreateResponse:
    path: str  # the created path (with the sequence suffix, if any)


@_frozen
class Create2Response:
    path: str
    stat: Stat


@_frozen
class DeleteRequest:
    path: str
    version: int  # -1: any version


@_frozen
class ExistsRequest:
    path: str
    watch: bool


@_frozen
class ExistsResponse:
    stat: Stat


@_frozen
class GetDataRequest:
    path: str
    watch: bool


@_frozen
class GetDataResponse:
    data: bytes | None
    stat: Stat


@_frozen
class SetDataRequest:
    path: str
    data: bytes | None
    version: int  # -1: any version


@_frozen
class SetDataResponse:
    stat: Stat


@_frozen
class GetACLRequest:
    path: str


@_frozen
class GetACLResponse:
    acl: tuple[ACL, ...]
    stat: Stat


@_frozen
class SetACLRequest:
    path: str
    acl: tuple[ACL, ...]
    version: int  # expected aversion, -1: any


@_frozen
class SetACLResponse:
    stat: Stat


@_frozen
class GetChildrenRequest:
    path: str
    watch: bool


@_frozen
class GetChildrenResponse:
    children: tuple[str, ...]


@_frozen
class GetChildren2Request:
    path: str
    watch: bool


@_frozen
class GetChildren2Response:
    children: tuple[str, ...]
    stat: Stat


@_frozen
class SyncRequest:
    path: str


@_frozen
class SyncResponse:
    path: str


@_frozen
class CheckVersionRequest:
    path: str
    version: int


@_frozen
class CheckWatchesRequest:
    path: str
    type: int  # WatcherType


@_frozen
class RemoveWatchesRequest:
    path: str
    type: int  # WatcherType


@_frozen
class AddWatchRequest:
    path: str
    mode: int  # AddWatchMode


@_frozen
class GetEphemeralsRequest:
    prefix_path: str


@_frozen
class GetEphemeralsResponse:
    ephemerals: tuple[str, ...]


@_frozen
class GetAllChildrenNumberRequest:
    path: str


@_frozen
class GetAllChildrenNumberResponse:
    total_number: int


@_frozen
class WhoAmIResponse:
    client_info: tuple[ClientInfo, ...]


@_frozen
class ReconfigRequest:
    """Decoded so that a server can answer it (Quire answers RECONFIG_DISABLED)."""

    joining_servers: str | None
    leaving_servers: str | None
    new_members: str | None
    cur_config_id: int


@_frozen
class GetSASLRequest:
    """The body of a sasl request (Quire answers it with an error: no SASL)."""

    token: bytes | None


@_frozen
class SetSASLResponse:
    token: bytes | None


# --- multi -------------------------------------------------------------------------

@_frozen
class DeleteResult:
    """A delete op's result inside a MultiResponse (it has no body)."""


@_frozen
class CheckResult:
    """A check op's result inside a MultiResponse (it has no body)."""


@_frozen
class ErrorResult:
    """A multi op that did not take effect: the op that failed carries its error; ops
    before it carry 0 (they succeeded, then were rolled back), ops after it
    RUNTIME_INCONSISTENCY (not run). kazoo turns 0 into RolledBackError."""

    err: int


@_frozen
class MultiRequest:
    """multi (create, create2, createContainer, createTTL, delete, setData, check ops)
    or multiRead (getData and getChildren ops): pairs of (op code, request record)."""

    ops: tuple[tuple[int, object], ...]


@_frozen
class MultiResponse:
    """One result per op, in order: CreateResponse (create), Create2Response (create2,
    createContainer, createTTL), DeleteResult, SetDataResponse, CheckResult,
    GetDataResponse, GetChildrenResponse or ErrorResult."""

    results: tuple[object, ...]
