"""The interface between Zab and the replicated state machine it feeds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zab.core.ensemble import Ensemble


class MalformedState(ValueError):
    """Bytes from another node that this state machine cannot decode: a leader's
    snapshot (`restore`), a committed transaction's payload (`apply`, `check`) or a
    refusal (`refused`). Raised before the state changes at all, so the caller can
    treat it as the sender's fault: a follower drops its leader and resyncs."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """What `prepare` returns for a request that fails without changing the state.

    It is answered, not proposed: no zxid, no log record, no quorum round. The
    leader holds the answer until every transaction it prepared before the
    request has committed, and sends it down the origin's FIFO link after those
    COMMITs, so the client sees it in the same order (and after the same state)
    as an error transaction would give. `data` goes to `StateMachine.refused` on
    the node the client is connected to.
    """

    data: bytes


class Frozen(Protocol):
    """An immutable view of the state at one zxid, serialisable off the event loop."""

    zxid: int

    def to_bytes(self) -> bytes: ...

    def chunks(self, chunk_bytes: int) -> Iterator[bytes]:
        """The serialized state in pieces of at most `chunk_bytes` (together: to_bytes()), each
        encoded when it is taken: a SNAP and a snapshot file never hold the whole (issue 19)."""


class Restore(Protocol):
    """A snapshot arriving in pieces, decoded as it comes (StateMachine.restorer)."""

    def feed(self, chunk: bytes) -> None:
        """The next piece, of any size; MalformedState as soon as what arrived cannot be a snapshot."""

    def install(self) -> None:
        """Replace the state machine's whole state with the snapshot fed; MalformedState, with the
        state unchanged, if it is incomplete, inconsistent or not at the zxid it was begun for."""


class StateMachine(Protocol):
    """A deterministic state machine driven by committed transactions in zxid order.

    Zab calls `prepare` on the leader only, turning a client request into an
    idempotent transaction against the leader's view of the future state (paper
    section 1); every node calls `apply` for each committed transaction, in
    zxid order, exactly once per incarnation of the state.

    Bytes that come from another node (a leader's snapshot, transactions, refusals)
    may be garbage if that node has a bug: the methods that decode them raise
    MalformedState, and only for that, so the learner can blame its leader.
    """

    last_zxid: int

    def prepare(self, zxid: int, session_id: int, request: bytes, decoded: object = None, *,
                synced: frozenset[int] = frozenset()) -> bytes | Refusal:
        """Leader only: the transaction `zxid` for `request` from `session_id`, given every
        transaction already prepared (and not yet applied); or a Refusal, which must
        leave the prepared view as it was (`zxid` is then used by the next request).
        `decoded`, when not None, is what this process's client edge decoded `request` to
        (ClientRequest.decoded, in the state machine's own form): use it instead of decoding
        again. Requests forwarded from other nodes always come as bytes alone. `synced`: the
        members whose logs follow the leader's now (itself included), for a reconfig, which
        must be refused unless a quorum of its new voters is among them."""

    def refused(self, zxid: int, refusal: bytes) -> object:
        """The result for the waiting client of a refused request (Refusal.data), answered
        once this node has applied everything through `zxid`; the state does not change.
        MalformedState if `refusal` does not decode to a refusal."""

    def check(self, txn: bytes) -> None:
        """MalformedState if `apply` could not decode `txn`; nothing else, and no change.
        A learner checks each transaction its leader sends before logging or acking it."""

    def forget_prepared(self) -> None:
        """Drop the leader's view of prepared but unapplied transactions (leadership ended or began)."""

    def apply(self, zxid: int, txn: bytes) -> object:
        """Apply one committed transaction; returns the result for the waiting client
        (any object: it stays in this process). It decodes `txn` whole before changing
        anything: bytes that do not decode raise MalformedState with the state as it was
        (a follower then resyncs instead of ending); anything raised while applying a
        transaction that decoded is our own bug and ends the node."""

    def freeze(self) -> Frozen:
        """A consistent copy at `last_zxid`, cheap to take, serialised later."""

    def restore(self, zxid: int, state: bytes | Iterable[bytes]) -> None:
        """Replace the whole state with a snapshot taken at `zxid`, whole or in pieces (read
        from a file as they are taken); MalformedState, with the state unchanged, if `state`
        does not decode to a snapshot at `zxid`."""

    def restorer(self, zxid: int) -> Restore:
        """Begin a restore whose pieces come one at a time (a learner's SNAPCHUNKs); nothing
        changes until its install()."""

    def digest(self) -> str:
        """A hash of the whole state: equal on every node at the same zxid."""

    def ensemble_of(self, txn: bytes) -> bytes | None:
        """The server lines (zab/core/ensemble.py) a reconfig transaction sets, or None for any
        other transaction. Cheap: Zab asks it of every transaction it logs, to know a pending
        reconfig (whose ensemble every quorum must then include)."""

    def show_ensemble(self, ensemble: Ensemble) -> None:
        """This node's committed ensemble is now `ensemble` (at start, or adopted from a
        leader): a state machine that shows it (ZooKeeper's /zookeeper/config) shows this."""
