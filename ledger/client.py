"""LedgerClient: the ledger SDK's entry point (trio edge).

    async with MetaClient(hosts) as meta, BookiePool() as pool, LedgerClient(meta, pool) as ledgers:
        w = await ledgers.create(3, 3, 2, password=b"pw")
        await w.append_many([b"a", b"b"])
        await w.close()
        r = await ledgers.open(w.ledger_id, b"pw")
        entries = await r.read(0, r.last_entry)

The ledgers belong to the identity `meta` authenticates with, when it has one
(`MetaClient(hosts, auth=(("digest", "app:secret"),))`, or a TLS client
certificate): only that identity and the cluster's daemons may then write,
recover or delete them; anyone may still open them with the password
(ledger/manager.py, docs/ledger.md "Who owns a ledger"). Without credentials a
ledger is open to every client, as before.

Bookie addresses come from the metastore's registrations (bookie.registration)
merged into the pool; placement (ledger/placement.py) spreads new ensembles
over the writable bookies. Metadata goes through LedgerManager, the only path
to the metastore for ledgers.
"""

from __future__ import annotations

import random
import secrets
import time
from contextlib import AsyncExitStack

import trio

from bookie.client import BookiePool
from bookie.entry import DigestType, Digester, master_key
from bookie.registration import list_bookies
from ledger import actions as A
from ledger.driver import OpDriver
from ledger.errors import LedgerError, WrongPassword
from ledger.handles import ReadHandle, WriteHandle
from ledger.manager import LedgerManager
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from ledger.password import SALT_BYTES, password_matches, password_record
from ledger.placement import choose_ensemble
from ledger.read_op import ReadLacOp
from ledger.recovery_op import RecoveryOp
from ledger.writer import Writer
from metastore.client import MetaClient


