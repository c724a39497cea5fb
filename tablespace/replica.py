"""A replica of one tablespace (edge): follows its log, leads it when it gets the log's ownership,
checkpoints while it leads. Seed 003's pattern, on Quire's named logs (stream/).

    follower: load the last checkpoint (if any), tail the log from its position, apply each change;
              meanwhile queue for the log's ownership (LogWriter with wait=True).
    leader:   the ownership came (the last leader's open segment was recovered: fenced and closed
              at its true end), so stop tailing, read the log to its end and apply it, and only
              then publish this replica as the leader and serve. A write is checked against the
              state all earlier changes give, appended as a record, and answered once the record
              is acknowledged, after it was applied.
    deposed:  a write fails (LogFenced: another replica took the log over): every change not yet
              acknowledged is answered OutcomeUnknown, and the replica follows again from its last
              applied change. It acknowledges nothing more: its appends fail at the fenced bookies.

The metastore layout under /tablespaces/<name>: `leader` (ephemeral: the leader's replica id and
address), `checkpoint` (JSON: ledger id, position, digest, keys). The log is `tablespace.<name>`
in the stream namespace. docs/tablespace.md has the guarantees.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from contextlib import AsyncExitStack
from functools import partial

import trio

from ledger.client import LedgerClient
from ledger.errors import LedgerError
from metastore.client import MetaClient
from metastore.errors import BadVersion, NodeExists, NoNode
from stream.errors import PositionTruncated, StreamError
from stream.log_metadata import LogSettings, check_name
from stream.namespace import Namespace
from stream.position import Position
from stream.record_set import HEAD_BYTES, RECORD_OVERHEAD
from stream.writer import LogWriter
from tablespace import change
from tablespace.errors import BadRequest, CorruptChange, NotLeader, OutcomeUnknown
from tablespace.leading import Leader, Op
from tablespace.paths import ROOT, checkpoint_password, log_name
from tablespace.state import CheckpointDecoder, TableState

log = logging.getLogger("quire.tablespace")

CHECKPOINT_EVERY = 10_000       # changes applied between a leader's checkpoints
CHECKPOINT_ENTRY_BYTES = 1 << 20


def after(position: Position) -> Position:
    """Where the records after `position` start."""
    return Position(position.segment, position.entry, position.slot + 1)


class _Write:
    __slots__ = ("effects", "position", "applied", "failed")

    def __init__(self, effects: list[change.Effect]) -> None:
        self.effects = effects
        self.position: Position | None = None
        self.applied = trio.Event()
        self.failed = False


class Replica:
    """One replica of `tablespace` (created with `create`), identified by `replica_id`, reachable
    by clients at `address` (host:port, published while it leads)."""

    def __init__(self, meta: MetaClient, ledgers: LedgerClient, tablespace: str, replica_id: str, address: str,
                 *, checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        self.meta, self.ledgers = meta, ledgers
        self.ns = Namespace(meta, ledgers)
        self.tablespace, self.replica_id, self.address = check_name(tablespace, "tablespace"), replica_id, address
        self.log = log_name(tablespace)
        self.root = f"{ROOT}/{tablespace}"  # its `leader` and `checkpoint` (tablespace/paths.py)
        self.checkpoint_every = checkpoint_every
        self.state = TableState()
        self.position: Position | None = None   # of the last change applied
        self.role = "starting"
        self.leader_address: str | None = None
        self.checkpoints = 0
        self._leader: Leader | None = None
        self._writer: LogWriter | None = None
        self._writes: deque[_Write] = deque()
        self._next_txid = 0
        self._deposed = trio.Event()
        self._since_checkpoint = 0
        self._checkpoint_due = trio.Event()
        self._settings = LogSettings()  # the log's, read when leading

    # -- setup -------------------------------------------------------------------------------
    @staticmethod
    async def create(meta: MetaClient, ledgers: LedgerClient, tablespace: str,
                     settings: LogSettings | None = None) -> None:
        """A new tablespace: its znode and its log (StreamError LogExists if it exists)."""
        check_name(tablespace, "tablespace")
        await Namespace(meta, ledgers).create(log_name(tablespace), settings)
        await meta.ensure_path(f"{ROOT}/{tablespace}")

    # -- the replica's life ----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow, lead when the ownership comes, follow again if deposed; until cancelled."""
        await self._load_checkpoint()
        task_status.started()
        while True:
            try:
                async with AsyncExitStack() as stack:
                    writer = await self._follow_until_owner(stack)
                    await self._lead(writer)
            except (StreamError, LedgerError) as e:  # a deposed writer's close fails as fenced
                log.info("event=tablespace_writer_closed tablespace=%s error=%s", self.tablespace, e)
            self.role = "follower"

    async def _follow_until_owner(self, stack: AsyncExitStack) -> LogWriter:
        self.role = "follower"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(self._read, follow=True))
            nursery.start_soon(self._watch_leader)
            writer = await stack.enter_async_context(self.ns.writer(self.log, identity=self.replica_id.encode(),
                                                                    wait=True))
            nursery.cancel_scope.cancel()
        # Owned, and the last owner's segment recovered: the log ends where it ends now.
        await self._read(follow=False)
        return writer

    async def _read(self, *, follow: bool) -> None:
        """Apply the log's changes after `position`: to its current end, or on forever."""
        while True:
            start = None if self.position is None else after(self.position)
            try:
                async for record in self.ns.reader(self.log, start, follow=follow):
                    self._apply(change.decode(record.payload), record.position)
                return
            except PositionTruncated:
                # A checkpoint moved the log's head past us: start again from it.
                log.info("event=tablespace_behind_checkpoint tablespace=%s position=%s", self.tablespace,
                         self.position)
                await self._load_checkpoint()

    def _apply(self, effects: list[change.Effect], position: Position) -> None:
        self.state.apply(effects)
        self.position = position
        self._since_checkpoint += 1
        if self._since_checkpoint >= self.checkpoint_every:
            self._checkpoint_due.set()

    async def _watch_leader(self) -> None:
        """Keep `leader_address` current while following (where NotLeader sends clients)."""
        while True:
            try:
                data, _ = await self.meta.get(f"{self.root}/leader")
                self.leader_address = json.loads(data)["address"]
            except (NoNode, ValueError, KeyError, TypeError):  # TypeError: null data or not an object
                self.leader_address = None
            await trio.sleep(0.5)

    async def _lead(self, writer: LogWriter) -> None:
        self._settings = (await self.ns.read(self.log)).log.settings  # fixed when the tablespace was created
        self._writer, self._leader = writer, Leader(self.state)
        self._next_txid = writer.last_txid + 1
        self._deposed = trio.Event()
        await self._publish()
        self.role, self.leader_address = "leader", self.address
        log.info("event=tablespace_leading tablespace=%s replica=%s position=%s", self.tablespace, self.replica_id,
                 self.position)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._checkpointer)
                nursery.start_soon(self._check_still_leading)
                await self._deposed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._writer = self._leader = None
            self.role = "deposed"

    async def _check_still_leading(self) -> None:
        """Step down without waiting for a write to fail once the leader znode is not ours (this
        replica's session expired while it was paused, and another took over): reads stop here."""
        path = f"{self.root}/leader"
        while not self._deposed.is_set():
            await trio.sleep(0.5)
            try:
                data, _ = await self.meta.get(path)
                ours = json.loads(data).get("replica") == self.replica_id
            except (NoNode, ValueError, TypeError, AttributeError):  # null data, or JSON but no object
                ours = False
            if not ours:
                self._depose(StreamError("the leader znode is no longer this replica's"))

    async def _publish(self) -> None:
        data = json.dumps({"replica": self.replica_id, "address": self.address}).encode()
        path = f"{self.root}/leader"
        for _ in range(10):
            try:
                await self.meta.create(path, data, ephemeral=True)
                return
            except NodeExists:
                try:  # the last leader's, its session not expired yet: ours holds the log now
                    await self.meta.delete(path)
                except NoNode:
                    pass
        raise StreamError(f"could not publish the leader of tablespace {self.tablespace!r}")

    # -- writes ------------------------------------------------------------------------------------
    async def transact(self, ops: list[Op]) -> tuple[list[int | None], Position | None]:
        """Run a transaction as the leader: each op's result and the change's position (None if it
        changed nothing). NotLeader, VersionMismatch, BadRequest, or OutcomeUnknown if this replica
        was deposed while the change was written."""
        leader, writer = self._leader, self._writer
        if self.role != "leader" or leader is None or writer is None:
            raise NotLeader(f"replica {self.replica_id} does not lead tablespace {self.tablespace!r}",
                            self.leader_address)
        if change.size_bound(ops) + RECORD_OVERHEAD + HEAD_BYTES > self._settings.max_entry_bytes:
            raise BadRequest(f"the transaction is larger than the log's records may be "
                             f"({self._settings.max_entry_bytes} bytes with their overhead): split it")
        effects, results = leader.prepare(ops)
        if not effects:
            return results, None
        write = _Write(effects)
        self._writes.append(write)
        txid, self._next_txid = self._next_txid, self._next_txid + 1
        # Shielded: a client that goes away must not leave its change unapplied in the queue.
        with trio.CancelScope(shield=True):
            try:
                write.position = await writer.write(txid, change.encode(effects))
            except (StreamError, LedgerError) as e:
                self._depose(e)
            self._drain()
            await write.applied.wait()
        if write.failed:
            raise OutcomeUnknown(f"replica {self.replica_id} lost tablespace {self.tablespace!r} while writing "
                                 "the change: it may or may not be applied; read the keys before retrying")
        return results, write.position

    def _drain(self) -> None:
        """Apply acknowledged changes in log order (acknowledgements come in order; the tasks
        that wait for them may resume in any)."""
        while self._writes and self._writes[0].position is not None:
            write = self._writes.popleft()
            assert self._leader is not None
            self._leader.acknowledged(write.effects)
            self.position = write.position
            self._since_checkpoint += 1
            write.applied.set()
        if self._since_checkpoint >= self.checkpoint_every:
            self._checkpoint_due.set()

    def _depose(self, error: BaseException) -> None:
        if self._deposed.is_set():
            return
        log.warning("event=tablespace_deposed tablespace=%s replica=%s error=%s", self.tablespace, self.replica_id,
                    error)
        self.role = "deposed"
        for write in self._writes:  # never applied here: the log (read as a follower) decides
            write.failed = True
            write.applied.set()
        self._writes.clear()
        self._deposed.set()

    # -- checkpoints ---------------------------------------------------------------------------------
    async def _checkpointer(self) -> None:
        while True:
            await self._checkpoint_due.wait()
            self._checkpoint_due = trio.Event()
            try:
                await self.checkpoint()
            except (StreamError, LedgerError, BadVersion) as e:
                log.warning("event=tablespace_checkpoint_failed tablespace=%s error=%s", self.tablespace, e)

    async def checkpoint(self) -> Position | None:
        """Write the applied state to a new ledger, record it with its position, delete the last
        checkpoint's ledger, and truncate the log before what it covers. The position, or None if
        nothing was applied yet."""
        position = self.position
        if position is None:
            return None
        chunks = list(self.state.encode_chunks(CHECKPOINT_ENTRY_BYTES))  # one consistent cut, at `position`
        keys = self.state.keys
        self._since_checkpoint = 0
        digest = hashlib.sha256(b"".join(chunks)).hexdigest()
        s = self._settings
        handle = await self.ledgers.create(s.ensemble, s.write_quorum, s.ack_quorum,
                                           password=checkpoint_password(self.tablespace),
                                           custom={"tablespace": self.tablespace.encode()})
        pending = [handle.start_append(chunk) for chunk in chunks]
        for p in pending:
            await p.result()
        await handle.close()
        path = f"{self.root}/checkpoint"
        record = json.dumps({"ledger_id": handle.ledger_id, "position": str(position), "digest": digest,
                             "keys": keys, "entries": len(chunks)}).encode()
        old: dict | None = None
        try:
            data, stat = await self.meta.get(path)
            try:
                old = json.loads(data)
            except (ValueError, TypeError):  # unreadable (null data, say): replaced, its ledger left to find
                old = None
            await self.meta.set(path, record, version=stat.version)
        except NoNode:
            await self.meta.create(path, record)
        if isinstance(old, dict) and isinstance(old.get("ledger_id"), int):
            await self.ns.delete_ledger(old["ledger_id"])
        listing = await self.ns.read(self.log)
        done = [s for s in listing.segments if s.completed and s.records]
        if done:
            point = min(after(position), after(done[-1].last_position))
            if point > listing.log.truncated_before:
                await self.ns.truncate(self.log, point)
        self.checkpoints += 1
        log.info("event=tablespace_checkpoint tablespace=%s position=%s keys=%d ledger=%d", self.tablespace, position,
                 keys, handle.ledger_id)
        return position

    async def _load_checkpoint(self) -> None:
        """The last checkpoint's state and position (an empty state at the log's head if none)."""
        try:
            data, _ = await self.meta.get(f"{self.root}/checkpoint")
        except NoNode:
            if self.position is None:
                return
            raise StreamError(f"tablespace {self.tablespace!r}: the log was truncated but has no checkpoint")
        try:
            record = json.loads(data)
            ledger_id, position, digest = record["ledger_id"], Position.parse(record["position"]), record["digest"]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptChange(f"tablespace {self.tablespace!r}: unreadable checkpoint record: {e}") from None
        handle = await self.ledgers.open(ledger_id, checkpoint_password(self.tablespace))
        decoder, h = CheckpointDecoder(), hashlib.sha256()
        last = handle.last_entry if handle.last_entry is not None else -1
        for first in range(0, last + 1, 16):
            for entry in await handle.read(first, min(first + 15, last)):
                h.update(entry.payload)
                decoder.feed(entry.payload)
        if h.hexdigest() != digest:
            raise CorruptChange(f"tablespace {self.tablespace!r}: checkpoint ledger {ledger_id} does not match its digest")
        self.state, self.position = decoder.finish(), position
        self._since_checkpoint = 0
        log.info("event=tablespace_checkpoint_loaded tablespace=%s position=%s keys=%d", self.tablespace, position,
                 self.state.keys)

    def status(self) -> dict:
        return {"tablespace": self.tablespace, "replica": self.replica_id, "role": self.role,
                "position": None if self.position is None else str(self.position), "keys": self.state.keys,
                "digest": self.state.digest(), "leader": self.leader_address, "checkpoints": self.checkpoints}
