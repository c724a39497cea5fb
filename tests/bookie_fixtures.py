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
from bookie.entry import Digester, DigestType, master_key
from bookie.storage import AddRequest, BookieStorage
from bookie.storage_config import BookieStorageConfig


KEY = master_key(b"secret")
DIGESTER = Digester(DigestType.CRC32C, b"secret")
SMALL = BookieStorageConfig(journal_segment_bytes=8192, entry_log_bytes=16384, checkpoint_every_bytes=1 << 20)


def trio_test(fn):
    """Run an async test function with trio.run under a fail_after guard; pytest fixtures pass through."""
    async def guarded(*args, **kwargs):
        with trio.fail_after(60):
            return await fn(*args, **kwargs)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return trio.run(functools.partial(guarded, *args, **kwargs))
    return wrapper


def packaged(ledger_id: int, entry_id: int, payload: bytes = b"", lac: int | None = None) -> bytes:
    """An entry as the storage tests add it (LAC entry - 1 unless given)."""
    payload = payload or f"ledger {ledger_id} entry {entry_id}".encode()
    return DIGESTER.package(ledger_id, entry_id, entry_id - 1 if lac is None else lac, 0, payload)


def add_req(ledger_id: int, entry_id: int, payload: bytes = b"", *, key: bytes = KEY, recovery: bool = False,
            lac: int | None = None) -> AddRequest:
    return AddRequest(ledger_id, entry_id, key, packaged(ledger_id, entry_id, payload, lac), recovery)


async def open_small_storage(path: Path, config: BookieStorageConfig = SMALL, **kwargs) -> BookieStorage:
    """A BookieStorage at `path` with small segments and logs (the caller closes it)."""
    return await BookieStorage.open(path, 1, config, **kwargs)


async def add_all(storage: BookieStorage, reqs: list[AddRequest]) -> None:
    async with trio.open_nursery() as nursery:
        for req in reqs:
            nursery.start_soon(storage.add, req)


def entry(ledger: int, entry_id: int, lac: int | None = None, payload: bytes | None = None) -> bytes:
    """An entry as the service and client tests send it (LAC entry - 1 unless given)."""
    lac = entry_id - 1 if lac is None else lac
    payload = payload if payload is not None else f"entry {entry_id}".encode()
    return DIGESTER.package(ledger, entry_id, lac, 100 * (entry_id + 1), payload)


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
    real_fsync = entrylog.fsync_file

    def held_fsync(path):
        entered.set()
        release.wait(10)
        real_fsync(path)

    monkeypatch.setattr(entrylog, "fsync_file", held_fsync)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(storage.checkpoint)
            assert await trio.to_thread.run_sync(entered.wait, 10), "the checkpoint should fsync an entry log"
            yield
            release.set()
    finally:
        release.set()
