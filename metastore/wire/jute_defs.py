"""The vocabulary of the ZooKeeper client protocol: codes, flags, special xids, limits, errors.

Values are those of ZooKeeper's `ZooDefs.OpCode`, `ZooDefs.Perms`,
`ZooDefs.AddWatchModes`, `KeeperException.Code`, `CreateMode`,
`Watcher.Event.EventType`, `Watcher.Event.KeeperState`, `Watcher.WatcherType`
and the special xids of `ClientCnxn`; names are theirs in Python spelling
(`getChildren2` -> GET_CHILDREN2, `NONODE` -> NO_NODE). Records keep these as
plain ints on the wire side (an IntEnum member equals its int), so a value we
do not know yet decodes instead of closing the connection; the one exception is
RequestHeader.type, which the decoder must understand to read the body.
"""

from __future__ import annotations

from enum import IntEnum

from metastore.core.acl import Perm

PROTOCOL_VERSION = 0  # ConnectRequest/ConnectResponse.protocol_version: every ZooKeeper 3.x speaks 0
# jute.maxbuffer: the largest buffer, string or vector a decoder accepts (ZooKeeper's default).
DEFAULT_MAX_BUFFER_BYTES = 0xFFFFF
# A frame may carry one maximal buffer plus its header, path and ACLs.
DEFAULT_MAX_FRAME_BYTES = DEFAULT_MAX_BUFFER_BYTES + (64 << 10)
PASSWORD_BYTES = 16  # session passwords are 16 bytes; a new session connects with 16 zero bytes


class JuteError(ValueError):
    """Bytes from the peer are not a valid client-protocol message (malformed,
    truncated, oversized, trailing garbage, unknown type): close the connection."""


class UnknownOpcode(JuteError):
    """A well-formed request header names an operation we cannot decode.

    The frame boundary is intact, so a server may answer Err.UNIMPLEMENTED to
    `xid` and keep the connection, or close it like any other JuteError."""

    def __init__(self, xid: int, opcode: int) -> None:
        self.xid, self.opcode = xid, opcode
        try:
            name = f" ({OpCode(opcode).name})"
        except ValueError:
            name = ""
        super().__init__(f"request xid={xid} has opcode {opcode}{name}, which is not a client request we decode")


class OpCode(IntEnum):
    NOTIFICATION = 0
    CREATE = 1
    DELETE = 2
    EXISTS = 3
    GET_DATA = 4
    SET_DATA = 5
    GET_ACL = 6
    SET_ACL = 7
    GET_CHILDREN = 8
    SYNC = 9
    PING = 11
    GET_CHILDREN2 = 12
    CHECK = 13
    MULTI = 14
    CREATE2 = 15
    RECONFIG = 16
    CHECK_WATCHES = 17
    REMOVE_WATCHES = 18
    CREATE_CONTAINER = 19
    DELETE_CONTAINER = 20
    CREATE_TTL = 21
    MULTI_READ = 22
    AUTH = 100
    SET_WATCHES = 101
    SASL = 102
    GET_EPHEMERALS = 103
    GET_ALL_CHILDREN_NUMBER = 104
    SET_WATCHES2 = 105
    ADD_WATCH = 106
    WHO_AM_I = 107
    CREATE_SESSION = -10
    CLOSE_SESSION = -11
    ERROR = -1  # the type of a failed op's result inside a MultiResponse


class Err(IntEnum):
    """KeeperException.Code: the `err` of a ReplyHeader or an ErrorResult."""

    OK = 0
    SYSTEM_ERROR = -1
    RUNTIME_INCONSISTENCY = -2  # also: "this multi op was not run because an earlier one failed"
    DATA_INCONSISTENCY = -3
    CONNECTION_LOSS = -4
    MARSHALLING_ERROR = -5
    UNIMPLEMENTED = -6
    OPERATION_TIMEOUT = -7
    BAD_ARGUMENTS = -8
    UNKNOWN_SESSION = -12
    NEW_CONFIG_NO_QUORUM = -13
    RECONFIG_IN_PROGRESS = -14
    API_ERROR = -100
    NO_NODE = -101
    NO_AUTH = -102
    BAD_VERSION = -103
    NO_CHILDREN_FOR_EPHEMERALS = -108
    NODE_EXISTS = -110
    NOT_EMPTY = -111
    SESSION_EXPIRED = -112
    INVALID_CALLBACK = -113
    INVALID_ACL = -114
    AUTH_FAILED = -115
    SESSION_MOVED = -118
    NOT_READ_ONLY = -119
    EPHEMERAL_ON_LOCAL_SESSION = -120
    NO_WATCHER = -121
    REQUEST_TIMEOUT = -122
    RECONFIG_DISABLED = -123
    SESSION_CLOSED_REQUIRE_SASL_AUTH = -124
    QUOTA_EXCEEDED = -125
    THROTTLED = -127


Perms = Perm  # ZooDefs.Perms: the same flags as the ACL model's (metastore.core.acl.Perm)


class CreateMode(IntEnum):
    """CreateRequest.flags."""

    PERSISTENT = 0
    EPHEMERAL = 1
    PERSISTENT_SEQUENTIAL = 2
    EPHEMERAL_SEQUENTIAL = 3
    CONTAINER = 4
    PERSISTENT_WITH_TTL = 5
    PERSISTENT_SEQUENTIAL_WITH_TTL = 6


class EventType(IntEnum):
    """WatcherEvent.type."""

    NONE = -1  # a session state change, not a znode event
    NODE_CREATED = 1
    NODE_DELETED = 2
    NODE_DATA_CHANGED = 3
    NODE_CHILDREN_CHANGED = 4
    DATA_WATCH_REMOVED = 5
    CHILD_WATCH_REMOVED = 6
    PERSISTENT_WATCH_REMOVED = 7


class KeeperState(IntEnum):
    """WatcherEvent.state."""

    UNKNOWN = -1
    DISCONNECTED = 0
    NO_SYNC_CONNECTED = 1
    SYNC_CONNECTED = 3
    AUTH_FAILED = 4
    CONNECTED_READ_ONLY = 5
    SASL_AUTHENTICATED = 6
    CLOSED = 7
    EXPIRED = -112


class AddWatchMode(IntEnum):
    """AddWatchRequest.mode."""

    PERSISTENT = 0
    PERSISTENT_RECURSIVE = 1


class WatcherType(IntEnum):
    """CheckWatchesRequest.type and RemoveWatchesRequest.type."""

    CHILDREN = 1
    DATA = 2
    ANY = 3
    PERSISTENT = 4
    PERSISTENT_RECURSIVE = 5


class Xid(IntEnum):
    """Request/reply xids with a fixed meaning (ClientCnxn); ordinary requests count up from 1."""

    NOTIFICATION = -1  # a WatcherEvent pushed by the server
    PING = -2
    AUTH = -4  # AuthPacket and its reply
    SET_WATCHES = -8  # SetWatches / SetWatches2 sent on reconnect


# The four-letter admin words a connection may open with instead of a length prefix.
# As big-endian i32 lengths they are all above 1.6 GB, so no valid frame starts like one.
FOUR_LETTER_WORDS = frozenset({
    "ruok", "srvr", "stat", "mntr", "conf", "envi", "isro", "cons", "dump", "wchs", "wchc", "wchp", "crst", "srst",
    "dirs",
})
