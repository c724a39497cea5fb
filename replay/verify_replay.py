"""Replay for the verifiers: snapshot files checked and restored, transactions applied
through the state machine's own code, tree digests taken at chosen zxids. Pure.

The metastore's `MetastoreStateMachine` does the work, exactly as a node does
at recovery: `restore(zxid, state)` from a snapshot, then `apply(zxid, data)` for
every later transaction, then `digest()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from metastore.errors import MetastoreError, TxnConflict
from metastore.core.state_machine import MetastoreStateMachine
from zab.storage.snapshot import decode_snapshot
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


def check_snapshot(buf: bytes, name_zxid: int, source: str) -> SnapshotInfo:
    """Verify a snapshot file's bytes (zab.storage.snapshot) and restore its state to get its digest."""
    try:
        zxid, state = decode_snapshot(buf, source=source)
    except SnapshotCorruptError as err:
        return SnapshotInfo(None, "corrupt", None, str(err))
    if zxid != name_zxid:
        return SnapshotInfo(zxid, "corrupt", None, f"snapshot {source}: header zxid {zxid:#x} differs from its name")
    try:
        sm = restore(zxid, state)
    except _APPLY_ERRORS as err:
        return SnapshotInfo(zxid, "corrupt", None, f"snapshot {source}: state does not restore: {err}")
    return SnapshotInfo(zxid, "ok", sm.digest(), "")


def restore(zxid: int, state: bytes | None) -> MetastoreStateMachine:
    """A state machine at `zxid`: restored from `state`, or empty when `state` is None."""
    sm = MetastoreStateMachine()
    if state is not None:
        sm.restore(zxid, state)
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
