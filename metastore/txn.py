"""Metastore transactions: the records the leader produces and every node applies,
their byte encoding, the tree snapshot encoding, and `apply`.

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

Byte layouts (docs/metastore_tree.md): big-endian; strings u32 length + UTF-8;
byte strings u32 length + bytes. Pure: no I/O.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Union

from metastore import paths
from metastore.acl import ACL, Id, encode_acl
from metastore.errors import BadArguments, DecodeError, TxnConflict, ZooKeeperError
from metastore.stat import Stat
from metastore.tree import DataTree, Node, NodeRecord, ephemeral_type, is_session_id

FORMAT_VERSION = 1


# -- records -----------------------------------------------------------------------

@dataclass(slots=True, unsafe_hash=True)
class Create:
    path: str                    # final path (a sequential suffix already appended)
    data: bytes
    acl: tuple[ACL, ...]         # as stored ("auth" already expanded)
    ephemeral_owner: int         # 0, a session id, CONTAINER_OWNER or a TTL owner (metastore.tree)
    parent_cversion: int         # the parent's internal cversion after this create (old + 1)


@dataclass(slots=True, unsafe_hash=True)
class Delete:
    path: str


@dataclass(slots=True, unsafe_hash=True)
class SetData:
    path: str
    data: bytes
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


MultiOp = Union[Create, Delete, SetData, Check, Error]


@dataclass(slots=True, unsafe_hash=True)
class Multi:
    """All ops succeed together, or every op is an Error record (a failed multi)."""
    ops: tuple[MultiOp, ...]


Body = Union[Create, Delete, SetData, SetACL, CreateSession, CloseSession, Multi, Error]


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
               MultiResult, ErrorResult, AlreadyApplied]


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
    Error: _apply_error, Multi: _apply_multi,
}


# -- byte primitives -----------------------------------------------------------------

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">Bq")          # format version, time_ms
_TAG = struct.Struct(">b")


def _blob(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def _text(value: str) -> bytes:
    return _blob(value.encode())


# Decoded ACL lists by their bytes: a pure memo (same bytes, same value), bounded.
_ACL_CACHE: dict[bytes, tuple[ACL, ...]] = {}
_ACL_CACHE_MAX = 1024


class Reader:
    """Reads a buffer front to back; DecodeError on anything short, long or malformed."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = bytes(buf)
        self.pos = 0

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def unpack(self, st: struct.Struct) -> tuple:
        if self.pos + st.size > len(self.buf):
            raise DecodeError(f"truncated at byte {self.pos}")
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise DecodeError(f"length {n} at byte {self.pos} runs past the end")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def blob(self) -> bytes:
        return self.take(self.unpack(_U32)[0])

    def text(self) -> str:
        try:
            return self.blob().decode()
        except UnicodeDecodeError as e:
            raise DecodeError(f"string is not UTF-8: {e}") from None

    def path(self) -> str:
        value = self.text()
        try:
            paths.validate_path(value)
        except BadArguments as e:
            raise DecodeError(f"invalid path: {e}") from None
        return value

    def count(self, min_item_bytes: int) -> int:
        """A u32 element count, refused if the rest of the buffer cannot hold that many."""
        n = self.unpack(_U32)[0]
        if n * min_item_bytes > self.remaining():
            raise DecodeError(f"count {n} at byte {self.pos - 4} cannot fit in the rest")
        return n

    def acl(self) -> tuple[ACL, ...]:
        """An ACL list; the same bytes give the same (shared) tuple, as most znodes share a few ACLs."""
        start = self.pos
        n = self.count(12)
        for _ in range(n):  # find the span first: a cache hit then costs no objects
            self.pos += 4
            self.take(self.unpack(_U32)[0])
            self.take(self.unpack(_U32)[0])
        raw = self.buf[start:self.pos]
        cached = _ACL_CACHE.get(raw)
        if cached is None:
            self.pos = start + 4
            cached = tuple(ACL(self.unpack(_I32)[0], Id(self.text(), self.text())) for _ in range(n))
            if len(_ACL_CACHE) >= _ACL_CACHE_MAX:
                _ACL_CACHE.clear()
            _ACL_CACHE[raw] = cached
        return cached

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError(f"{self.remaining()} trailing bytes")


# -- transaction codec ---------------------------------------------------------------
# Tags are ZooKeeper's OpCodes: create 1, delete 2, setData 5, setACL 7, check 13,
# multi 14, createSession -10, closeSession -11, error -1.

