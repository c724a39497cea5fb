"""Shared by the bookie service and client tests: a real BookieStorage in a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import functools

import trio

from bookie.entry import NO_ENTRY, parse_header
from bookie.errors import LedgerFenced, NoSuchEntry, NoSuchLedger, Unauthorized


def trio_test(fn):
    """Run an async test in trio (the suite has no pytest-trio); fixtures pass through."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return trio.run(functools.partial(fn, *args, **kwargs))
    return wrapper


class _FakeStorage:  # TEMPORARY until bookie/storage.py lands
    def __init__(self) -> None:
        self.ledgers: dict[int, dict] = {}
        self.changed = trio.Event()

    def _ledger(self, ledger_id, key=None):
        led = self.ledgers.get(ledger_id)
        if led is None:
            if key is None:
                raise NoSuchLedger(f"ledger {ledger_id}")
            led = self.ledgers[ledger_id] = {"key": key, "entries": {}, "lac": NO_ENTRY, "fenced": False}
        if key is not None and key != led["key"]:
            raise Unauthorized("wrong key")
        return led

    async def add_batch(self, reqs):
        out = []
        for r in reqs:
            try:
                led = self._ledger(r.ledger_id, r.master_key)
                if led["fenced"] and not r.recovery:
                    raise LedgerFenced("fenced")
                led["entries"][r.entry_id] = r.data
                led["lac"] = max(led["lac"], parse_header(r.data).lac)
                out.append(None)
            except (Unauthorized, LedgerFenced) as e:
                out.append(e)
        self.changed.set()
        self.changed = trio.Event()
        await trio.sleep(0)
        return out

    async def fence(self, ledger_id, key):
        led = self._ledger(ledger_id, key)
        led["fenced"] = True
        await trio.sleep(0)
        return led["lac"]

    async def write_lac(self, ledger_id, lac, key):
        led = self._ledger(ledger_id, key)
        led["lac"] = max(led["lac"], lac)
        self.changed.set()
        self.changed = trio.Event()

    def read(self, ledger_id, entry_id):
        led = self._ledger(ledger_id)
        try:
            return led["entries"][entry_id]
        except KeyError:
            raise NoSuchEntry(f"entry {entry_id}") from None

    def lac(self, ledger_id):
        return self._ledger(ledger_id)["lac"]

    async def wait_lac(self, ledger_id, beyond):
        while ledger_id not in self.ledgers or self.ledgers[ledger_id]["lac"] <= beyond:
            await self.changed.wait()
        return self.ledgers[ledger_id]["lac"]

    def statistics(self):
        return {"ledgers": len(self.ledgers)}


@asynccontextmanager
async def open_storage(directory: Path) -> AsyncIterator[_FakeStorage]:
    yield _FakeStorage()
