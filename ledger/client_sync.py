"""A blocking facade over LedgerClient, for the CLI and synchronous programs (like metastore/client/sync.py).

One background thread runs a trio loop holding a MetaClient, a BookiePool and a
LedgerClient; each method hands its call to that loop and blocks until it is
done. Handles wrap the async ones; their semantics are unchanged (docs/ledger.md).

    with SyncLedgerClient([("127.0.0.1", 21811)]) as ledgers:
        w = ledgers.create(3, 3, 2, password=b"pw")
        w.append_many([b"a", b"b"])
        w.close()
        r = ledgers.open(w.ledger_id, b"pw")
        for entry in r.tail(0):        # ends after the last entry of a closed ledger
            print(entry.entry_id, entry.payload)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from functools import partial
from typing import Any


from bookie.client import BookiePool
from bookie.entry import DigestType, Entry
from ledger.client import LedgerClient
from ledger.handles import ReadHandle, WriteHandle
from ledger.manager import LedgerManager
from ledger.metadata import LedgerMetadata
from metastore.client import MetaClient
from edge.trio_thread import BlockingFacade


class SyncLedgerClient(BlockingFacade[LedgerClient]):
    """`with SyncLedgerClient(meta_hosts, bookie_addresses=None, auth=(), **LedgerClient options) as c:`.

    Bookie addresses come from the metastore's registrations; `bookie_addresses`
    ({id: (host, port)}) adds known ones. `meta_factory` replaces the MetaClient
    (a callable returning an async context manager that yields a metastore client). close() stops
    the loop: handles become unusable."""

    def __init__(self, meta_hosts: Sequence[tuple[str, int]], bookie_addresses: dict[int, tuple[str, int]] | None = None,
                 *, manager: LedgerManager | None = None,
                 meta_factory: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
                 meta_tls: Any = None, bookie_tls: Any = None, auth: Sequence[tuple[str, bytes | str]] = (),
                 **options: Any) -> None:
        # meta_tls, bookie_tls: TLS for the client and bookie ports (clusterd.daemon.tls_streams.ClientTls); None: plain TCP.
        # auth: the application's metastore credentials, e.g. (("digest", "app:secret"),); with them (or a
        # client certificate in meta_tls) the ledgers it creates are its own (ledger/manager.py).
        super().__init__("SyncLedgerClient")
        self._meta_factory = meta_factory or partial(MetaClient, list(meta_hosts), tls=meta_tls, auth=auth)
        self._bookie_tls = bookie_tls
        self._addresses = dict(bookie_addresses or {})
        self._manager = manager
        self._options = options

    async def _open(self, stack: AsyncExitStack) -> LedgerClient:
        meta = await stack.enter_async_context(self._meta_factory())
        pool = await stack.enter_async_context(BookiePool(self._addresses, tls=self._bookie_tls))
        return await stack.enter_async_context(LedgerClient(meta, pool, self._manager, **self._options))

    # -- ledgers (see LedgerClient) -----------------------------------------------------------
    def create(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
               digest_type: DigestType = DigestType.CRC32C, password: bytes = b"",
               custom: dict[str, bytes] | None = None) -> SyncWriteHandle:
        handle = self.run(self.client.create, ensemble_size, write_quorum, ack_quorum, digest_type, password, custom)
        return SyncWriteHandle(self, handle)

    def open(self, ledger_id: int, password: bytes, recover: bool = False) -> SyncReadHandle:
        return SyncReadHandle(self, self.run(self.client.open, ledger_id, password, recover))

    def recover(self, ledger_id: int, password: bytes) -> LedgerMetadata:
        return self.run(self.client.recover, ledger_id, password)

    def delete(self, ledger_id: int) -> None:
        self.run(self.client.delete, ledger_id)

    def list_ledgers(self) -> list[int]:
        return self.run(self.client.list_ledgers)


class SyncWriteHandle:
    def __init__(self, owner: SyncLedgerClient, handle: WriteHandle) -> None:
        self._owner, self.handle = owner, handle

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    @property
    def lac(self) -> int:
        return self.handle.lac

    def append(self, payload: bytes) -> int:
        return self._owner.run(self.handle.append, payload)

    def append_many(self, payloads: list[bytes]) -> list[int]:
        """Pipelined: every payload is in flight at once."""
        return self._owner.run(self.handle.append_many, payloads)

    def close(self) -> LedgerMetadata:
        return self._owner.run(self.handle.close)


class SyncReadHandle:
    def __init__(self, owner: SyncLedgerClient, handle: ReadHandle) -> None:
        self._owner, self.handle = owner, handle

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    @property
    def last_entry(self) -> int | None:
        return self.handle.last_entry

    @property
    def lac(self) -> int:
        return self.handle.lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self.handle.metadata

    def read(self, first: int, last: int) -> list[Entry]:
        return self._owner.run(self.handle.read, first, last)

    def read_lac(self) -> int:
        return self._owner.run(self.handle.read_lac)

    def tail(self, from_entry: int = 0) -> Iterator[Entry]:
        """Entries from `from_entry` on as they are confirmed; ends after a closed ledger's last entry."""
        next_entry = from_entry
        while True:
            batch = self._owner.run(self.handle.wait_entries, next_entry)
            yield from batch
            next_entry += len(batch)
            h = self.handle
            if not batch and h.is_closed and next_entry > h.metadata.last_entry:
                return
