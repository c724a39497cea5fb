"""A bookie's garbage collector (trio edge): deleted ledgers' entries go, disk space comes back.

Every `interval_ms` the collector lists the ledgers in the metastore (after a
sync, so the listing is at least as new as the sync), feeds the listing to the
pure GcPolicy (bookie/gc.py), asks the metastore directly about each local
ledger the policy calls a candidate, deletes what the policy then allows, and
compacts entry logs whose live fraction dropped below the threshold.
"Absence from one metadata scan is never enough to destroy bytes" (FAULTS.md):
a ledger goes only after two listings at least `interval_ms` apart missed it
and a linearizable exists-check confirmed it is gone.

It lives in clusterd because it joins the bookie (bookie/) to the ledger
layout (ledger/manager.py); neither package imports the other for this.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import trio

from bookie.gc import ExistsCheck, GcPolicy, MetadataScan
from bookie.storage import BookieStorage
from edge import metrics
from ledger.service_loop import ServiceLoop
from ledger.manager import LedgerManager
from metastore.client import MetaClient

log = logging.getLogger("clusterd.bookie.gc")


class BookieGarbageCollector:
    """Runs until cancelled: `await nursery.start(collector.run)`."""

    def __init__(self, hosts: list[tuple[str, int]], storage: BookieStorage, interval_ms: int, *,
                 auth: Sequence[tuple[str, str]] = ()) -> None:
        self.hosts = hosts
        self.auth = tuple(auth)
        self.storage = storage
        self.interval_ms = interval_ms
        self.policy = GcPolicy(min_interval_ms=interval_ms)
        # A metastore outage only postpones collection: nothing is deleted without a confirmed absence.
        self.loop = ServiceLoop("bookie_gc", log, min_s=min(1.0, interval_ms / 1000))
        self.stats: dict[str, Any] = {"scans": 0, "ledgers_deleted": 0, "compactions": 0, "bytes_freed": 0}
        self._wait: trio.CancelScope | None = None  # the wait between rounds, which trigger() cuts short
        self.forced = False  # a round asked for (BookKeeper's PUT /api/v1/bookie/gc) and not yet run

    def trigger(self) -> None:
        """Run a round now rather than at the end of the interval (BookKeeper's forced GC)."""
        self.forced = True
        if self._wait is not None:
            self._wait.cancel()

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "errors": self.loop.failures, "last_error": self.loop.last_error}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.loop.run(self._collect)

    async def _collect(self) -> None:
        """One session: collect every `interval_ms` until a metastore error ends the round."""
        async with MetaClient(self.hosts, start_timeout_s=10.0, auth=self.auth) as meta:
            manager = LedgerManager(meta)
            while True:
                with trio.move_on_after(self.interval_ms / 1000) as self._wait:
                    if not self.forced:
                        await trio.sleep_forever()
                self._wait = None
                self.forced = False
                await self.collect_once(meta, manager)

    async def collect_once(self, meta: MetaClient, manager: LedgerManager) -> set[int]:
        """One round: scan, check, delete, compact. Returns the ledgers deleted."""
        await meta.sync(manager.root.rsplit("/", 1)[0] or "/")
        live = frozenset(await manager.list_ledgers())
        self.policy.observe_scan(MetadataScan(meta.last_zxid, int(trio.current_time() * 1000), live))
        self.stats["scans"] += 1
        metrics.BOOKIE_GC_RUNS.inc()
        checks = {}
        for ledger_id in sorted(self.policy.candidates(self.storage.ledgers())):
            exists = await manager.exists(ledger_id)
            checks[ledger_id] = ExistsCheck(ledger_id, exists, meta.last_zxid)
        doomed = self.policy.eligible(self.storage.ledgers(), checks)
        if doomed:
            await self.storage.delete_ledgers(sorted(doomed))
            self.stats["ledgers_deleted"] += len(doomed)
            metrics.BOOKIE_GC_LEDGERS.inc(len(doomed))
            log.info("event=bookie_gc_deleted ledgers=%s", sorted(doomed))
        compacted = await self.storage.compact()
        if compacted.logs_compacted:
            self.stats["compactions"] += 1
            self.stats["bytes_freed"] += compacted.bytes_freed
            metrics.BOOKIE_COMPACTIONS.inc()
            metrics.BOOKIE_COMPACTION_FREED_BYTES.inc(compacted.bytes_freed)
        return doomed
