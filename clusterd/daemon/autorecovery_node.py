"""The AutoRecovery of one bookie node (trio edge): its replication worker, and its auditor
contender (ledger/autorecovery/tasks.py describes both and their metastore records)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from ledger.autorecovery.auditor import Auditor
from ledger.autorecovery.tasks import AutoRecoveryConfig
from ledger.autorecovery.worker import ReplicationWorker


class AutoRecovery:
    """`await nursery.start(autorecovery.run)`; `statistics()` for the node's /status."""

    def __init__(self, hosts: list[tuple[str, int]], bookie_id: int, config: AutoRecoveryConfig, *,
                 auth: Sequence[tuple[str, str]] = ()) -> None:
        self.auditor = Auditor(hosts, bookie_id, config, auth=auth)
        self.worker = ReplicationWorker(hosts, bookie_id, config, auth=auth)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.auditor.run)
            nursery.start_soon(self.worker.run)
            task_status.started()

    def statistics(self) -> dict[str, Any]:
        return {"auditor": self.auditor.statistics(), "worker": self.worker.statistics()}
