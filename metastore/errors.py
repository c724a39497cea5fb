"""Errors of the metastore package.

Three kinds, kept apart (STYLE.md habit 6):

- `ZooKeeperError` and its subclasses: the outcomes ZooKeeper reports to a client
  with a `KeeperException.Code`. Each class carries that integer as `code` (it goes
  on the wire and into Error transaction records unchanged). They are expected
  outcomes (NoNode, BadVersion, ...), not bugs.
- `DecodeError`: bytes that are not a valid transaction or snapshot (a corrupt log
  record, a damaged snapshot, a peer speaking nonsense).
- `TxnConflict`: a committed transaction that does not fit the state it is applied
  to. The leader prepared it against a different state, or replay skipped or
  repeated history. That is a bug: it is an AssertionError and nothing catches it.
"""

from __future__ import annotations

from typing import ClassVar


class MetastoreError(Exception):
    """Base of the errors the metastore package raises to its callers."""


class ZooKeeperError(MetastoreError):
    """An outcome with a ZooKeeper error code. `path` names the znode concerned, if any."""

    code: ClassVar[int] = 0

    def __init__(self, path: str | None = None, reason: str = "") -> None:
        self.path = path
        self.reason = reason
        detail = f"{type(self).__name__} ({self.code})"
        if path is not None:
            detail += f" for {path!r}"
        if reason:
            detail += f": {reason}"
        super().__init__(detail)


# System errors: the server's side (ZooKeeper's codes below APIERROR are "system" errors).
class SystemZooKeeperError(ZooKeeperError):
    code = -1


class RuntimeInconsistency(ZooKeeperError):
    """Also the per-op code of the ops after the failing one in a failed multi."""
    code = -2


class DataInconsistency(ZooKeeperError):
    code = -3


class ConnectionLoss(ZooKeeperError):
    code = -4


class MarshallingError(ZooKeeperError):
    code = -5


class Unimplemented(ZooKeeperError):
    code = -6


class OperationTimeout(ZooKeeperError):
    code = -7


class BadArguments(ZooKeeperError):
    code = -8


class UnknownSession(ZooKeeperError):
    code = -12


class NewConfigNoQuorum(ZooKeeperError):
    code = -13


class ReconfigInProgress(ZooKeeperError):
    code = -14


# API errors: what the client asked for cannot be done.
class NoNode(ZooKeeperError):
    code = -101


class NoAuth(ZooKeeperError):
    code = -102


class BadVersion(ZooKeeperError):
    code = -103


class NoChildrenForEphemerals(ZooKeeperError):
    code = -108


class NodeExists(ZooKeeperError):
    code = -110


class NotEmpty(ZooKeeperError):
    code = -111


class SessionExpired(ZooKeeperError):
    code = -112


class InvalidCallback(ZooKeeperError):
    code = -113


class InvalidACL(ZooKeeperError):
    code = -114


class AuthFailed(ZooKeeperError):
    code = -115


class SessionMoved(ZooKeeperError):
    code = -118


class NotReadOnly(ZooKeeperError):
    code = -119


class EphemeralOnLocalSession(ZooKeeperError):
    code = -120


class NoWatcher(ZooKeeperError):
    code = -121


class RequestTimeout(ZooKeeperError):
    code = -122


class ReconfigDisabled(ZooKeeperError):
    code = -123


class SessionClosedRequireSaslAuth(ZooKeeperError):
    code = -124


class QuotaExceeded(ZooKeeperError):
    code = -125


class Throttled(ZooKeeperError):
    code = -127


OK = 0  # the code of a successful op (and of the ops before the failing one in a failed multi)

BY_CODE: dict[int, type[ZooKeeperError]] = {cls.code: cls for cls in (
    SystemZooKeeperError, RuntimeInconsistency, DataInconsistency, ConnectionLoss, MarshallingError,
    Unimplemented, OperationTimeout, BadArguments, UnknownSession, NewConfigNoQuorum, ReconfigInProgress,
    NoNode, NoAuth, BadVersion, NoChildrenForEphemerals, NodeExists, NotEmpty, SessionExpired,
    InvalidCallback, InvalidACL, AuthFailed, SessionMoved, NotReadOnly, EphemeralOnLocalSession,
    NoWatcher, RequestTimeout, ReconfigDisabled, SessionClosedRequireSaslAuth, QuotaExceeded, Throttled,
)}


def error_for_code(code: int, path: str | None = None) -> ZooKeeperError:
    """The exception for a non-zero ZooKeeper code (an unknown code becomes SystemZooKeeperError)."""
    if code == OK:
        raise ValueError("code 0 is success, not an error")
    cls = BY_CODE.get(code)
    if cls is None:
        return SystemZooKeeperError(path, f"unknown error code {code}")
    return cls(path)


class DecodeError(MetastoreError, ValueError):
    """Bytes that are not a valid metastore transaction or tree snapshot."""


class TxnConflict(AssertionError):
    """A committed transaction does not fit the state it is applied to: a bug, so a crash."""