class LedgerClient:
    """Create, open (with or without recovery) and delete ledgers. Use as `async with`."""

    def __init__(self, meta: MetaClient, bookies: BookiePool, manager: LedgerManager | None = None, *,
                 rng: random.Random | None = None, tick_s: float = 0.02, speculative_ticks: int = 5,
                 long_poll_ms: int = 1_000, explicit_lac: bool = True) -> None:
        self.meta = meta
        self.pool = bookies
        self.manager = manager or LedgerManager(meta)
        self.rng = rng or random.Random()
        self.tick_s = tick_s
        self.speculative_ticks = speculative_ticks
        self.long_poll_ms = long_poll_ms
        self.explicit_lac = explicit_lac
        self.nursery: trio.Nursery | None = None
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> LedgerClient:
        self._stack = AsyncExitStack()
        self.nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            assert self.nursery is not None
            self.nursery.cancel_scope.cancel()  # handle pumps and metadata tasks
        finally:
            await self._stack.aclose()
            self.nursery = None

    # -- bookies ------------------------------------------------------------------------------
    async def writable_bookies(self) -> list[int]:
        """Registered writable bookies (addresses merged into the pool); the pool's own list if none
        are registered (a pool configured by hand)."""
        infos = await list_bookies(self.meta)
        if not infos:
            return self.pool.bookies
        addresses = {b: self.pool.address(b) for b in self.pool.bookies}
        addresses.update({i.id: i.address for i in infos})
        self.pool.update(addresses)
        return [i.id for i in infos if not i.read_only]

    # -- ledgers ---------------------------------------------------------------------------------
    async def create(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                     digest_type: DigestType = DigestType.CRC32C, password: bytes = b"",
                     custom: dict[str, bytes] | None = None) -> WriteHandle:
        """A new OPEN ledger on `ensemble_size` writable bookies; E >= Qw >= Qa >= 1 is enforced."""
        self._running()
        ensemble = choose_ensemble(await self.writable_bookies(), ensemble_size, self.rng)
        # Salted and slow (ledger/password.py), off the event loop: the metadata is readable by all.
        record = await trio.to_thread.run_sync(password_record, password, secrets.token_bytes(SALT_BYTES))
        draft = LedgerMetadata(0, ensemble_size, write_quorum, ack_quorum, (Fragment(0, ensemble),),
                               DigestType(digest_type), record, int(time.time() * 1000),
                               custom=dict(custom or {}), master_key=master_key(password))
        metadata, version = await self.manager.create(draft)
        writer = Writer(metadata, version, Digester(metadata.digest_type, password), explicit_lac=self.explicit_lac)
        return WriteHandle(self, writer, master_key(password), tick_s=self.tick_s)

    async def open(self, ledger_id: int, password: bytes, recover: bool = False) -> ReadHandle:
        """A reader. recover=True fences the ledger and closes it at its true last entry first (seed 001,
        "Closing a ledger as a reader"): its writer can write no more. Without recovery an open ledger
        is read up to its LAC."""
        self._running()
        metadata, version = await self.manager.read(ledger_id)
        if not await trio.to_thread.run_sync(password_matches, metadata.password_digest, password):
            raise WrongPassword(f"ledger {ledger_id}: wrong password")
        await self.writable_bookies()
        digester, key = Digester(metadata.digest_type, password), master_key(password)
        lac = metadata.last_entry if metadata.is_closed else -1
        if recover and not metadata.is_closed:
            metadata, version = await self._recover(metadata, version, digester, key)
        elif metadata.state is not LedgerState.CLOSED:
            lac = await self._run_one(ReadLacOp(metadata), ledger_id, key, default=-1)
        return ReadHandle(self, metadata, version, digester, key, lac=lac, tick_s=self.tick_s,
                          speculative_ticks=self.speculative_ticks, long_poll_ms=self.long_poll_ms)

    async def recover(self, ledger_id: int, password: bytes) -> LedgerMetadata:
        """Fence and close the ledger (if it is not closed yet); its closed metadata."""
        return (await self.open(ledger_id, password, recover=True)).metadata

    async def recover_with_master_key(self, ledger_id: int, key: bytes) -> LedgerMetadata:
        """Fence and close a CRC32C ledger without its password, with the master key its metadata keeps
        (AutoRecovery, seed 000). CRC32C digests need no password to verify; HMAC ones do, so those
        ledgers are refused (LedgerError): recover them with `open(recover=True)` and the password."""
        self._running()
        metadata, version = await self.manager.read(ledger_id)
        if metadata.is_closed:
            return metadata
        if metadata.digest_type is not DigestType.CRC32C:
            raise LedgerError(f"ledger {ledger_id}: {metadata.digest_type.name} entries cannot be verified "
                              "without the password; recover it with the password (clusterctl ledger recover)")
        await self.writable_bookies()
        closed, _ = await self._recover(metadata, version, Digester(DigestType.CRC32C, b""), key)
        return closed

    async def _recover(self, metadata: LedgerMetadata, version: int, digester: Digester,
                       key: bytes) -> tuple[LedgerMetadata, int]:
        op = RecoveryOp(metadata, version, digester)
        closed = await self._run_one(op, metadata.ledger_id, key)
        return closed, op.version

    async def _run_one(self, op: object, ledger_id: int, key: bytes, default: object = None) -> object:
        driver = OpDriver(self, ledger_id, key, tick_s=self.tick_s)
        outcome: list[tuple[object, LedgerError | None]] = []

        def handler(action: A.Action) -> None:
            if isinstance(action, A.Completed):
                outcome.append((action.result, None))
            elif isinstance(action, A.Failed):
                outcome.append((None, action.error))

        op_id = driver.add(op, handler)
        await driver.pump(lambda: bool(outcome))
        driver.remove(op_id)
        result, error = outcome[0]
        if error is not None:
            if default is not None:
                return default
            raise error
        return result

    async def delete(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies reclaim its entries by garbage collection. An owned
        ledger only by its owner (or the daemons): NoAuth for anyone else."""
        await self.manager.delete(ledger_id)

    async def list_ledgers(self) -> list[int]:
        return await self.manager.list_ledgers()

    def _running(self) -> None:
        if self.nursery is None:
            raise RuntimeError("use LedgerClient inside `async with LedgerClient(meta, pool) as client:`")