_CREATE_TAIL = struct.Struct(">Qi")   # ephemeral owner, parent cversion
_SESSION = struct.Struct(">Qi")       # session id, timeout_ms
_U64 = struct.Struct(">Q")


def _encode_body(body: Body) -> bytes:
    if isinstance(body, Create):
        return (b"\x01" + _text(body.path) + _blob(body.data) + encode_acl(body.acl)
                + _CREATE_TAIL.pack(body.ephemeral_owner, body.parent_cversion))
    if isinstance(body, Delete):
        return b"\x02" + _text(body.path)
    if isinstance(body, SetData):
        return b"\x05" + _text(body.path) + _blob(body.data) + _I32.pack(body.version)
    if isinstance(body, SetACL):
        return b"\x07" + _text(body.path) + encode_acl(body.acl) + _I32.pack(body.version)
    if isinstance(body, Check):
        return b"\x0d" + _text(body.path) + _I32.pack(body.version)
    if isinstance(body, Multi):
        return b"\x0e" + _U32.pack(len(body.ops)) + b"".join(_encode_body(o) for o in body.ops)
    if isinstance(body, CreateSession):
        return _TAG.pack(-10) + _SESSION.pack(body.session_id, body.timeout_ms)
    if isinstance(body, CloseSession):
        return (_TAG.pack(-11) + _U64.pack(body.session_id) + _U32.pack(len(body.ephemerals))
                + b"".join(_text(p) for p in body.ephemerals))
    if isinstance(body, Error):
        return _TAG.pack(-1) + _I32.pack(body.code)
    raise TypeError(f"not a transaction body: {body!r}")


def encode_txn(txn: Transaction) -> bytes:
    """The canonical bytes of a transaction (struct.error if a field is out of range)."""
    return _HEAD.pack(FORMAT_VERSION, txn.time_ms) + _encode_body(txn.body)


def decode_txn(data: bytes | bytearray | memoryview) -> Transaction:
    """The transaction `data` encodes; DecodeError (only) if it is not a valid one."""
    reader = Reader(data)
    version, time_ms = reader.unpack(_HEAD)
    if version != FORMAT_VERSION:
        raise DecodeError(f"unknown transaction format version {version}")
    body = _decode_body(reader, nested=False)
    reader.end()
    if isinstance(body, Error) and body.code == 0:
        raise DecodeError("an Error transaction needs a non-zero code")
    return Transaction(time_ms, body)


def _decode_create(r: Reader) -> Create:
    path, data, acl = r.path(), r.blob(), r.acl()
    owner, parent_cversion = r.unpack(_CREATE_TAIL)
    if path == paths.ROOT:
        raise DecodeError("cannot create the root")
    try:
        ephemeral_type(owner)
    except ValueError as e:
        raise DecodeError(str(e)) from None
    return Create(path, data, acl, owner, parent_cversion)


def _decode_close_session(r: Reader) -> CloseSession:
    session_id = r.unpack(_U64)[0]
    ephemerals = tuple(r.path() for _ in range(r.count(4)))
    if not is_session_id(session_id):
        raise DecodeError(f"{session_id:#x} is not a session id")
    if any(a >= b for a, b in zip(ephemerals, ephemerals[1:])):
        raise DecodeError("closeSession ephemerals must be sorted and distinct")
    return CloseSession(session_id, ephemerals)


def _decode_create_session(r: Reader) -> CreateSession:
    session_id, timeout_ms = r.unpack(_SESSION)
    if not is_session_id(session_id) or timeout_ms <= 0:
        raise DecodeError(f"invalid session {session_id:#x} with timeout {timeout_ms}")
    return CreateSession(session_id, timeout_ms)


def _decode_multi(r: Reader) -> Multi:
    ops = tuple(_decode_body(r, nested=True) for _ in range(r.count(5)))
    errors = sum(isinstance(o, Error) for o in ops)
    if errors not in (0, len(ops)):
        raise DecodeError("a multi is either all ops or all errors")
    return Multi(ops)  # type: ignore[arg-type]


