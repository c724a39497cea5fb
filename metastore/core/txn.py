"""Metastore transactions: the records the leader produces and every node applies, and
`apply`. Their byte encoding is metastore/wire/txn_codec.py; the tree snapshot's,
metastore/wire/snapshot_codec.py.

The leader turns each client write into a transaction against its view of the
future tree (paper section 1). A transaction carries *absolute* values, never
"+1": the final path of a sequential create, the parent's resulting create
counter, the resulting data or ACL version, the exact ephemerals a closed
session loses. Every node applies it with `apply`, which checks those values
against its tree and raises TxnConflict (a crash) on any mismatch, so a
transaction applied twice, or to a state it was not prepared for, is detected
instead of silently corrupting the tree. `apply` ignores (returns
AlreadyApplied) a transaction whose zxid the tree already contains, so
replaying a log from any snapshot's zxid (snapshots are exact, not fuzzy) is
idempotent.

A request that fails is described by a transaction too (Error; a failed multi
is a Multi of Error records: OK (0) for the ops before the failing one, its
code, then RuntimeInconsistency (-2) for the rest, which kazoo shows as
RolledBackError for 0). The leader answers it without proposing it (`failed`,
zab's Refusal), where ZooKeeper logs it; logs written before that change may
still hold such transactions, and `apply` takes them as a no-op.

Pure: no I/O.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from metastore.core import paths
from metastore.core.acl import ACL
from metastore.errors import TxnConflict, ZooKeeperError
from metastore.core.stat import Stat
from metastore.core.tree import DataTree
from zab.core.ensemble import parse_spec

FORMAT_VERSION = 1


# -- records -----------------------------------------------------------------------

@dataclass(slots=True, unsafe_hash=True)
class Create:
    path: str                    # final path (a sequential suffix already appended)
    data: bytes | None           # None: null data (ZooKeeper's null buffer), not b""
    acl: tuple[ACL, ...]         # as stored ("auth" already expanded)
    ephemeral_owner: int         # 0, a session id, CONTAINER_OWNER or a TTL owner (metastore.core.tree)
    parent_cversion: int         # the parent's internal cversion after this create (old + 1)


@dataclass(slots=True, unsafe_hash=True)
class Delete:
    path: str


@dataclass(slots=True, unsafe_hash=True)
class SetData:
    path: str
    data: bytes | None           # None: null data
    version: int                 # resulting version


@dataclass(slots=True, unsafe_hash=True)
class SetACL:
    path: str
    acl: tuple[ACL, ...]
    version: int                 # resulting ACL version


@dataclass(slots=True, unsafe_hash=True)
class Check:
    """A multi's version check: the znode is at `version` (multi only)."""
    path: str
    version: int


@dataclass(slots=True, unsafe_hash=True)
class CreateSession:
    session_id: int
    timeout_ms: int


@dataclass(slots=True, unsafe_hash=True)
class CloseSession:
    """closeSession or expiry: deletes exactly `ephemerals` (sorted), the session's ephemerals."""
    session_id: int
    ephemerals: tuple[str, ...]


@dataclass(slots=True, unsafe_hash=True)
class Error:
    code: int


@dataclass(slots=True, unsafe_hash=True)
class Reconfig:
    """The committed ensemble becomes `spec` (zab/core/ensemble.py server lines), at this zxid.
    /zookeeper/config shows it on every node; Zab acts on it (zab/core/peer.py)."""
    spec: bytes


MultiOp = Union[Create, Delete, SetData, Check, Error]


@dataclass(slots=True, unsafe_hash=True)
class Multi:
    """All ops succeed together, or every op is an Error record (a failed multi)."""
    ops: tuple[MultiOp, ...]


Body = Union[Create, Delete, SetData, SetACL, CreateSession, CloseSession, Multi, Error, Reconfig]


@dataclass(slots=True, unsafe_hash=True)
class Transaction:
    """One metastore transaction: the header (the leader's clock) and the body."""
    time_ms: int
    body: Body


# -- results (for the waiting client) ------------------------------------------------

@dataclass(slots=True, unsafe_hash=True)
class CreateResult:
    path: str
    stat: Stat


@dataclass(slots=True, unsafe_hash=True)
class DeleteResult:
    path: str


@dataclass(slots=True, unsafe_hash=True)
class SetDataResult:
    path: str
    stat: Stat


@dataclass(slots=True, unsafe_hash=True)
class SetACLResult:
    path: str
    stat: Stat


@dataclass(slots=True, unsafe_hash=True)
class CheckResult:
    path: str


@dataclass(slots=True, unsafe_hash=True)
class ErrorResult:
    code: int


@dataclass(slots=True, unsafe_hash=True)
class ReconfigResult:
    """What reconfig answers: /zookeeper/config's new data and stat (ZooKeeper's GetDataResponse)."""
    data: bytes
    stat: Stat


@dataclass(slots=True, unsafe_hash=True)
class SessionCreated:
    session_id: int
    timeout_ms: int


@dataclass(slots=True, unsafe_hash=True)
class SessionClosed:
    session_id: int
    deleted: tuple[str, ...]


OpResult = Union[CreateResult, DeleteResult, SetDataResult, CheckResult, ErrorResult]


@dataclass(slots=True, unsafe_hash=True)
class MultiResult:
    results: tuple[OpResult, ...]

    @property
    def code(self) -> int:
        """0 if the multi succeeded, else the failing op's code."""
        return next((r.code for r in self.results if isinstance(r, ErrorResult) and r.code), 0)


