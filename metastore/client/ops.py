"""Requests and results of the metastore client, pure: the ops of a multi, ACL helpers,
create flags, and the decoding of replies into values or typed errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from metastore.core import acl as A
from metastore.wire import jute_records as J
from metastore.client.core import ANY_VERSION, Version, wire_version
from metastore.errors import MetastoreError, ZooKeeperError, error_for_code
from metastore.wire.jute_defs import CreateMode, Err, OpCode, Perms
from metastore.core.stat import Stat

# --- ACLs ----------------------------------------------------------------------------

ACL = J.ACL
Id = J.Id
ANYONE = J.Id("world", "anyone")
OPEN_ACL_UNSAFE: tuple[J.ACL, ...] = (J.ACL(Perms.ALL, ANYONE),)
READ_ACL_UNSAFE: tuple[J.ACL, ...] = (J.ACL(Perms.READ, ANYONE),)
CREATOR_ALL_ACL: tuple[J.ACL, ...] = (J.ACL(Perms.ALL, J.Id("auth", "")),)


def digest_acl(user: str, password: str, perms: int = Perms.ALL) -> J.ACL:
    """An ACL entry for the session that did add_auth("digest", "user:password")."""
    return J.ACL(int(perms), J.Id("digest", A.generate_digest(f"{user}:{password}")))


def create_mode(ephemeral: bool, sequential: bool) -> CreateMode:
    if ephemeral:
        return CreateMode.EPHEMERAL_SEQUENTIAL if sequential else CreateMode.EPHEMERAL
    return CreateMode.PERSISTENT_SEQUENTIAL if sequential else CreateMode.PERSISTENT


def stat_dict(stat: Stat) -> dict[str, int]:
    return asdict(stat)


# --- multi ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes | None = b""  # None: null data, which reads back as None (not b"")
    acl: Sequence[J.ACL] | None = None  # None: OPEN_ACL_UNSAFE
    ephemeral: bool = False
    sequential: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: Version = ANY_VERSION


@dataclass(frozen=True, slots=True)
class SetData:
    path: str
    data: bytes | None
    version: Version = ANY_VERSION


@dataclass(frozen=True, slots=True)
class Check:
    """Passes if the node is at `version` (never ANY_VERSION: that would check nothing)."""

    path: str
    version: int


Op = Create | Delete | SetData | Check


def wire_data(data: bytes | bytearray | memoryview | None) -> bytes | None:
    """Znode data as a request carries it: None stays None, null data on the wire (length -1)."""
    return None if data is None else bytes(data)


def create_request(path: str, data: bytes | None, acl: Sequence[J.ACL] | None, ephemeral: bool,
                   sequential: bool) -> J.CreateRequest:
    return J.CreateRequest(path, wire_data(data), tuple(OPEN_ACL_UNSAFE if acl is None else acl),
                           int(create_mode(ephemeral, sequential)))


def multi_request(ops: Sequence[Op]) -> J.MultiRequest:
    encoded: list[tuple[int, object]] = []
    for op in ops:
        if isinstance(op, Create):
            encoded.append((OpCode.CREATE, create_request(op.path, op.data, op.acl, op.ephemeral, op.sequential)))
        elif isinstance(op, Delete):
            encoded.append((OpCode.DELETE, J.DeleteRequest(op.path, wire_version(op.version))))
        elif isinstance(op, SetData):
            encoded.append((OpCode.SET_DATA, J.SetDataRequest(op.path, wire_data(op.data), wire_version(op.version))))
        elif isinstance(op, Check):
            encoded.append((OpCode.CHECK, J.CheckVersionRequest(op.path, wire_version(op.version))))
        else:
            raise TypeError(f"a multi op is Create, Delete, SetData or Check, got {op!r}")
    return J.MultiRequest(tuple(encoded))


class RolledBack(MetastoreError):
    """The result of a multi op that succeeded, then was undone because another op failed."""


class MultiFailed(MetastoreError):
    """A multi did not take effect (all or nothing). `index` is the op that failed,
    `error` its error (a ZooKeeperError: BadVersion, NoNode, ...), and `results` one
    entry per op: RolledBack before it, its error, RuntimeInconsistency after it."""

    def __init__(self, index: int, error: ZooKeeperError, results: tuple[Exception, ...]) -> None:
        self.index, self.error, self.results = index, error, results
        super().__init__(f"multi op {index} failed: {error}")


MultiResult = str | Stat | None  # Create: the path; SetData: the Stat; Delete, Check: None


def multi_results(ops: Sequence[Op], response: J.MultiResponse) -> list[MultiResult]:
    """Per-op results of a successful multi, or MultiFailed."""
    results = response.results
    if len(results) != len(ops):
        raise ZooKeeperError(None, f"multi of {len(ops)} ops answered with {len(results)} results")
    failed = next((i for i, r in enumerate(results) if isinstance(r, J.ErrorResult) and r.err != Err.OK), None)
    if failed is not None:
        errors: list[Exception] = []
        for op, r in zip(ops, results):
            code = r.err if isinstance(r, J.ErrorResult) else Err.OK
            errors.append(RolledBack(f"{op.path}: rolled back") if code == Err.OK else error_for_code(code, op.path))
        error = errors[failed]
        assert isinstance(error, ZooKeeperError)
        raise MultiFailed(failed, error, tuple(errors))
    out: list[MultiResult] = []
    for r in results:
        if isinstance(r, (J.CreateResponse, J.Create2Response)):
            out.append(r.path)
        elif isinstance(r, J.SetDataResponse):
            out.append(r.stat)
        else:
            out.append(None)
    return out
