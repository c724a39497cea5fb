"""Request -> transaction, on the leader (ZooKeeper's PrepRequestProcessor).

The leader checks each write against its view of the *future* tree: the
committed tree plus every transaction it has prepared but not yet seen commit
(paper section 1). The view is a second DataTree that every prepared
transaction is applied to at once; it is rebuilt from the committed tree when
leadership changes (forget); a failed multi is rolled back in it with a savepoint.
A request that fails becomes an Error transaction (a failed multi: a Multi of
Error records) that is answered but never proposed: unlike ZooKeeper, which
logs it, Quire spends no zxid, log write or quorum round on it. Zab orders its
answer after every transaction prepared before it (statemachine.Refusal).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from metastore.core import acl as A
from metastore.core import cluster_secret as CS
from metastore.wire import jute_records as J
from metastore.core import paths
from metastore.wire.envelope import Envelope
from metastore.core.reconfig import prepare_reconfig
from zab.core.ensemble import Ensemble, bootstrap
from metastore.errors import (BadArguments, BadVersion, NoChildrenForEphemerals, NodeExists, NoNode, NotEmpty,
                              RuntimeInconsistency, SessionExpired, SessionMoved, Unimplemented, ZooKeeperError)
from metastore.wire.jute_defs import CreateMode, OpCode
from metastore.core.tree_fork import fork
from metastore.core.ephemeral_owner import CONTAINER_OWNER, EphemeralType, ephemeral_type, is_session_id, ttl_owner
from metastore.core.tree import DataTree, Node, i32, next_version
from metastore.core.txn import (Check, CloseSession, Create, CreateSession, Delete, Error, Multi, SetACL, SetData,
                           Transaction, apply, apply_op, failed)

ANY_VERSION = -1  # on the wire; compared explicitly below
DEFAULT_MAX_DATA_BYTES = 1 << 20
# A request's jute bytes, and the transaction made of it, at most (a client's frame
# cannot be larger; a bigger one was forged on the peer port): a transaction must fit
# the peer frames that carry it (PROPOSAL, SYNCTXNS) with room to spare.
DEFAULT_MAX_REQUEST_BYTES = DEFAULT_MAX_DATA_BYTES + (64 << 10)
TXN_BYTES_PER_REQUEST_BYTE = 2  # "auth" ACLs expand to the session's ids: allow some growth
_SEQUENTIAL = {CreateMode.PERSISTENT_SEQUENTIAL, CreateMode.EPHEMERAL_SEQUENTIAL,
               CreateMode.PERSISTENT_SEQUENTIAL_WITH_TTL}
_EPHEMERAL = {CreateMode.EPHEMERAL, CreateMode.EPHEMERAL_SEQUENTIAL}
_TTL = {CreateMode.PERSISTENT_WITH_TTL, CreateMode.PERSISTENT_SEQUENTIAL_WITH_TTL}
CLAIM_SESSION = -1000  # internal: a client reconnected to the envelope's origin node
INIT_SECRET = -1001  # internal: the first leader commits the cluster secret (metastore.core.cluster_secret)
HOUSEKEEPING = 0  # the origin of requests the leader makes itself (node ids start at 1)
_CREATE_OPS = {OpCode.CREATE, OpCode.CREATE2, OpCode.CREATE_CONTAINER, OpCode.CREATE_TTL}


class Preparer:
    def __init__(self, tree: DataTree, *, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.tree = tree
        self.max_data_bytes = max_data_bytes
        self.max_request_bytes = max_request_bytes
        self._future: DataTree | None = None
        self._pending: list[tuple[int, Transaction]] = []
        self._time_ms = 0
        self._owner: dict[int, int] = {}  # session -> the node its client is connected to
        self.ensemble: Ensemble = bootstrap(frozenset({1}))  # the committed one (MetastoreStateMachine.show_ensemble)
        self._reconfig_at: int | None = None  # the zxid of a reconfig prepared, not yet applied

    def forget(self) -> None:
        """Leadership began or ended: prepared transactions may never commit."""
        self._future, self._pending, self._owner, self._reconfig_at = None, [], {}, None

    def settled(self, zxid: int) -> None:
        """Transactions up to `zxid` are applied to the committed tree."""
        while self._pending and self._pending[0][0] <= zxid:
            self._pending.pop(0)
        if self._reconfig_at is not None and self._reconfig_at <= zxid:
            self._reconfig_at = None

    def _view(self) -> DataTree:
        if self._future is None:
            # When leadership changes: a copy of references (tree_fork.py), never of the znodes.
            self._future = fork(self.tree)
            for zxid, txn in self._pending:
                apply(self._future, zxid, txn)
        return self._future

    # -- the entry point --------------------------------------------------------------
    def prepare(self, zxid: int, session_id: int, env: Envelope, opcode: int, body: object,
                synced: frozenset[int] = frozenset()) -> Transaction:
        """The transaction for one request. A failed request (`failed(txn)`) leaves the
        future view untouched: it is answered, not proposed, and `zxid` goes to the next."""
        self._time_ms = max(self._time_ms, env.time_ms)
        view = self._view()
        auth = envelope_auth(env, CS.read_secret(view))
        moved = self._check_owner(session_id, env.origin, opcode)
        if moved is not None:
            return Transaction(self._time_ms, moved)
        if len(env.payload) > self.max_request_bytes:
            return Transaction(self._time_ms, Error(BadArguments.code))
        if opcode == OpCode.MULTI:
            txn = Transaction(self._time_ms, self._multi(view, zxid, session_id, auth, body))
            if failed(txn):
                return txn  # _multi rolled the view back
            view.last_zxid = zxid  # its ops were applied one by one while checking them
        elif opcode == OpCode.CHECK:  # only inside a multi: a lone Check is no transaction record
            return Transaction(self._time_ms, Error(Unimplemented.code))
        elif opcode == OpCode.RECONFIG:
            try:
                txn = Transaction(self._time_ms, prepare_reconfig(self.ensemble, self._reconfig_at is not None,
                                                                  auth, body, synced))
            except ZooKeeperError as e:
                return Transaction(self._time_ms, Error(e.code))
            apply(view, zxid, txn)
            self._reconfig_at = zxid
        else:
            try:
                op = self._op(view, session_id, auth, opcode, body)
                self._check_txn_bytes(_op_bytes(op))
            except ZooKeeperError as e:
                return Transaction(self._time_ms, Error(e.code))
            txn = Transaction(self._time_ms, op)
            apply(view, zxid, txn)
        self._pending.append((zxid, txn))
        return txn

    def _check_owner(self, session_id: int, origin: int, opcode: int) -> Error | Multi | None:
        """SessionMoved: a session's requests must come from the node its client last
        connected to. The leader remembers that node (not replicated, as in ZooKeeper);
        a connect (CLAIM_SESSION) moves it, and so does the first request a new leader
        sees. Requests still arriving from the old node's connection are refused."""
        if origin == HOUSEKEEPING:
            return None  # the leader's own expiry and container sweeps act for no client
        if opcode in (OpCode.CREATE_SESSION, CLAIM_SESSION) or session_id not in self._owner:
            self._owner[session_id] = origin
            return Multi(()) if opcode == CLAIM_SESSION else None  # an empty multi: a no-op txn
        return None if self._owner[session_id] == origin else Error(SessionMoved.code)

    def _op(self, view: DataTree, session_id: int, auth: Sequence[A.Id], opcode: int, body: object):
        if opcode in _CREATE_OPS:
            return self._create(view, session_id, auth, opcode, body)
        if opcode == OpCode.DELETE:
            return self._delete(view, auth, body)
        if opcode == OpCode.SET_DATA:
            return self._set_data(view, auth, body)
        if opcode == OpCode.SET_ACL:
            return self._set_acl(view, auth, body)
        if opcode == OpCode.CHECK:
            node = _existing(view, body.path)
            A.require(node.acl, A.Perm.READ, auth, body.path)  # a version is data: PrepRequestProcessor's check
            _check_version(body.path, node.version, body.version)
            return Check(body.path, node.version)
        if opcode == OpCode.CREATE_SESSION:
            if not is_session_id(session_id) or view.session_timeout(session_id) is not None:
                raise BadArguments(None, f"session id {session_id:#x} is invalid or in use")
            return CreateSession(session_id, body)
        if opcode == OpCode.DELETE_CONTAINER:
            return self._delete_container(view, body)
        if opcode == INIT_SECRET:
            return self._init_secret(view, body)
        if opcode == OpCode.CLOSE_SESSION:
            if view.session_timeout(session_id) is None:
                raise SessionExpired(None, f"session {session_id:#x} is not open")
            return CloseSession(session_id, tuple(sorted(view.ephemerals(session_id))))
        raise Unimplemented(None, f"opcode {opcode} is not a write")

    def _multi(self, view: DataTree, zxid: int, session_id: int, auth: Sequence[A.Id], body: J.MultiRequest):
        ops = []
        savepoint = view.savepoint()
        size = 0
        for i, (opcode, record) in enumerate(body.ops):
            try:
                if opcode not in _CREATE_OPS | {OpCode.DELETE, OpCode.SET_DATA, OpCode.CHECK}:
                    raise BadArguments(None, f"opcode {opcode} is not allowed in a multi")
                op = self._op(view, session_id, auth, opcode, record)
                size += _op_bytes(op)
                self._check_txn_bytes(size)
                apply_op(view, zxid, self._time_ms, op)  # later ops see this one
            except ZooKeeperError as e:
                view.rollback(savepoint)  # all or nothing, in the future view too
                codes = [0] * i + [e.code] + [RuntimeInconsistency.code] * (len(body.ops) - i - 1)
                return Multi(tuple(Error(c) for c in codes))
            ops.append(op)
        view.release(savepoint)
        return Multi(tuple(ops))

    # -- writes ---------------------------------------------------------------------------
    def _create(self, view: DataTree, session_id: int, auth: Sequence[A.Id], opcode: int, req) -> Create:
        mode = _create_mode(req.flags)
        ttl = getattr(req, "ttl", 0)
        _check_create_kind(opcode, mode, ttl, req.path)
        paths.validate_path(req.path, sequential=mode in _SEQUENTIAL)
        self._check_size(req.path, req.data)
        parent_path = paths.parent_of(req.path)
        _check_writable(parent_path, req.path)
        _check_writable(req.path)
        parent = view.node(parent_path)
        if parent is None:
            raise NoNode(parent_path)
        A.require(parent.acl, A.Perm.CREATE, auth, parent_path)
        if ephemeral_type(parent.owner) is EphemeralType.NORMAL:
            raise NoChildrenForEphemerals(req.path)
        path = paths.sequential_path(req.path, parent.cversion) if mode in _SEQUENTIAL else req.path
        if path in view:
            raise NodeExists(path)
        stored_acl = A.fixup_acl(req.path, req.acl, auth)
        owner = 0
        if mode in _EPHEMERAL:
            if view.session_timeout(session_id) is None:
                raise SessionExpired(req.path, f"session {session_id:#x} is not open")
            owner = session_id
        elif mode is CreateMode.CONTAINER:
            owner = CONTAINER_OWNER
        elif mode in _TTL:
            owner = ttl_owner(ttl)
        return Create(path, req.data, stored_acl, owner, i32(parent.cversion + 1))  # None stays null data

    def _delete(self, view: DataTree, auth: Sequence[A.Id], req: J.DeleteRequest) -> Delete:
        paths.validate_path(req.path)
        if paths.is_special(req.path) or CS.is_protected(req.path):
            raise BadArguments(req.path, "a system znode cannot be deleted")
        # The parent's DELETE before the node's existence, as PrepRequestProcessor: a client
        # without it must not learn from NoNode which children exist.
        parent_path = paths.parent_of(req.path)
        A.require(_existing(view, parent_path).acl, A.Perm.DELETE, auth, parent_path)
        node = _existing(view, req.path)
        _check_version(req.path, node.version, req.version)
        if node.children:
            raise NotEmpty(req.path)
        return Delete(req.path)

    def _delete_container(self, view: DataTree, path: str) -> Delete:
        """ZooKeeper's deleteContainer: the leader removes an empty container or an
        expired TTL node; a child created meanwhile makes it NotEmpty, not deleted."""
        node = _existing(view, path)
        if ephemeral_type(node.owner) not in (EphemeralType.CONTAINER, EphemeralType.TTL):
            raise BadArguments(path, "not a container or TTL node")
        if node.children:
            raise NotEmpty(path)
        return Delete(path)

    def _set_data(self, view: DataTree, auth: Sequence[A.Id], req: J.SetDataRequest) -> SetData:
        paths.validate_path(req.path)
        self._check_size(req.path, req.data)
        _check_writable(req.path)
        node = _existing(view, req.path)
        A.require(node.acl, A.Perm.WRITE, auth, req.path)
        _check_version(req.path, node.version, req.version)
        return SetData(req.path, req.data, next_version(node.version))

    def _set_acl(self, view: DataTree, auth: Sequence[A.Id], req: J.SetACLRequest) -> SetACL:
        paths.validate_path(req.path)
        _check_writable(req.path)
        node = _existing(view, req.path)
        A.require(node.acl, A.Perm.ADMIN, auth, req.path)
        _check_version(req.path, node.aversion, req.version)
        stored_acl = A.fixup_acl(req.path, req.acl, auth)
        return SetACL(req.path, stored_acl, next_version(node.aversion))

    def _init_secret(self, view: DataTree, secret: bytes) -> Create:
        """The cluster secret, once: the first leader's INIT_SECRET (metastore.core.cluster_secret)."""
        if CS.read_secret(view) is not None:
            raise NodeExists(CS.SECRET_PATH)
        if len(secret) != CS.SECRET_BYTES:
            raise BadArguments(CS.SECRET_PATH, f"a cluster secret is {CS.SECRET_BYTES} bytes")
        parent = view.node(paths.parent_of(CS.SECRET_PATH))
        return Create(CS.SECRET_PATH, secret, CS.secret_acl(secret), 0, i32(parent.cversion + 1))

    def _check_txn_bytes(self, size: int) -> None:
        limit = self.max_request_bytes * TXN_BYTES_PER_REQUEST_BYTE
        if size > limit:
            raise BadArguments(None, f"the transaction would hold {size} bytes, more than {limit}")

    def _check_size(self, path: str, data: bytes | None) -> None:
        if data is not None and len(data) > self.max_data_bytes:
            raise BadArguments(path, f"data of {len(data)} bytes exceeds the {self.max_data_bytes}-byte znode limit")


