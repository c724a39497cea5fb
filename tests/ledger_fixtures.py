"""Ledger SDK test helpers shared by test modules: an in-memory LedgerManager (versioned CAS per
ledger), real bookie services on loopback over real storage in a temporary directory, and a
LedgerClient over both."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import replace

import trio

from bookie.client import BookiePool
from bookie.service import BookieService
from bookie_fixtures import open_storage
from ledger.client import LedgerClient
from ledger.errors import MetadataConflict, NoSuchLedger
from metastore.errors import NoNode


class NoRegistrations:
    """A metastore where no bookie registered: the pool's addresses are the bookies."""

    async def children(self, path: str) -> list[str]:
        raise NoNode(path)


class MemoryManager:
    """LedgerManager's interface over a dict: versioned CAS per ledger."""

    def __init__(self) -> None:
        self.ledgers: dict[int, tuple] = {}
        self.next_id = 1

    async def create(self, metadata):
        stored = replace(metadata, ledger_id=self.next_id)
        self.next_id += 1
        self.ledgers[stored.ledger_id] = (stored, 0)
        return stored, 0

    async def read(self, ledger_id):
        await trio.lowlevel.checkpoint()
        if ledger_id not in self.ledgers:
            raise NoSuchLedger(f"ledger {ledger_id}")
        return self.ledgers[ledger_id]

    async def write(self, metadata, expected_version):
        await trio.lowlevel.checkpoint()
        _, version = self.ledgers[metadata.ledger_id]
        if version != expected_version:
            raise MetadataConflict("bad version")
        self.ledgers[metadata.ledger_id] = (metadata, version + 1)
        return version + 1

    async def delete(self, ledger_id):
        self.ledgers.pop(ledger_id)

    async def list_ledgers(self):
        return sorted(self.ledgers)


@asynccontextmanager
async def bookies(tmp_path, count: int):
    """`count` bookie services; yields {id: (service, cancel scope)}."""
    async with trio.open_nursery() as nursery:
        services = {}
        for b in range(1, count + 1):
            scope = trio.CancelScope()
            started = trio.Event()

            async def run(b=b, scope=scope, started=started):
                with scope:  # cancelling it stops the service, then closes the storage
                    async with open_storage(tmp_path / f"b{b}", b) as storage, trio.open_nursery() as inner:
                        service = BookieService(storage, "127.0.0.1", 0)
                        await inner.start(service.run)
                        services[b] = (service, scope)
                        started.set()
                        await trio.sleep_forever()

            nursery.start_soon(run)
            await started.wait()
        yield services
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def ledger_client(services, manager, **options):
    addresses = {b: ("127.0.0.1", s.port) for b, (s, _) in services.items()}
    async with BookiePool(addresses, timeout_s=2.0) as pool, \
            LedgerClient(NoRegistrations(), pool, manager, **options) as client:
        yield client
