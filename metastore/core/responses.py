"""Replies of the client port, built from the tree (reads) or from an applied
transaction (writes). Pure: the service does the sockets and the waiting.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metastore.core import acl as A
from metastore.core import cluster_secret as CS
from metastore.wire import jute_records as J
from metastore.errors import BadVersion, MarshallingError, NoAuth, NoNode, Unimplemented, ZooKeeperError
from metastore.wire.jute_defs import DEFAULT_MAX_FRAME_BYTES, OpCode, WatcherType
from metastore.core.prep import ANY_VERSION
from metastore.core.tree import DataTree, Node
from metastore.core.txn import (CheckResult, CreateResult, DeleteResult, ErrorResult, MultiResult, ReconfigResult,
                           SetACLResult, SetDataResult)
from metastore.core.watches import WatchKind

_CREATE2_OPS = {OpCode.CREATE2, OpCode.CREATE_CONTAINER, OpCode.CREATE_TTL}


@dataclass(slots=True, unsafe_hash=True)
class Reply:
    err: int
    body: object = None
    watch: tuple[str, WatchKind] | None = None  # register this watch for the connection


# -- writes -------------------------------------------------------------------------
def write_reply(opcode: int, result: object, request: object = None) -> Reply:
    if isinstance(result, ErrorResult):
        return Reply(result.code)
    if opcode == OpCode.MULTI:
        assert isinstance(result, MultiResult) and isinstance(request, J.MultiRequest)
        # A failed multi still answers err 0: each op's result says what happened (kazoo relies on it).
        return Reply(0, J.MultiResponse(tuple(_multi_op(op, r) for (op, _), r in zip(request.ops, result.results))))
    return Reply(0, _op_body(opcode, result))


def _op_body(opcode: int, result: object) -> object:
    if isinstance(result, CreateResult):
        if opcode in _CREATE2_OPS:
            return J.Create2Response(result.path, result.stat)
        return J.CreateResponse(result.path)
    if isinstance(result, SetDataResult):
        return J.SetDataResponse(result.stat)
    if isinstance(result, SetACLResult):
        return J.SetACLResponse(result.stat)
    if isinstance(result, DeleteResult):
        return None
    if isinstance(result, ReconfigResult):
        return J.GetDataResponse(result.data, result.stat)
    raise AssertionError(f"no reply body for {result!r}")


def _multi_op(opcode: int, result: object) -> object:
    if isinstance(result, ErrorResult):
        return J.ErrorResult(result.code)
    if isinstance(result, DeleteResult):
        return J.DeleteResult()
    if isinstance(result, CheckResult):
        return J.CheckResult()
    return _op_body(opcode, result)


# -- reads ---------------------------------------------------------------------------
def read_reply(tree: DataTree, opcode: int, body: object, session_id: int, auth: Sequence[A.Id], *,
               max_reply_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Reply:
    """The reply to a read. A multiRead whose results would exceed `max_reply_bytes` is
    MARSHALLINGERROR before they are all built: one 1 MB request naming a 1 MB znode
    60,000 times would otherwise make a 60 GB reply."""
    try:
        if opcode == OpCode.MULTI_READ:
            return _multi_read(tree, body, session_id, auth, max_reply_bytes)
        return _READS[opcode](tree, body, session_id, auth)
    except ZooKeeperError as e:
        return Reply(e.code)
    except KeyError:
        return Reply(Unimplemented.code)


def _node(tree: DataTree, path: str) -> Node:
    node = tree.node(path)
    if node is None:
        raise NoNode(path)
    return node


def _exists(tree, req: J.ExistsRequest, session_id, auth) -> Reply:
    node = tree.node(req.path)
    if node is not None:  # READ on a node that exists; a refusal sets no watch (FinalRequestProcessor)
        A.require(node.acl, A.Perm.READ, auth, req.path)
    stat = tree.exists(req.path)
    watch = (req.path, WatchKind.DATA) if req.watch else None
    if stat is None:
        return Reply(NoNode.code, None, watch)
    return Reply(0, J.ExistsResponse(stat), watch)


def _get_data(tree, req: J.GetDataRequest, session_id, auth) -> Reply:
    node = _node(tree, req.path)
    if CS.is_protected(req.path):  # its ACL stops everyone but super, and super must not read it either
        raise NoAuth(req.path, "the cluster secret is Quire's own: no client reads it, super included")
    A.require(node.acl, A.Perm.READ, auth, req.path)
    data, stat = tree.get(req.path)
    return Reply(0, J.GetDataResponse(data, stat), (req.path, WatchKind.DATA) if req.watch else None)


def _check_version(tree, req: J.CheckVersionRequest, session_id, auth) -> Reply:
    """A standalone check (opcode 13 outside a multi): the node's Stat if it is at `version`
    (-1: any), else BadVersion; NoNode, or NoAuth without READ (what a multi's check needs).
    A read of this node's tree, in order with the connection's other requests, never a
    transaction: ZooKeeper 3.9.0-3.9.2 logged it as one, which its FinalRequestProcessor answered
    as SetDataResponse(rc.stat) with no Stat set and its log reload could not replay
    (ZOOKEEPER-2623); 3.8.5 and 3.9.3 on answer UNIMPLEMENTED (docs/metastore_wire.md)."""
    node = _node(tree, req.path)
    A.require(node.acl, A.Perm.READ, auth, req.path)
    if req.version != ANY_VERSION and req.version != node.version:  # as a multi's check (prep.py)
        raise BadVersion(req.path)
    return Reply(0, J.SetDataResponse(node.stat()))


def _children(tree, req, session_id, auth) -> Reply:
    node = _node(tree, req.path)
    A.require(node.acl, A.Perm.READ, auth, req.path)
    kids = tuple(tree.children(req.path))
    watch = (req.path, WatchKind.CHILD) if req.watch else None
    if isinstance(req, J.GetChildren2Request):
        return Reply(0, J.GetChildren2Response(kids, tree.exists(req.path)), watch)
    return Reply(0, J.GetChildrenResponse(kids), watch)


def _get_acl(tree, req: J.GetACLRequest, session_id, auth) -> Reply:
    # READ or ADMIN, and digest hashes only for ADMIN: ZooKeeper's CVE-2019-0201 fix.
    node = _node(tree, req.path)
    A.require(node.acl, A.Perm.READ | A.Perm.ADMIN, auth, req.path)
    acl, stat = tree.acl(req.path)
    shown = tuple(acl) if A.check(acl, A.Perm.ADMIN, auth) else A.obfuscated(acl)
    return Reply(0, J.GetACLResponse(shown, stat))


def _ephemerals(tree, req: J.GetEphemeralsRequest, session_id, auth) -> Reply:
    return Reply(0, J.GetEphemeralsResponse(tuple(tree.ephemerals(session_id, req.prefix_path or "/"))))


def _all_children(tree, req: J.GetAllChildrenNumberRequest, session_id, auth) -> Reply:
    A.require(_node(tree, req.path).acl, A.Perm.READ, auth, req.path)
    return Reply(0, J.GetAllChildrenNumberResponse(tree.all_children_number(req.path)))


def _who_am_i(tree, req, session_id, auth) -> Reply:
    infos = [J.ClientInfo(i.scheme, i.id) for i in auth]
    return Reply(0, J.WhoAmIResponse(tuple(infos)))


def _multi_read(tree, req: J.MultiRequest, session_id, auth, max_reply_bytes: int) -> Reply:
    results, size = [], 0
    for opcode, body in req.ops:
        r = read_reply(tree, opcode, body, session_id, auth)
        size += _reply_bytes(r.body)
        if size > max_reply_bytes:
            raise MarshallingError(None, f"multiRead results exceed {max_reply_bytes} bytes")
        results.append(r.body if r.err == 0 else J.ErrorResult(r.err))
    return Reply(0, J.MultiResponse(tuple(results)))


def _reply_bytes(body: object) -> int:
    """At least the encoded size of one read's result (header, Stat and its variable parts)."""
    size = 96
    data = getattr(body, "data", None)
    if data:
        size += len(data)
    for name in ("children", "ephemerals"):
        size += sum(len(c) + 4 for c in getattr(body, name, ()))
    size += sum(len(e.id.scheme) + len(e.id.id) + 12 for e in getattr(body, "acl", ()))
    return size


_READS = {
    OpCode.EXISTS: _exists, OpCode.GET_DATA: _get_data, OpCode.GET_CHILDREN: _children,
    OpCode.GET_CHILDREN2: _children, OpCode.GET_ACL: _get_acl, OpCode.GET_EPHEMERALS: _ephemerals,
    OpCode.GET_ALL_CHILDREN_NUMBER: _all_children, OpCode.WHO_AM_I: _who_am_i, OpCode.MULTI_READ: None,
    OpCode.CHECK: _check_version,  # standalone; inside a multi a check is part of its transaction
}
READ_OPS = frozenset(_READS)
WRITE_OPS = frozenset({OpCode.CREATE, OpCode.CREATE2, OpCode.CREATE_CONTAINER, OpCode.CREATE_TTL, OpCode.DELETE,
                       OpCode.SET_DATA, OpCode.SET_ACL, OpCode.MULTI, OpCode.RECONFIG})

WATCH_KINDS_FOR_TYPE = {
    WatcherType.CHILDREN: (WatchKind.CHILD,),
    WatcherType.DATA: (WatchKind.DATA,),
    WatcherType.ANY: (WatchKind.CHILD, WatchKind.DATA, WatchKind.PERSISTENT, WatchKind.PERSISTENT_RECURSIVE),
    WatcherType.PERSISTENT: (WatchKind.PERSISTENT,),
    WatcherType.PERSISTENT_RECURSIVE: (WatchKind.PERSISTENT_RECURSIVE,),
}