def envelope_auth(env: Envelope, secret: bytes | None) -> list[A.Id]:
    """The ids a request acts with. A "super" id counts only with the token its origin
    node derives from the cluster secret (cluster_secret.super_token): super is granted
    by a node's own authentication, never taken from bytes that came over the network."""
    out = []
    for scheme, ident in env.auth:
        if scheme == A.SUPER_SCHEME:
            # The token (an HMAC) only when a super id is there: not on every request's path.
            if secret is not None and hmac.compare_digest(ident.encode(), CS.super_token(secret).encode()):
                out.append(A.Id(A.SUPER_SCHEME, ""))
            continue
        out.append(A.Id(scheme, ident))
    return out


def _op_bytes(op: object) -> int:
    """Roughly the encoded size of one op (path, data and ACL bytes)."""
    size = len(getattr(op, "path", "")) + len(getattr(op, "data", b"") or b"") + 16
    for entry in getattr(op, "acl", ()):
        size += len(entry.id.scheme) + len(entry.id.id) + 12
    return size


def _check_writable(path: str, child: str | None = None) -> None:
    """/zookeeper/config is each node's own configuration (the tree refuses to change
    it: the leader must refuse first, or its own apply fails); the cluster secret is
    Quire's. A super client gets BadArguments too."""
    if path == paths.CONFIG or CS.is_protected(path):
        raise BadArguments(child or path, f"{path} cannot be changed by a client request")


def _existing(view: DataTree, path: str) -> Node:
    node = view.node(path)
    if node is None:
        raise NoNode(path)
    return node


def _check_version(path: str, current: int, expected: int) -> None:
    if expected != ANY_VERSION and expected != current:
        raise BadVersion(path)


def _create_mode(flags: int) -> CreateMode:
    try:
        return CreateMode(flags)
    except ValueError:
        raise BadArguments(None, f"unknown create mode {flags}") from None


def _check_create_kind(opcode: int, mode: CreateMode, ttl: int, path: str) -> None:
    if opcode == OpCode.CREATE_TTL:
        if mode not in _TTL or not 0 < ttl <= 0xFF_FFFF_FFFF:
            raise BadArguments(path, "createTTL needs a TTL mode and 0 < ttl")
    elif mode in _TTL:
        raise BadArguments(path, "TTL modes need createTTL")
    if (opcode == OpCode.CREATE_CONTAINER) != (mode is CreateMode.CONTAINER):
        raise BadArguments(path, "containers are created with createContainer")
