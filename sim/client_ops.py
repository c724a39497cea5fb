"""The metastore's client writes as the simulator submits them, and what became of each.

`create_request` and `set_data_request` build the requests a node hands Zab for a
ZooKeeper client's create and compare-and-set setData (also used with a real
`PeerDriver`); `ClientOp` follows one through sim.cluster.SimCluster to its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import CreateResult, ErrorResult, MultiResult, SetDataResult
from metastore.errors import BY_CODE
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode

ANY_VERSION = -1  # setData's expected version that matches any


def path_of(key: str) -> str:
    """The znode a test's key names: a child of the root ("a" and "/a" are the same znode)."""
    return key if key.startswith("/") else "/" + key


def client_request(opcode: int, body: object, origin: int, time_ms: int) -> bytes:
    """Any ZooKeeper client request (`body` a jute request record) as node `origin` hands it
    to Zab: the metastore's envelope around the jute payload."""
    payload = jute.encode_request(jute.RequestHeader(1, opcode), body)
    return E.encode_envelope(E.Envelope(E.CLIENT, origin, time_ms, (), payload))


def create_request(key: str, value: str, *, origin: int, time_ms: int = 0) -> bytes:
    """The request a node hands Zab for a client's create of the persistent znode
    `path_of(key)` holding `value` (UTF-8), open to anyone. `origin` is the node the
    client is connected to: the leader refuses a session's requests from any other
    node (SessionMoved) until the session reconnects."""
    body = jute.CreateRequest(path_of(key), value.encode(), OPEN_ACL_UNSAFE, 0)
    return client_request(OpCode.CREATE, body, origin, time_ms)


def set_data_request(key: str, value: str, version: int = ANY_VERSION, *, origin: int, time_ms: int = 0) -> bytes:
    """A client's setData of `path_of(key)` to `value` if the znode is at `version`
    (ANY_VERSION: whatever it is): ZooKeeper's compare-and-set."""
    body = jute.SetDataRequest(path_of(key), value.encode(), version)
    return client_request(OpCode.SET_DATA, body, origin, time_ms)


def read_key(state_machine: MetastoreStateMachine, key: str) -> tuple[str, int] | None:
    """The data (UTF-8) and version of `path_of(key)` in what `state_machine` has
    applied, or None if it holds no such znode."""
    node = state_machine.tree.node(path_of(key))
    return None if node is None else (node.data.decode(), node.version)


def error_of(result: object) -> str | None:
    """The name of the ZooKeeper error in a metastore result ("BadVersion", "NodeExists",
    ...), None if the request succeeded or the result is not the metastore's."""
    r = getattr(result, "result", None)
    if not isinstance(r, (ErrorResult, MultiResult)) or not r.code:
        return None
    cls = BY_CODE.get(r.code)
    return cls.__name__ if cls is not None else f"error {r.code}"


def version_of(result: object) -> int | None:
    """The znode's data version after a successful create (0) or setData, else None."""
    r = getattr(result, "result", None)
    return r.stat.version if isinstance(r, (CreateResult, SetDataResult)) else None


@dataclass
class ClientOp:
    """One client write and what became of it. `result` is what the state machine
    returned for it (the metastore's `Applied`) once acknowledged or refused.
    `on_done`, if set, is called once, when `status` leaves "pending"."""
    node: int
    key: str
    value: str
    session_id: int
    cxid: int
    status: str = "pending"  # pending | acked | refused | failed | unknown
    zxid: int | None = None
    result: object = None
    on_done: Callable[[ClientOp], None] | None = field(default=None, repr=False, compare=False)

    @property
    def error(self) -> str | None:
        """The ZooKeeper error a refused write got ("BadVersion", "NodeExists", ...)."""
        return error_of(self.result)

    @property
    def version(self) -> int | None:
        """The znode's data version this acknowledged write produced."""
        return version_of(self.result)

    def settle(self, status: str) -> None:
        """The write's outcome is known to its client (or known to be unknown)."""
        self.status = status
        if self.on_done is not None:
            self.on_done(self)
