"""Shared by the bookie service, client and registration tests: a real BookieStorage in a
temporary directory, and a way to run async tests under trio (the suite has no pytest-trio)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from bookie.service import BookieService, BookieServiceConfig
from bookie.storage import BookieStorage
from bookie.storage_config import BookieStorageConfig


def trio_test(fn):
    """Run an async test function with trio.run; pytest fixtures pass through."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return trio.run(functools.partial(fn, *args, **kwargs))
    return wrapper


@asynccontextmanager
async def open_storage(directory: Path, bookie_id: int = 1, **config) -> AsyncIterator[BookieStorage]:
    """A BookieStorage at directory/bookie, closed afterwards."""
    storage = await BookieStorage.open(Path(directory) / "bookie", bookie_id, BookieStorageConfig(**config))
    try:
        yield storage
    finally:
        with trio.CancelScope(shield=True):
            await storage.close()


@asynccontextmanager
async def serving_bookie(directory: Path, config: BookieServiceConfig | None = None) -> AsyncIterator[BookieService]:
    """A BookieService on an ephemeral loopback port over open_storage(directory); its storage is
    `.storage`. Stopped afterwards."""
    async with open_storage(directory) as storage, trio.open_nursery() as nursery:
        service = BookieService(storage, "127.0.0.1", 0, config)
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()