@dataclass(slots=True, unsafe_hash=True)
class AlreadyApplied:
    """The tree already contains this zxid (replay over a newer state): nothing changed."""
    zxid: int


Result = Union[CreateResult, DeleteResult, SetDataResult, SetACLResult, SessionCreated, SessionClosed,
               MultiResult, ErrorResult, AlreadyApplied, ReconfigResult]


# -- apply -------------------------------------------------------------------------

def apply(tree: DataTree, zxid: int, txn: Transaction) -> Result:
    """Apply one committed transaction (zxid order). TxnConflict if it does not fit the tree."""
    if zxid <= tree.last_zxid:
        return AlreadyApplied(zxid)
    try:
        result = _APPLY[type(txn.body)](tree, zxid, txn.time_ms, txn.body)
    except ZooKeeperError as e:
        raise TxnConflict(f"txn {zxid:#x} does not fit the tree: {e}") from e
    tree.last_zxid = zxid
    return result


def _apply_create(tree: DataTree, zxid: int, time_ms: int, op: Create) -> CreateResult:
    stat = tree.create(op.path, op.data, op.acl, op.ephemeral_owner, op.parent_cversion, zxid, time_ms)
    return CreateResult(op.path, stat)


def _apply_delete(tree: DataTree, zxid: int, time_ms: int, op: Delete) -> DeleteResult:
    tree.delete(op.path, zxid)
    return DeleteResult(op.path)


def _apply_set_data(tree: DataTree, zxid: int, time_ms: int, op: SetData) -> SetDataResult:
    return SetDataResult(op.path, tree.set_data(op.path, op.data, op.version, zxid, time_ms))


def _apply_set_acl(tree: DataTree, zxid: int, time_ms: int, op: SetACL) -> SetACLResult:
    return SetACLResult(op.path, tree.set_acl(op.path, op.acl, op.version))


def _apply_check(tree: DataTree, zxid: int, time_ms: int, op: Check) -> CheckResult:
    tree.check_version(op.path, op.version)
    return CheckResult(op.path)


def _apply_create_session(tree: DataTree, zxid: int, time_ms: int, op: CreateSession) -> SessionCreated:
    tree.create_session(op.session_id, op.timeout_ms)
    return SessionCreated(op.session_id, op.timeout_ms)


def _apply_close_session(tree: DataTree, zxid: int, time_ms: int, op: CloseSession) -> SessionClosed:
    return SessionClosed(op.session_id, tree.close_session(op.session_id, op.ephemerals, zxid))


def _apply_reconfig(tree: DataTree, zxid: int, time_ms: int, op: Reconfig) -> ReconfigResult:
    # The codec parsed `spec` already (a transaction that decodes is a valid ensemble).
    tree.set_config_node(parse_spec(op.spec, zxid).config_data(), zxid, time_ms)
    data, stat = tree.get(paths.CONFIG)
    return ReconfigResult(data, stat)


def _apply_error(tree: DataTree, zxid: int, time_ms: int, op: Error) -> ErrorResult:
    return ErrorResult(op.code)


def failed(txn: Transaction) -> bool:
    """A request that changes nothing: an Error, or a multi whose ops all failed."""
    body = txn.body
    if isinstance(body, Error):
        return True
    return isinstance(body, Multi) and bool(body.ops) and all(isinstance(op, Error) for op in body.ops)


def apply_refusal(txn: Transaction) -> ErrorResult | MultiResult:
    """The result of a failed request's transaction, which changes no tree."""
    if not failed(txn):
        raise ValueError("not a failed request's transaction: it changes the tree")
    if isinstance(txn.body, Error):
        return ErrorResult(txn.body.code)
    return MultiResult(tuple(ErrorResult(op.code) for op in txn.body.ops))


def _apply_multi(tree: DataTree, zxid: int, time_ms: int, op: Multi) -> MultiResult:
    # Ops share the zxid and time; later ops see the earlier ones. All or nothing: if
    # one does not fit (a TxnConflict to come), the ones before it are undone first.
    savepoint = tree.savepoint()
    try:
        results = tuple(_APPLY[type(o)](tree, zxid, time_ms, o) for o in op.ops)
    except BaseException:
        tree.rollback(savepoint)
        raise
    tree.release(savepoint)
    return MultiResult(results)


def apply_op(tree: DataTree, zxid: int, time_ms: int, op: Body) -> Result:
    """Apply one op of a transaction without the zxid bookkeeping of `apply` (the leader
    checks a multi's ops one by one against its future tree)."""
    return _APPLY[type(op)](tree, zxid, time_ms, op)


_APPLY: dict[type, Callable] = {
    Create: _apply_create, Delete: _apply_delete, SetData: _apply_set_data, SetACL: _apply_set_acl,
    Check: _apply_check, CreateSession: _apply_create_session, CloseSession: _apply_close_session,
    Error: _apply_error, Multi: _apply_multi, Reconfig: _apply_reconfig,
}


__all__ = [
    "FORMAT_VERSION", "Create", "Delete", "SetData", "SetACL", "Check", "CreateSession", "CloseSession",
    "Error", "Multi", "Reconfig", "ReconfigResult", "MultiOp", "Body", "Transaction", "CreateResult", "DeleteResult", "SetDataResult",
    "SetACLResult", "CheckResult", "ErrorResult", "SessionCreated", "SessionClosed", "MultiResult",
    "AlreadyApplied", "Result", "apply",
]
