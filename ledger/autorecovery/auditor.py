"""The auditor (trio edge): exactly one in the cluster, elected through the metastore.

Seed 000: "Auditor: elected through ZooKeeper, only one node can be the
auditor; it watches the bookies registered in ZooKeeper, and when one fails it
scans every ledger for those stored on it and puts a repair task for each under
/underreplicated." Here, while leading (metastore/client/recipes.py LeaderElection):

1. watch /quire/bookies/available (a children watch) and readonly/; a known
   bookie (one with a cookie znode) that is registered in neither is missing;
   missing for `grace_ms` it is lost (ledger/autorecovery/planning.py LossTracker): a
   bookie back within the grace period causes no copying; one back after it is lost no
   more, never added to a task again (only unregistered bookies are lost, decommissioned
   ones aside), and the worker taking a task that lists it drops it (ReplicationTask.rejudged);
2. when the lost set (plus decommissioned bookies, lost at once) grows, and
   every `audit_interval_ms`, scan every ledger's metadata and mark those with a
   fragment on a lost bookie (ledger/autorecovery/tasks.py mark_under_replicated);
3. every `audit_interval_ms`, the replica check: read each CLOSED ledger's
   entries from every bookie of their write quorums (at most `check_reads_per_s`)
   and mark the bookies that miss a copy or hold a corrupt one as `damaged`: a
   replica lost after the writer's ack quorum is otherwise never noticed.

A new auditor starts with no memory: every bookie missing when it starts gets
a fresh grace period. Nothing it does is unsafe to repeat.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio

from bookie.client import BookiePool
from bookie.entry import crc32c_digest_ok
from bookie.errors import BookieError, EntryCorrupt, NoSuchEntry, NoSuchLedger
from bookie.registration import AVAILABLE, COOKIES, DAEMON_ACL, READONLY, list_bookies
from ledger.autorecovery.tasks import (ELECTION, AutoRecoveryConfig, decommissioned, list_tasks, mark_under_replicated,
                                   paused)
from ledger.service_loop import ServiceLoop
from ledger.errors import NoSuchLedger as NoSuchLedgerMetadata
from ledger.manager import LedgerManager
from ledger.metadata import LedgerMetadata, LedgerMetadataError
from ledger.autorecovery.planning import LossTracker, ledgers_to_mark, replica_checks
from metastore.client import MetaClient
from metastore.client.watches import Watch
from metastore.errors import NoAuth, NoNode
from metastore.client.recipes import LeaderElection, LeadershipLost

log = logging.getLogger("ledger.autorecovery.auditor")

RETRY_S = 1.0


def monotonic_ms() -> int:
    return int(trio.current_time() * 1000)


class Auditor:
    """Contends for the auditor role and audits while leading: `await nursery.start(auditor.run)`."""

    def __init__(self, hosts: list[tuple[str, int]], node_id: int, config: AutoRecoveryConfig, *,
                 auth: Sequence[tuple[str, str]] = ()) -> None:
        self.hosts = hosts
        self.auth = tuple(auth)  # the daemons' identity: what it creates is theirs (DAEMON_ACL)
        self.acl = DAEMON_ACL if auth else None
        self.loop = ServiceLoop("auditor", log, min_s=RETRY_S)
        self.node_id = node_id
        self.config = config
        self.leading = False
        self.lost: frozenset[int] = frozenset()
        self._wait: trio.CancelScope | None = None  # the auditor's wait, which trigger() cuts short
        self.forced = False  # an audit asked for (BookKeeper's PUT /api/v1/autorecovery/trigger_audit)
        self.stats: Counter[str] = Counter()

    def trigger(self) -> bool:
        """Scan every ledger now (while this node is the auditor); False if it is not."""
        if not self.leading:
            return False
        self.forced = True
        if self._wait is not None:
            self._wait.cancel()
        return True

    def statistics(self) -> dict[str, Any]:
        return {"leading": self.leading, "lost_bookies": sorted(self.lost), **self.stats,
                **self.loop.statistics()}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.loop.run(self._contend)

    async def _contend(self) -> None:
        """One session: contend, audit while leading, contend again after a lost leadership.
        Any metastore or bookie error ends the round (ServiceLoop retries it after a backoff)."""
        async with MetaClient(self.hosts, session_timeout_ms=self.config.session_timeout_ms,
                              start_timeout_s=10.0, auth=self.auth) as meta:
            election = LeaderElection(meta, ELECTION, str(self.node_id).encode(), acl=self.acl)
            while True:
                try:
                    async with election.lead():
                        await self._lead(meta)
                except LeadershipLost as e:
                    log.warning("event=auditor_leadership_lost node=%s reason=%s", self.node_id, e)
                finally:
                    self.leading = False

    async def _lead(self, meta: MetaClient) -> None:
        self.leading = True
        self.stats["elected"] += 1
        log.warning("event=auditor_elected node=%s", self.node_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._check_replicas_forever, meta)
            await self._watch_bookies(meta)

    async def _watch_bookies(self, meta: MetaClient) -> None:
        tracker = LossTracker(self.config.grace_ms)
        manager = LedgerManager(meta)
        marked: frozenset[int] = frozenset()
        next_scan = 0
        while True:
            watch = Watch()
            registered = set(await _children(meta, AVAILABLE, watch)) | set(await _children(meta, READONLY))
            known = await _children(meta, COOKIES)
            now = monotonic_ms()
            tracker.observe(known, registered, now)
            self.lost = tracker.lost(now) | await decommissioned(meta)
            marked &= self.lost  # a bookie that came back and is lost again is marked again
            if not await paused(meta) and (not self.lost <= marked or now >= next_scan or self.forced):
                self.forced = False
                await self.mark(meta, manager, self.lost)
                marked, next_scan = self.lost, now + self.config.audit_interval_ms
            deadline = tracker.next_deadline_ms()
            wait_ms = min(self.config.poll_ms, max(1, (deadline - now) if deadline is not None else 1 << 30),
                          max(1, next_scan - now))
            with trio.move_on_after(wait_ms / 1000) as self._wait:
                if not self.forced:
                    await watch.wait()
            self._wait = None

    async def mark(self, meta: MetaClient, manager: LedgerManager, lost: frozenset[int]) -> int:
        """Scan every ledger and mark those on a lost bookie; how many tasks were created or widened."""
        self.stats["scans"] += 1
        if not lost:
            return 0
        changed = 0
        for ledger_id in await manager.list_ledgers():
            metadata = await _read(manager, ledger_id)
            if metadata is None:
                continue
            for lid, bookies in ledgers_to_mark([metadata], lost).items():
                try:
                    changed += await mark_under_replicated(meta, lid, bookies, acl=self.acl)
                except NoAuth as e:  # a task whose ACL someone changed: mark the others
                    log.warning("event=auditor_task_unwritable ledger=%s error=%s", lid, e)
        if changed:
            self.stats["ledgers_marked"] += changed
            log.warning("event=auditor_marked ledgers=%s lost=%s", changed, sorted(lost))
        return changed

    # -- the replica check ------------------------------------------------------------------------
    async def _check_replicas_forever(self, meta: MetaClient) -> None:
        async with BookiePool(timeout_s=5.0) as pool:
            while True:
                await trio.sleep(self.config.audit_interval_ms / 1000)
                if not await paused(meta):
                    await self.check_replicas(meta, pool)

    async def check_replicas(self, meta: MetaClient, pool: BookiePool) -> int:
        """Read every copy of every CLOSED ledger not already under repair; mark missing or corrupt
        ones. Returns how many ledgers were marked."""
        pool.update(await list_bookies(meta))
        manager, waiting = LedgerManager(meta), set(await list_tasks(meta))
        marked = 0
        limiter = trio.CapacityLimiter(16)
        for ledger_id in await manager.list_ledgers():
            metadata = await _read(manager, ledger_id)
            if metadata is None or not metadata.is_closed or ledger_id in waiting:
                continue
            damaged: set[int] = set()
            async with trio.open_nursery() as nursery:
                for entry_id, bookie in replica_checks(metadata, self.lost):
                    await limiter.acquire_on_behalf_of((entry_id, bookie))
                    nursery.start_soon(self._check_one, pool, metadata, entry_id, bookie, damaged, limiter)
                    await trio.sleep(1 / self.config.check_reads_per_s)
            if damaged and await _read(manager, ledger_id) == metadata:  # unchanged: the misses are real
                marked += await mark_under_replicated(meta, ledger_id, (), damaged, acl=self.acl)
                log.warning("event=auditor_replicas_missing ledger=%s bookies=%s", ledger_id, sorted(damaged))
        self.stats["replica_checks"] += 1
        return marked

    async def _check_one(self, pool: BookiePool, metadata: LedgerMetadata, entry_id: int, bookie: int,
                         damaged: set[int], limiter: trio.CapacityLimiter) -> None:
        try:
            data = await pool.client(bookie).read(metadata.ledger_id, entry_id)
            if crc32c_digest_ok(data) is False:
                damaged.add(bookie)
        except (NoSuchEntry, NoSuchLedger, EntryCorrupt):
            damaged.add(bookie)
        except BookieError:
            pass  # says nothing about the replica: a lost bookie is the loss tracker's business
        finally:
            self.stats["replicas_checked"] += 1
            limiter.release_on_behalf_of((entry_id, bookie))


async def _children(meta: MetaClient, path: str, watch: Watch | None = None) -> list[int]:
    try:
        return [int(n) for n in await meta.children(path, watch=watch) if n.isdigit()]
    except NoNode:
        await meta.ensure_path(path)
        return []


async def _read(manager: LedgerManager, ledger_id: int) -> LedgerMetadata | None:
    try:
        return (await manager.read(ledger_id))[0]
    except NoSuchLedgerMetadata:
        return None
    except (LedgerMetadataError, NoAuth) as e:  # one ledger another client spoiled: audit the others
        log.warning("event=auditor_bad_metadata ledger=%s error=%s", ledger_id, e)
        return None
