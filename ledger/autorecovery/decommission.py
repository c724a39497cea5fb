"""Decommissioning a bookie (seed 000's "decommission"): flag it, so that it registers read-only
and takes no new ledgers, and mark every ledger with a fragment on it under-replicated, as if it
were lost, so that the workers copy its entries elsewhere while it still serves reads. What
`clusterctl bookie decommission` and BookKeeper's PUT /api/v1/autorecovery/decommission do."""

from __future__ import annotations

from collections.abc import Sequence

from ledger.autorecovery.tasks import DECOMMISSIONED, mark_under_replicated
from ledger.errors import NoSuchLedger
from ledger.manager import LedgerManager
from metastore.client import MetaClient
from metastore.errors import NoNode
from metastore.wire import jute_records as J


async def decommission(meta: MetaClient, bookie_id: int, acl: Sequence[J.ACL] | None = None) -> int:
    """Flag the bookie as decommissioned and mark its ledgers (flag and tasks created with `acl`);
    how many ledgers reference it."""
    await meta.ensure_path(f"{DECOMMISSIONED}/{bookie_id}", acl=acl)
    return len(await mark_ledgers_on(meta, bookie_id, acl))


async def mark_ledgers_on(meta: MetaClient, bookie_id: int, acl: Sequence[J.ACL] | None = None) -> list[int]:
    """Mark (again: idempotent) every ledger with a fragment on the bookie; their ids."""
    manager, found = LedgerManager(meta), []
    for ledger_id in await manager.list_ledgers():
        try:
            metadata, _ = await manager.read(ledger_id)
        except NoSuchLedger:
            continue
        if bookie_id in metadata.bookies:
            found.append(ledger_id)
            await mark_under_replicated(meta, ledger_id, {bookie_id}, acl=acl)
    return found


async def recommission(meta: MetaClient, bookie_id: int) -> None:
    """Undo a decommission: the bookie takes new ledgers again."""
    try:
        await meta.delete(f"{DECOMMISSIONED}/{bookie_id}")
    except NoNode:
        pass
