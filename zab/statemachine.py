"""The interface between Zab and the replicated state machine it feeds."""

from __future__ import annotations

from typing import Protocol


class Frozen(Protocol):
    """An immutable view of the state at one zxid, serialisable off the event loop."""

    zxid: int

    def to_bytes(self) -> bytes: ...


class StateMachine(Protocol):
    """A deterministic state machine driven by committed transactions in zxid order.

    Zab calls `prepare` on the leader only, turning a client request into an
    idempotent transaction against the leader's view of the future state (paper
    section 1); every node calls `apply` for each committed transaction, in
    zxid order, exactly once per incarnation of the state.
    """

    last_zxid: int

    def prepare(self, zxid: int, session_id: int, request: bytes) -> bytes:
        """Leader only: the transaction `zxid` for `request` from `session_id`, given every
        transaction already prepared (and not yet applied)."""

    def forget_prepared(self) -> None:
        """Drop the leader's view of prepared but unapplied transactions (leadership ended or began)."""

    def apply(self, zxid: int, txn: bytes) -> object:
        """Apply one committed transaction; returns the result for the waiting client
        (any object: it stays in this process)."""

    def freeze(self) -> Frozen:
        """A consistent copy at `last_zxid`, cheap to take, serialised later."""

    def restore(self, zxid: int, state: bytes) -> None:
        """Replace the whole state with a snapshot taken at `zxid`."""

    def digest(self) -> str:
        """A hash of the whole state: equal on every node at the same zxid."""