def _decode_body(r: Reader, *, nested: bool) -> Body:
    tag = r.unpack(_TAG)[0]
    if tag == 1:
        return _decode_create(r)
    if tag == 2:
        path = r.path()
        if path == paths.ROOT:
            raise DecodeError("cannot delete the root")
        return Delete(path)
    if tag == 5:
        return SetData(r.path(), r.blob(), r.unpack(_I32)[0])
    if tag == -1:
        return Error(r.unpack(_I32)[0])
    if tag == 13 and nested:
        return Check(r.path(), r.unpack(_I32)[0])
    if not nested:
        if tag == 7:
            return SetACL(r.path(), r.acl(), r.unpack(_I32)[0])
        if tag == 14:
            return _decode_multi(r)
        if tag == -10:
            return _decode_create_session(r)
        if tag == -11:
            return _decode_close_session(r)
    raise DecodeError(f"unknown {'multi op' if nested else 'transaction'} tag {tag}")


# -- snapshot codec --------------------------------------------------------------------

SNAPSHOT_MAGIC = b"QZNT"
SNAPSHOT_VERSION = 1
_SNAP_HEAD = struct.Struct(">4sBQQ")         # magic, version, last_zxid, digest
_NODE = struct.Struct(">IQQQqqiiiQ")         # acl index, czxid, mzxid, pzxid, ctime, mtime,
                                             # version, cversion (internal), aversion, owner
_NODE_MIN_BYTES = 8 + _NODE.size


def encode_snapshot(last_zxid: int, nodes: dict[str, Node], sessions: dict[int, int], digest: int) -> bytes:
    """Deterministic snapshot bytes: the same tree gives the same bytes on every node."""
    acl_index: dict[tuple[ACL, ...], int] = {}
    acl_parts: list[bytes] = []
    node_parts: list[bytes] = []
    ordered = sorted(p for p in nodes if p != paths.CONFIG)
    for path in ordered:
        node = nodes[path]
        index = acl_index.get(node.acl)
        if index is None:
            index = acl_index[node.acl] = len(acl_parts)
            acl_parts.append(encode_acl(node.acl))
        node_parts += [_text(path), _blob(node.data), _NODE.pack(
            index, node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime,
            node.version, node.cversion, node.aversion, node.owner)]
    session_parts = [_SESSION.pack(s, sessions[s]) for s in sorted(sessions)]
    return b"".join([_SNAP_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, last_zxid, digest),
                     _U32.pack(len(acl_parts)), *acl_parts,
                     _U32.pack(len(session_parts)), *session_parts,
                     _U32.pack(len(ordered)), *node_parts])


def decode_snapshot(data: bytes | bytearray | memoryview) -> DataTree:
    """The tree a snapshot holds; DecodeError if malformed, inconsistent, or its digest is wrong."""
    r = Reader(data)
    magic, version, last_zxid, digest = r.unpack(_SNAP_HEAD)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise DecodeError(f"not a version {SNAPSHOT_VERSION} tree snapshot")
    acls = [r.acl() for _ in range(r.count(4))]
    sessions: dict[int, int] = {}
    for _ in range(r.count(_SESSION.size)):
        session_id, timeout_ms = r.unpack(_SESSION)
        if session_id in sessions or timeout_ms <= 0:
            raise DecodeError(f"duplicate or invalid session {session_id:#x}")
        sessions[session_id] = timeout_ms
    records = [_read_node(r, acls) for _ in range(r.count(_NODE_MIN_BYTES))]
    r.end()
    try:
        tree = DataTree.assemble(last_zxid, sessions, records)
    except (ValueError, BadArguments, KeyError) as e:
        raise DecodeError(f"inconsistent snapshot: {e}") from None
    if tree.digest() != digest:
        raise DecodeError(f"snapshot digest {digest:#x} != content digest {tree.digest():#x}")
    return tree


def _read_node(r: Reader, acls: list[tuple[ACL, ...]]) -> NodeRecord:
    path, data = r.text(), r.blob()
    index, *fields = r.unpack(_NODE)
    if index >= len(acls):
        raise DecodeError(f"{path!r}: ACL index {index} out of range")
    try:
        ephemeral_type(fields[-1])
    except ValueError as e:
        raise DecodeError(str(e)) from None
    return (path, data, acls[index], *fields)  # type: ignore[return-value]


__all__ = [
    "FORMAT_VERSION", "Create", "Delete", "SetData", "SetACL", "Check", "CreateSession", "CloseSession",
    "Error", "Multi", "MultiOp", "Body", "Transaction", "CreateResult", "DeleteResult", "SetDataResult",
    "SetACLResult", "CheckResult", "ErrorResult", "SessionCreated", "SessionClosed", "MultiResult",
    "AlreadyApplied", "Result", "apply", "encode_txn", "decode_txn", "encode_snapshot", "decode_snapshot",
    "Reader",
]
