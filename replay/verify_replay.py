"""Replay for the verifiers: snapshot files checked and restored, transactions applied
through the state machine's own code, tree digests taken at chosen zxids. Pure.

The metastore's `MetastoreStateMachine` does the work, exactly as a node does
at recovery: `restore(zxid, state)` from a snapshot, then `apply(zxid, data)` for
every later transaction, then `digest()`.

A snapshot's body comes in pieces (issue 19): the callers pass zab.storage.snapshot.read_body,
which checks the file's header before the first piece and its CRC after the last, and the tree
is rebuilt as the pieces are taken, so a snapshot file is never held whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from metastore.errors import MetastoreError, TxnConflict
from metastore.core.state_machine import MetastoreStateMachine
from zab.storage.storage_errors import SnapshotCorruptError
from zab.core.txn import Txn

# What the state machine raises when a transaction or a snapshot state does not fit: MalformedState
# (a ValueError) for bytes that do not decode, TxnConflict for a transaction that does not fit the tree;
# KeyError and TypeError in case damaged state reaches code that assumes less.
_APPLY_ERRORS = (MetastoreError, TxnConflict, ValueError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One snapshot file: `status` "ok" or "corrupt" (with `error`), its digest when ok."""

    zxid: int | None
    status: str
    digest: str | None
    error: str


class SnapshotDoesNotRestore(Exception):
    """A snapshot file passes its checks, but its state does not decode or fit a tree: a bug of
    the node that wrote it (or the file changed since it was checked)."""


def check_snapshot(body: Iterable[bytes], name_zxid: int, source: str) -> SnapshotInfo:
    """Verify a snapshot file whose body `body` yields in pieces (read_body: SnapshotCorruptError
    for a bad header, name or CRC) and restore its state, as it comes, to get its digest."""
    try:
        sm = restore(name_zxid, body, source)
    except SnapshotCorruptError as err:
        return SnapshotInfo(None, "corrupt", None, str(err))
    except SnapshotDoesNotRestore as err:
        return SnapshotInfo(name_zxid, "corrupt", None, str(err))
    return SnapshotInfo(name_zxid, "ok", sm.digest(), "")


def restore(zxid: int, state: bytes | Iterable[bytes] | None, source: str = "snapshot") -> MetastoreStateMachine:
    """A state machine at `zxid`: restored from `state` (a snapshot's body, whole or in pieces
    decoded as they are taken), or empty when `state` is None.

    SnapshotDoesNotRestore for a state that does not decode or fit. When decoding stops before
    the last piece, the rest is still read, so that a damaged file is reported by its CRC
    (SnapshotCorruptError from read_body), as a check of the whole file before decoding would."""
    sm = MetastoreStateMachine()
    if state is None:
        return sm
    pieces = iter((state,) if isinstance(state, (bytes, bytearray, memoryview)) else state)
    try:
        sm.restore(zxid, pieces, verify_digest=True)  # a node takes it; the verifier checks it
    except _APPLY_ERRORS as err:
        for _ in pieces:  # a damaged file raises its CRC mismatch at the end of its pieces
            pass
        raise SnapshotDoesNotRestore(f"snapshot {source}: state does not restore: {err}") from None
    return sm


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """Digests at the checkpoints passed, the last zxid applied, and the error that stopped it."""

    digests: list[tuple[int, str]]
    applied: int
    last_zxid: int
    error: str


def replay(sm: MetastoreStateMachine, start: int, end: int, txns: Iterable[Txn],
           checkpoints: Iterable[int]) -> ReplayOutcome:
    """Apply `txns` with start < zxid <= end in order; the digest at each checkpoint in (start, end].

    The state "at k" is the state after every txn <= k: it is taken when the next
    txn is above k, or at the end when k is the last txn applied (never beyond the
    log: a node's state past its last txn is unknown). A txn that does not apply
    stops the replay.
    """
    pending = sorted(k for k in set(checkpoints) if start < k <= end)
    digests: list[tuple[int, str]] = []
    applied, last = 0, start
    for txn in txns:
        if txn.zxid <= start:
            continue
        if txn.zxid > end:
            break
        while pending and pending[0] < txn.zxid:
            digests.append((pending.pop(0), sm.digest()))
        try:
            sm.apply(txn.zxid, txn.data)
        except _APPLY_ERRORS as err:
            return ReplayOutcome(digests, applied, last, f"txn {txn.zxid:#x} does not apply: {type(err).__name__}: {err}")
        applied, last = applied + 1, txn.zxid
    digests.extend((k, sm.digest()) for k in pending if k <= last)
    return ReplayOutcome(digests, applied, last, "")
