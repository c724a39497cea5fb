"""Shared by the bookie service, client and registration tests: a real BookieStorage in a
temporary directory, and a way to run async tests under trio (the suite has no pytest-trio)."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from bookie import entrylog
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


@asynccontextmanager
async def checkpoint_held_after_its_cut(storage: BookieStorage, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Run storage.checkpoint() and hold it at its entry log fsync, after its cut: the body runs while
    the checkpoint has not written its image yet; the checkpoint finishes once the body is done."""
    entered, release = threading.Event(), threading.Event()
    real_fsync = entrylog._fsync_path

    def held_fsync(path):
        entered.set()
        release.wait(10)
        real_fsync(path)

    monkeypatch.setattr(entrylog, "_fsync_path", held_fsync)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(storage.checkpoint)
            assert await trio.to_thread.run_sync(entered.wait, 10), "the checkpoint should fsync an entry log"
            yield
            release.set()
    finally:
        release.set()
