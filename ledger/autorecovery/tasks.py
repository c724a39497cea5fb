"""AutoRecovery on a bookie node (trio edge): the auditor and the replication worker, and the
metastore records they share (seed 000, "Recovering/Repair"; docs/autorecovery.md).

Layout in the metastore:

    /quire/underreplicated/<ledger id>          a ReplicationTask (JSON): lost bookies, since, last error
    /quire/underreplicated-locks/<ledger id>/   a Lock (metastore/client/recipes.py): the worker repairing it;
                                                its contender node's data is the worker's progress (JSON)
    /quire/autorecovery/auditor/                the auditor's LeaderElection
    /quire/autorecovery/paused                  exists: workers and the auditor do nothing
    /quire/autorecovery/decommissioned/<id>     an operator drains bookie <id>: counted as lost at once,
                                                and the bookie registers read-only (no new ledgers)

Every node with the bookie role runs one AutoRecovery: a worker always, the
auditor while it leads the election. Both use their own metastore session
(a lost session ends the leadership and every lock, and they start again).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.autorecovery.planning import ReplicationTask
from metastore.wire import jute_records as J
from metastore.client import MetaClient
from metastore.errors import BadVersion, NodeExists, NoNode
from metastore.client.recipes import Lock

log = logging.getLogger("ledger.autorecovery.tasks")

TASKS = "/quire/underreplicated"
LOCKS = "/quire/underreplicated-locks"
ROOT = "/quire/autorecovery"
ELECTION = f"{ROOT}/auditor"
PAUSED = f"{ROOT}/paused"
DECOMMISSIONED = f"{ROOT}/decommissioned"


@dataclass(frozen=True, slots=True)
class AutoRecoveryConfig:
    """The [cluster] keys of AutoRecovery (docs/operations.md)."""

    grace_ms: int = 30_000  # a bookie unregistered this long is lost: its ledgers are marked
    open_ledger_grace_ms: int = 30_000  # an open ledger's last fragment is its writer's this long after marking
    audit_interval_ms: int = 300_000  # full rescans of the ledgers, and the replica check, this often
    check_reads_per_s: int = 2_000  # the replica check's read rate per auditor
    session_timeout_ms: int = 10_000  # the auditor's and workers' metastore sessions
    retry_min_ms: int = 1_000  # backoff of a failed repair: doubles from this ...
    retry_max_ms: int = 60_000  # ... up to this
    poll_ms: int = 1_000  # how often idle workers and the auditor look again without a watch firing
    copy_window: int = 64  # entries in flight per repair


def wall_ms() -> int:
    """Wall-clock milliseconds: `since_ms` and `next_attempt_ms` are compared across nodes."""
    return int(time.time() * 1000)


def task_path(ledger_id: int) -> str:
    return f"{TASKS}/{ledger_id}"


def lock_path(ledger_id: int) -> str:
    return f"{LOCKS}/{ledger_id}"


async def paused(meta: MetaClient) -> bool:
    return await meta.exists(PAUSED) is not None


async def set_paused(meta: MetaClient, pause: bool, acl: Sequence[J.ACL] | None = None) -> None:
    """Create (with `acl`; None: open) or delete the pause flag (idempotent)."""
    if pause:
        await meta.ensure_path(PAUSED, acl=acl)
        return
    try:
        await meta.delete(PAUSED)
    except NoNode:
        pass


async def decommissioned(meta: MetaClient) -> frozenset[int]:
    try:
        return frozenset(int(n) for n in await meta.children(DECOMMISSIONED) if n.isdigit())
    except NoNode:
        return frozenset()


async def read_task(meta: MetaClient, ledger_id: int) -> tuple[ReplicationTask, int] | None:
    """The task and its znode version; None if there is none (or it cannot be parsed: it is then
    replaced by the next mark)."""
    try:
        data, stat = await meta.get(task_path(ledger_id))
    except NoNode:
        return None
    try:
        return ReplicationTask.from_json(data), stat.version
    except ValueError as e:
        log.warning("event=bad_replication_task ledger=%s error=%s", ledger_id, e)
        return ReplicationTask(ledger_id, frozenset(), 0), stat.version


async def list_tasks(meta: MetaClient) -> list[int]:
    try:
        return sorted(int(n) for n in await meta.children(TASKS) if n.isdigit())
    except NoNode:
        return []


async def mark_under_replicated(meta: MetaClient, ledger_id: int, lost: Iterable[int],
                                damaged: Iterable[int] = (), acl: Sequence[J.ACL] | None = None) -> bool:
    """Create or widen the ledger's task so it covers `lost` and `damaged`; True if it changed.
    A CAS on the task's version: a worker finishing meanwhile deletes only the version it read."""
    lost, damaged = frozenset(lost), frozenset(damaged)
    while True:
        found = await read_task(meta, ledger_id)
        if found is None:
            task = ReplicationTask(ledger_id, lost, wall_ms(), damaged)
            await meta.ensure_path(TASKS)
            try:
                await meta.create(task_path(ledger_id), task.to_json(), acl=acl)
            except NodeExists:
                continue
            log.info("event=ledger_underreplicated ledger=%s lost=%s damaged=%s", ledger_id, sorted(lost),
                     sorted(damaged))
            return True
        task, version = found
        if task.covers(lost, damaged) and task.ledger_id == ledger_id:
            return False
        try:
            await meta.set(task_path(ledger_id), task.merged(lost, damaged).to_json(), version=version)
            return True
        except (BadVersion, NoNode):
            continue


async def worker_progress(meta: MetaClient, ledger_id: int) -> list[dict[str, Any]]:
    """The progress records of the workers holding or waiting for the ledger's lock, holder first."""
    out = []
    try:
        for data in await Lock(meta, lock_path(ledger_id)).contenders():
            try:
                out.append(json.loads(data))
            except ValueError:
                out.append({"worker": data.decode(errors="replace")})
    except NoNode:
        pass
    return out
