"""`clusterctl recovery status | pause | resume` and `clusterctl bookie decommission | recommission ID`.

    recovery status [--json]   the auditor, the pause flag, decommissioned bookies, and every
                               under-replicated ledger: lost/damaged bookies, since when, who works
                               on it and how far it got, the last error and the next attempt
    recovery pause | resume    the flag workers and the auditor honour (ledger/autorecovery/tasks.py)
    bookie decommission ID     drain a live bookie: it turns read-only (no new ledgers), its ledgers are
                               marked under-replicated as if it were lost (it still serves reads while
                               they are copied), and the command waits until no ledger references it
                               (--no-wait returns at once; --timeout bounds the wait, exit 1 past it)
    bookie recommission ID     undo a decommission (the bookie takes new ledgers again)

Exit status: 0 done (decommission: safe to remove), 1 failed or timed out, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from bookie.registration import DAEMON_ACL
from clusterd.daemon import identity as daemon_identity
from clusterd.ctl import zk as zkctl
from ledger.autorecovery.decommission import decommission, mark_ledgers_on, recommission
from ledger.autorecovery.tasks import (ELECTION, TASKS, decommissioned, list_tasks, paused, read_task, set_paused,
                                   worker_progress)
from clusterd.config import ClusterConfig
from metastore.wire import jute_records as J
from metastore.client import MetaClient
from metastore.errors import NoNode
from metastore.client.recipes import LeaderElection

EXIT_FAILED = 1
POLL_S = 0.5


def add_commands(command: Any) -> None:
    """Register `recovery ACTION` with clusterctl's parser (`command` is ctl's factory)."""
    p = command("recovery", zkctl._zk(cmd_recovery), "AutoRecovery: status, pause, resume (docs/autorecovery.md)")
    p.add_argument("action", choices=("status", "pause", "resume"))
    p.add_argument("--json", action="store_true", help="status: print JSON")


def cmd_recovery(config: ClusterConfig, args: argparse.Namespace) -> int:
    with zkctl._client(config) as c:
        if args.action == "status":
            report = c.run(lambda: status(c.client))
            print(json.dumps(report, indent=2) if args.json else format_status(report))
            return 0
        c.run(lambda: set_paused(c.client, args.action == "pause", operator_acl(config)))
        print("AutoRecovery paused" if args.action == "pause" else "AutoRecovery resumed")
        return 0


async def status(meta: MetaClient) -> dict[str, Any]:
    """Everything `recovery status` shows, as JSON-able data."""
    try:
        leader = await LeaderElection(meta, ELECTION).leader()
    except NoNode:
        leader = None
    tasks = []
    for ledger_id in await list_tasks(meta):
        found = await read_task(meta, ledger_id)
        if found is None:
            continue
        task = json.loads(found[0].to_json())
        tasks.append(task | {"workers": await worker_progress(meta, ledger_id)})
    return {"auditor": int(leader) if leader and leader.isdigit() else None, "paused": await paused(meta),
            "decommissioned": sorted(await decommissioned(meta)), "underreplicated": tasks}


def format_status(report: dict[str, Any]) -> str:
    lines = [f"auditor: node {report['auditor']}" if report["auditor"] is not None else "auditor: none elected",
             f"paused: {'yes' if report['paused'] else 'no'}",
             f"decommissioned bookies: {report['decommissioned'] or 'none'}",
             f"under-replicated ledgers: {len(report['underreplicated'])}"]
    for t in report["underreplicated"]:
        who = ", ".join(f"bookie {w.get('worker')}" + (f" at fragment from entry {w['fragment_first_entry']}"
                                                       if "fragment_first_entry" in w else "")
                        for w in t["workers"]) or "nobody yet"
        error = f"; last error: {t['error']} (attempt {t['attempts']})" if t.get("error") else ""
        lines.append(f"  ledger {t['ledger_id']}: lost {t['lost']} damaged {t['damaged']}, worked on by {who}{error}")
    return "\n".join(lines)


def operator_acl(config: ClusterConfig) -> Sequence[J.ACL] | None:
    """The ACL of what clusterctl creates under /quire (flag, tasks): the daemons' (only they change
    it, the auditor and workers included) when clusterctl authenticates as them, else open."""
    return DAEMON_ACL if daemon_identity.operator_auth(config.path) else None


# -- decommission -----------------------------------------------------------------------------------

def cmd_decommission(config: ClusterConfig, args: argparse.Namespace, bookie_id: int) -> int:
    """`bookie decommission ID`: drain, then wait until no ledger references the bookie."""
    with zkctl._client(config) as c:
        acl = operator_acl(config)
        count = c.run(lambda: decommission(c.client, bookie_id, acl))
        print(f"bookie {bookie_id}: decommissioned; {count} ledger(s) reference it")
        if args.no_wait:
            return 0
        deadline = time.monotonic() + args.timeout
        while count:
            if time.monotonic() > deadline:
                print(f"bookie {bookie_id}: {count} ledger(s) still reference it after {args.timeout:g} s "
                      "(see `clusterctl recovery status`)")
                return EXIT_FAILED
            time.sleep(POLL_S)
            remaining = c.run(lambda: mark_ledgers_on(c.client, bookie_id, acl))  # also marks ledgers made since
            if len(remaining) != count:
                print(f"bookie {bookie_id}: {len(remaining)} ledger(s) left")
            count = len(remaining)
        print(f"bookie {bookie_id}: no ledger references it; safe to remove")
        return 0


def cmd_recommission(config: ClusterConfig, bookie_id: int) -> int:
    with zkctl._client(config) as c:
        c.run(lambda: recommission(c.client, bookie_id))
    print(f"bookie {bookie_id}: recommissioned (takes new ledgers again)")
    return 0


__all__ = ["TASKS", "add_commands", "cmd_decommission", "cmd_recommission", "decommission", "status"]
