"""The replication worker of one bookie node (trio edge).

Seed 000: "The replication worker watches the tasks under /underreplicated;
for a new one it tries to take its lock, and moves on to the next task if it
cannot. With the lock, it goes through the ledger's fragments ... copies the
entries of each fragment to the chosen bookie, then updates the fragment's
ensemble; once every fragment is repaired the task is deleted and the lock
released." Per task, under /quire/underreplicated-locks/<ledger id>:

0. the task's lost bookies are judged again (planning.py ReplicationTask.rejudged, as
   BookKeeper's worker checks the ledger when it takes it): one registered again
   (available or read-only, not being drained) came back with its disks and is lost
   no more: a source to copy from, not a bookie to replace. A task left with no lost
   bookie in the ledger's fragments and nothing damaged is finished (deleted below);
1. for each fragment with a lost bookie and a known end (ledger/autorecovery/planning.py
   damaged_fragments): choose a replacement (this node's bookie first), copy
   every entry the lost bookie held from a surviving replica with recovery adds
   (CRC32C digests verified; HMAC entries cannot be verified without the
   password: a copy its bookie served without EntryCorrupt, with the right ids,
   is taken), and only once every copy is durable CAS the metadata with the
   bookie replaced (re-read on conflict; a changed fragment is copied again);
2. an open ledger's last fragment with a lost bookie is its writer's: left
   alone `open_ledger_grace_ms` after the task was created (the writer usually
   replaces the bookie itself), then the ledger is fenced and closed
   (LedgerClient.recover_with_master_key) and its last fragment repaired like
   the others;
3. `damaged` bookies (replica check) get their missing entries copied back;
4. the task is deleted at the version read (an auditor that widened it
   meanwhile makes the worker go round again) and the lock released.
A repair that cannot finish (Unrepairable, unreachable bookies) is written into
the task with an exponential backoff (ReplicationTask.failed), never retried in
a tight loop.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import trio

from bookie.client import BookiePool
from bookie.entry import DigestType, EntryFormatError, crc32c_digest_ok, parse_header
from bookie.errors import BookieError, EntryCorrupt, NoSuchEntry, NoSuchLedger
from bookie.registration import DAEMON_ACL, list_bookies
from edge import metrics
from ledger.autorecovery.tasks import (TASKS, AutoRecoveryConfig, decommissioned, list_tasks, lock_path, paused, read_task,
                                   task_path, wall_ms)
from ledger.service_loop import ServiceLoop
from ledger.client import LedgerClient
from ledger.errors import LedgerError, MetadataConflict
from ledger.errors import NoSuchLedger as NoSuchLedgerMetadata
from ledger.metadata import LedgerMetadata
from ledger.autorecovery.planning import (FragmentChanged, FragmentRepair, ReplicationTask, Unrepairable, apply_repair,
                                damaged_fragments, entries_on, fragment_last_entry, open_tail_damaged, plan_fragment,
                                sources)
from metastore.client import MetaClient
from metastore.client.watches import Watch
from metastore.errors import BadVersion, ConnectionLoss, NoAuth, NoNode, NotEmpty, SessionExpired, ZooKeeperError
from metastore.client.recipes import Lock

log = logging.getLogger("clusterd.replication")

LOCK_WAIT_S = 2.0
RETRY_S = 1.0


class Paused(Exception):
    """The operator paused AutoRecovery: stop between fragments, keep the task."""


class Waiting(Exception):
    """An open ledger's last fragment is still its writer's: come back at `until_ms`."""

    def __init__(self, until_ms: int) -> None:
        super().__init__(f"waiting for the writer until {until_ms}")
        self.until_ms = until_ms


class ReplicationWorker:
    """Takes under-replicated ledgers one at a time and repairs them: `await nursery.start(worker.run)`."""

    def __init__(self, hosts: list[tuple[str, int]], bookie_id: int, config: AutoRecoveryConfig,
                 rng: random.Random | None = None, auth: Sequence[tuple[str, str]] = ()) -> None:
        self.hosts = hosts
        self.auth = tuple(auth)  # the daemons' identity: it reads ledgers' master keys, owns its locks
        self.acl = DAEMON_ACL if auth else None
        self.bookie_id = bookie_id
        self.config = config
        self.rng = rng or random.Random()
        self.loop = ServiceLoop("replication_worker", log, min_s=RETRY_S)
        self.stats: Counter[str] = Counter()
        self.current: int | None = None
        self.waiting = 0

    def statistics(self) -> dict[str, Any]:
        return {"current": self.current, "ledgers_waiting": self.waiting, **self.stats, **self.loop.statistics()}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.loop.run(self._work)

    async def _work(self) -> None:
        """One session: repair tasks until a metastore or bookie error ends the round (ServiceLoop
        retries it after a backoff; a task's lock goes with the session, its record stays)."""
        try:
            async with MetaClient(self.hosts, session_timeout_ms=self.config.session_timeout_ms,
                                  start_timeout_s=10.0, auth=self.auth) as meta, BookiePool(timeout_s=10.0) as pool, \
                    LedgerClient(meta, pool) as client:
                while True:
                    watch = Watch()
                    await self.work_once(meta, client, watch)
                    with trio.move_on_after(self.config.poll_ms / 1000):
                        await watch.wait()
        finally:
            self.current = None

    async def work_once(self, meta: MetaClient, client: LedgerClient, watch: Watch | None = None) -> int:
        """One pass over the tasks (arming `watch` on their list); how many ledgers were repaired."""
        await meta.ensure_path(TASKS)
        names = await meta.children(TASKS, watch=watch)
        self.waiting = len(names)
        repaired = 0
        ledger_ids = await list_tasks(meta)
        self.rng.shuffle(ledger_ids)  # workers on other nodes start elsewhere
        for ledger_id in ledger_ids:
            if await paused(meta):
                return repaired
            try:
                found = await read_task(meta, ledger_id)
            except NoAuth as e:  # a task whose ACL someone changed: repair the others
                log.warning("event=replication_task_unreadable ledger=%s error=%s", ledger_id, e)
                continue
            if found is None or not found[0].due(wall_ms()):
                continue
            repaired += await self._take(meta, client, ledger_id)
        return repaired

    async def _take(self, meta: MetaClient, client: LedgerClient, ledger_id: int) -> int:
        lock = Lock(meta, lock_path(ledger_id), json.dumps({"worker": self.bookie_id}).encode(), acl=self.acl)
        try:
            if await lock.contenders():
                return 0  # another worker has it: the next task
        except NoNode:
            pass
        acquired = False
        try:
            with trio.move_on_after(LOCK_WAIT_S):
                await lock.acquire()
                acquired = True
        except (NoNode, ZooKeeperError) as e:
            if isinstance(e, (ConnectionLoss, SessionExpired)):
                raise
            return 0  # the lock folder was cleaned up under us: next pass
        if not acquired:
            return 0
        try:
            self.current = ledger_id
            return await self._repair_task(meta, client, ledger_id, lock)
        finally:
            self.current = None
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await lock.release()
                try:
                    await meta.delete(lock_path(ledger_id))  # an empty folder per repaired ledger is litter
                except (NoNode, NotEmpty):
                    pass

    async def _repair_task(self, meta: MetaClient, client: LedgerClient, ledger_id: int, lock: Lock) -> int:
        found = await read_task(meta, ledger_id)
        if found is None:
            return 0  # finished by someone else
        task, version = found
        task = await self._rejudge(meta, task)
        try:
            await self.repair(meta, client, task, lock)
        except Paused:
            return 0
        except Waiting as w:
            note = "the last fragment is its writer's until the open-ledger grace period ends"
            await self._note(meta, version, replace(task, error=note, next_attempt_ms=w.until_ms))
            return 0
        except (LedgerError, BookieError) as e:
            self.stats["failures"] += 1
            log.warning("event=replication_failed ledger=%s error=%s: %s", ledger_id, type(e).__name__, e)
            await self._note(meta, version, task.failed(f"{type(e).__name__}: {e}", wall_ms(),
                                                        self.config.retry_min_ms, self.config.retry_max_ms))
            return 0
        try:
            await meta.delete(task_path(ledger_id), version=version)
        except BadVersion:
            return 0  # the auditor widened the task meanwhile: the next pass does the rest
        except NoNode:
            pass
        self.stats["ledgers_repaired"] += 1
        metrics.RECOVERY_LEDGERS_REPLICATED.inc()
        log.warning("event=ledger_rereplicated ledger=%s lost=%s damaged=%s", ledger_id, sorted(task.lost),
                    sorted(task.damaged))
        return 1

    async def _rejudge(self, meta: MetaClient, task: ReplicationTask) -> ReplicationTask:
        """The task with its lost bookies judged again (step 0): the shrunk task is what a failure
        writes back, and a finished one is deleted at the version read, as any other."""
        registered = [info.id for info in await list_bookies(meta, include_read_only=True)]
        current = task.rejudged(registered, await decommissioned(meta))
        if current.lost != task.lost:
            self.stats["lost_bookies_back"] += len(task.lost - current.lost)
            log.warning("event=replication_bookies_back ledger=%s bookies=%s still_lost=%s", task.ledger_id,
                        sorted(task.lost - current.lost), sorted(current.lost))
        return current

    async def _note(self, meta: MetaClient, version: int, task: ReplicationTask) -> None:
        """Write back a task that stays (waiting or failed), if nobody changed it since `version`."""
        try:
            await meta.set(task_path(task.ledger_id), task.to_json(), version=version)
        except (BadVersion, NoNode):
            pass  # widened (new work: tried again at once) or deleted meanwhile

    async def repair(self, meta: MetaClient, client: LedgerClient, task: ReplicationTask, lock: Lock) -> None:
        """Repair every fragment of the task's ledger; raises Waiting, Paused, Unrepairable, ..."""
        lost = task.lost
        while True:
            try:
                metadata, _ = await client.manager.read(task.ledger_id)
            except NoSuchLedgerMetadata:
                return  # deleted: nothing to repair
            if metadata.master_key is None:  # kept apart, readable by the daemons only (ledger/manager.py)
                metadata = replace(metadata, master_key=await client.manager.read_key(task.ledger_id))
            if metadata.master_key is None:
                raise Unrepairable(f"ledger {task.ledger_id} has no master key (written before Quire kept it): "
                                   "copy it by hand, or delete it")
            if await paused(meta):
                raise Paused()
            damaged = damaged_fragments(metadata, lost)
            if damaged:
                try:
                    await self._repair_fragment(meta, client, metadata, damaged[0], lost, lock)
                except FragmentChanged as e:
                    self.stats["fragments_recopied"] += 1
                    log.info("event=replication_fragment_changed ledger=%s detail=%s", task.ledger_id, e)
                continue
            if open_tail_damaged(metadata, lost):
                until = task.since_ms + self.config.open_ledger_grace_ms
                if wall_ms() < until:
                    raise Waiting(until)
                log.warning("event=replication_recovering_open_ledger ledger=%s", task.ledger_id)
                await client.recover_with_master_key(task.ledger_id, metadata.master_key)
                self.stats["ledgers_recovered"] += 1
                continue
            break
        for bookie in sorted(task.damaged - lost):
            await self._refill(client, metadata, bookie)

    async def _repair_fragment(self, meta: MetaClient, client: LedgerClient, metadata: LedgerMetadata,
                               index: int, lost: frozenset[int], lock: Lock) -> None:
        infos = await list_bookies(meta, include_read_only=True)
        client.pool.update(infos)
        writable = [i.id for i in infos if not i.read_only]
        draining = await decommissioned(meta)
        repair = plan_fragment(metadata, index, lost, writable, lost | draining, self.rng, prefer=self.bookie_id)
        await self._progress(meta, lock, metadata.ledger_id, repair)
        for old, new in repair.replacements:
            entries = list(entries_on(metadata, index, old))
            # A decommissioned bookie still serves reads: a source of last resort.
            await self._copy(client, metadata, entries, (lost - draining) | {new}, new, last_resort=draining)
        await self._commit(client, metadata.ledger_id, repair)
        self.stats["fragments_repaired"] += 1

    async def _commit(self, client: LedgerClient, ledger_id: int, repair: FragmentRepair) -> None:
        """CAS the replacement into the metadata; FragmentChanged if the fragment moved (copy again)."""
        while True:
            current, version = await client.manager.read(ledger_id)
            try:
                await client.manager.write(apply_repair(current, repair), version)
                return
            except MetadataConflict:
                continue  # a writer or recoverer wrote meanwhile: re-read and judge again

    async def _progress(self, meta: MetaClient, lock: Lock, ledger_id: int, repair: FragmentRepair) -> None:
        if lock.node is None:
            return
        doc = {"worker": self.bookie_id, "ledger_id": ledger_id, "fragment_first_entry": repair.first_entry,
               "fragment_last_entry": repair.last_entry, "replacements": {str(o): n for o, n in repair.replacements},
               "entries_copied_total": self.stats["entries_copied"]}
        try:
            await meta.set(lock.node, json.dumps(doc).encode())
        except NoNode:
            pass

    async def _copy(self, client: LedgerClient, metadata: LedgerMetadata, entries: list[int],
                    excluded: frozenset[int] | set[int], target: int, last_resort: frozenset[int] = frozenset()) -> None:
        """Copy `entries` to `target` from surviving replicas (`last_resort` ones last), `copy_window` in flight."""
        errors: list[Exception] = []
        limiter = trio.CapacityLimiter(self.config.copy_window)

        async def one(entry_id: int) -> None:
            async with limiter:
                if errors:
                    return
                candidates = sorted(sources(metadata, entry_id, excluded), key=lambda b: b in last_resort)
                try:
                    await self._copy_entry(client, metadata, entry_id, tuple(candidates), target)
                except (Unrepairable, BookieError) as e:
                    errors.append(e)

        async with trio.open_nursery() as nursery:
            for entry_id in entries:
                nursery.start_soon(one, entry_id)
        if errors:
            raise errors[0]

    async def _copy_entry(self, client: LedgerClient, metadata: LedgerMetadata, entry_id: int,
                          candidates: tuple[int, ...], target: int) -> None:
        ledger_id, absent, problems = metadata.ledger_id, 0, []
        for bookie in candidates:
            try:
                data = await client.pool.client(bookie).read(ledger_id, entry_id)
            except (NoSuchEntry, NoSuchLedger):
                absent += 1
                continue
            except BookieError as e:  # corrupt, unavailable, overloaded: another replica may do
                problems.append(f"bookie {bookie}: {type(e).__name__}")
                continue
            if not _verified(data, ledger_id, entry_id, metadata.digest_type):
                problems.append(f"bookie {bookie}: digest mismatch")
                continue
            assert metadata.master_key is not None
            await client.pool.client(target).add(ledger_id, entry_id, metadata.master_key, data, recovery=True)
            self.stats["entries_copied"] += 1
            self.stats["bytes_copied"] += len(data)
            metrics.RECOVERY_BYTES_COPIED.inc(len(data))
            return
        if candidates and absent == len(candidates):
            raise Unrepairable(f"ledger {ledger_id} entry {entry_id}: every surviving replica ({list(candidates)}) "
                               "says it has no copy: the entry is lost")
        raise Unrepairable(f"ledger {ledger_id} entry {entry_id}: no readable replica now "
                           f"({'; '.join(problems) or 'no surviving bookie in its write quorum'}); will retry")

    async def _refill(self, client: LedgerClient, metadata: LedgerMetadata, bookie: int) -> None:
        """Copy back to live `bookie` the entries it should hold but misses (or holds corrupt)."""
        client.pool.update(await list_bookies(client.meta))
        for index, fragment in enumerate(metadata.fragments):
            if bookie not in fragment.ensemble or metadata.fragment_end(index) is None:
                continue
            if fragment_last_entry(metadata, index) < fragment.first_entry:
                continue
            missing = []
            for entry_id in entries_on(metadata, index, bookie):
                try:
                    data = await client.pool.client(bookie).read(metadata.ledger_id, entry_id)
                    if _verified(data, metadata.ledger_id, entry_id, metadata.digest_type):
                        continue
                except (NoSuchEntry, NoSuchLedger, EntryCorrupt):
                    pass
                missing.append(entry_id)
            await self._copy(client, metadata, missing, {bookie}, bookie)
            self.stats["replicas_refilled"] += len(missing)


def _verified(data: bytes, ledger_id: int, entry_id: int, digest_type: DigestType) -> bool:
    """CRC32C entries are checked end to end; HMAC ones only for their ids (no password here)."""
    try:
        header = parse_header(data)
    except EntryFormatError:
        return False
    if header.ledger_id != ledger_id or header.entry_id != entry_id or header.digest_type is not digest_type:
        return False
    return crc32c_digest_ok(data) is not False
