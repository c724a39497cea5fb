"""The metastore as Zab's state machine: prepare on the leader, apply everywhere.

`prepare` turns an envelope (metastore.wire.envelope) into a transaction with the
Preparer; `apply` decodes and applies a committed transaction to the tree and
returns an `Applied` record: the result for the waiting client and the watch
events the change causes, which the client-port service delivers.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from metastore.wire import envelope as E
from metastore.errors import DecodeError, MarshallingError
from metastore.wire.jute import decode_request
from metastore.wire.jute_defs import JuteError, OpCode
from metastore.core.prep import CLAIM_SESSION, DEFAULT_MAX_DATA_BYTES, INIT_SECRET, Preparer
from metastore.wire.snapshot_codec import FrozenTree
from metastore.wire.snapshot_stream import SnapshotDecoder
from metastore.core.tree import DataTree
from metastore.core.txn import (AlreadyApplied, Error, ErrorResult, MultiResult, Result, Transaction, apply, apply_refusal,
                           failed)
from metastore.wire.txn_codec import decode_txn, encode_txn, reconfig_spec
from zab.core.ensemble import Ensemble
from metastore.core.watches import WatchEvent, watch_events
from zab.core.statemachine import MalformedState, Refusal


@dataclass(slots=True, unsafe_hash=True)
class Applied:
    zxid: int
    txn: Transaction
    result: Result
    events: tuple[WatchEvent, ...]


class MetastoreStateMachine:
    def __init__(self, *, max_data_bytes: int = DEFAULT_MAX_DATA_BYTES) -> None:
        self.tree = DataTree()
        self.prep = Preparer(self.tree, max_data_bytes=max_data_bytes)

    @property
    def last_zxid(self) -> int:
        return self.tree.last_zxid

    # -- leader --------------------------------------------------------------------
    def prepare(self, zxid: int, session_id: int, request: bytes, decoded: object = None, *,
                synced: frozenset[int] = frozenset()) -> bytes | Refusal:
        """`decoded`: (Envelope, opcode, body) as the client port built and decoded them, for a
        request from this node's own client; else `request` is decoded here."""
        if decoded is not None:
            env, opcode, body = decoded
        else:
            try:
                env = E.decode_envelope(request)
                opcode, body = _decode(env)
            except (E.EnvelopeError, JuteError, struct.error, UnicodeDecodeError):
                return Refusal(encode_txn(Transaction(0, Error(MarshallingError.code))))
        txn = self.prep.prepare(zxid, session_id, env, opcode, body, synced)
        return Refusal(encode_txn(txn)) if failed(txn) else encode_txn(txn)

    def forget_prepared(self) -> None:
        self.prep.forget()

    # -- every node --------------------------------------------------------------------
    def refused(self, zxid: int, refusal: bytes) -> Applied:
        """A failed request's answer (an Error or failed-Multi transaction never proposed);
        its reply carries `zxid`, the last one applied here before it."""
        t = _decode_txn(refusal)
        if not failed(t):
            raise MalformedState("a refusal must be a failed request's transaction, not one that changes the tree")
        return Applied(zxid, t, apply_refusal(t), ())

    def check(self, txn: bytes) -> None:
        _decode_txn(txn)

    def apply(self, zxid: int, txn: bytes) -> Applied:
        # Decoded whole before the tree is touched, so MalformedState leaves it as it was;
        # a TxnConflict while applying a transaction that decoded is our bug: a crash.
        t = _decode_txn(txn)
        events = watch_events(self.tree, t.body)  # before apply: a deleted znode's ACL goes with it
        result = apply(self.tree, zxid, t)
        self.prep.settled(zxid)
        return Applied(zxid, t, result, _events(result, events))

    def freeze(self) -> FrozenTree:
        return FrozenTree.of(self.tree)

    def restore(self, zxid: int, state: bytes | Iterable[bytes], *, verify_digest: bool = False) -> None:
        """The tree of a snapshot at `zxid`, whole or in pieces (decoded as they are taken).
        `verify_digest`: recompute the snapshot's digest from its znodes (the verifiers do; a
        node takes it, see TreeRestore)."""
        restore = TreeRestore(self, zxid, verify_digest=verify_digest)
        for chunk in (state,) if isinstance(state, (bytes, bytearray, memoryview)) else state:
            restore.feed(chunk)
        restore.install()

    def restorer(self, zxid: int) -> TreeRestore:
        return TreeRestore(self, zxid)

    def _install(self, tree: DataTree) -> None:
        self.tree = tree
        self.prep.tree = tree
        self.prep.forget()
        ensemble = self.prep.ensemble  # /zookeeper/config is no snapshot's: it stays this node's
        tree.set_config_node(ensemble.config_data(), ensemble.version, 0)

    def ensemble_of(self, txn: bytes) -> bytes | None:
        try:
            return reconfig_spec(txn)
        except DecodeError:
            return None  # `check` or `apply` says why, in its own way

    def show_ensemble(self, ensemble: Ensemble) -> None:
        """/zookeeper/config shows `ensemble` (its zxid as mzxid and version line), and a
        reconfig is prepared against it."""
        self.tree.set_config_node(ensemble.config_data(), ensemble.version, 0)
        self.prep.ensemble = ensemble

    def digest(self) -> str:
        return f"{self.tree.digest():016x}"


class TreeRestore:
    """zab's Restore for the metastore: the tree rebuilt znode by znode as the snapshot's pieces
    arrive (metastore/wire/snapshot_stream.py); the state machine keeps its old tree until install."""

    def __init__(self, sm: MetastoreStateMachine, zxid: int, *, verify_digest: bool = False) -> None:
        # Zab hands over snapshot bytes checked whole (a file's body CRC, a SNAP's SHA-256): the
        # digest they carry is taken, not recomputed znode by znode (docs/metastore_tree.md).
        self._sm, self._zxid = sm, zxid
        self._decoder = SnapshotDecoder(verify_digest=verify_digest)

    def feed(self, chunk: bytes) -> None:
        try:
            self._decoder.feed(chunk)
        except DecodeError as e:
            raise MalformedState(f"not a tree snapshot: {e}") from None
        found = self._decoder.last_zxid
        if found is not None and found != self._zxid:  # refused at the header, not gigabytes later
            raise MalformedState(f"snapshot holds zxid {found:#x}, expected {self._zxid:#x}")

    def install(self) -> None:
        try:
            tree = self._decoder.finish()
        except DecodeError as e:
            raise MalformedState(f"not a tree snapshot: {e}") from None
        if tree.last_zxid != self._zxid:
            raise MalformedState(f"snapshot holds zxid {tree.last_zxid:#x}, expected {self._zxid:#x}")
        self._sm._install(tree)


def _decode_txn(data: bytes) -> Transaction:
    try:
        return decode_txn(data)
    except DecodeError as e:  # decode_txn's only error (fuzzed in tests/test_metastore_txn_fuzz.py)
        raise MalformedState(f"not a metastore transaction: {e}") from None


def _decode(env: E.Envelope) -> tuple[int, object]:
    if env.kind == E.CREATE_SESSION:
        (timeout_ms,) = struct.unpack(">i", env.payload)
        return OpCode.CREATE_SESSION, timeout_ms
    if env.kind == E.CLOSE_SESSION:
        return OpCode.CLOSE_SESSION, None
    if env.kind == E.CLAIM_SESSION:
        return CLAIM_SESSION, None
    if env.kind == E.INIT_SECRET:
        return INIT_SECRET, env.payload
    if env.kind == E.DELETE_CONTAINER:
        return OpCode.DELETE_CONTAINER, env.payload.decode()
    header, body = decode_request(env.payload)
    return header.type, body


def _events(result: Result, events: tuple[WatchEvent, ...]) -> tuple[WatchEvent, ...]:
    """The body's events if it changed the tree: none for a failed multi or a replayed txn."""
    if isinstance(result, (AlreadyApplied, ErrorResult)) or (isinstance(result, MultiResult) and result.code):
        return ()
    return events
