"""`clusterctl bookie ls`: the bookies registered in the metastore (bookie/registration.py).

Exit status: 0 done, 1 the metastore was unreachable, 2 the cluster does not
speak the ZooKeeper protocol (bookies register in the metastore).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from bookie.registration import list_bookies
from clusterd.ctl import recovery as recoveryctl, zk as zkctl
from clusterd.config import ClusterConfig
from clusterd.tables import text_table

Command = Callable[[ClusterConfig, argparse.Namespace], int]


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Register `bookie ls` with clusterctl's parser (`command` is ctl's factory)."""
    bookie = command("bookie", zkctl._zk(cmd_bookie), "bookies: `bookie ls` lists the registered bookies; "
                     "`bookie decommission ID` drains one (clusterd/ctl/recovery.py), `recommission ID` undoes it")
    bookie.add_argument("action", choices=("ls", "decommission", "recommission"),
                        help="ls: every registered bookie, available and read-only")
    bookie.add_argument("id", nargs="?", type=int, help="decommission/recommission: the bookie's id")
    bookie.add_argument("--json", action="store_true", help="print JSON")
    bookie.add_argument("--no-wait", action="store_true", help="decommission: return once its ledgers are marked")
    bookie.add_argument("--timeout", type=float, default=600.0, help="decommission: seconds to wait (default 600)")
    bookie.set_defaults(check_usage=partial(_check_id, bookie))


def _check_id(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.action != "ls" and args.id is None:
        parser.error(f"bookie {args.action} needs the bookie's ID (`clusterctl bookie ls` lists them)")


def cmd_bookie(config: ClusterConfig, args: argparse.Namespace) -> int:
    if args.action != "ls":
        if args.action == "decommission":
            return recoveryctl.cmd_decommission(config, args, args.id)
        return recoveryctl.cmd_recommission(config, args.id)
    with zkctl._client(config) as c:
        bookies = c.run(lambda: list_bookies(c.client))
    configured = config.bookie_addresses()
    rows: list[dict[str, Any]] = [asdict(b) | {"state": "read-only" if b.read_only else "available"}
                                  for b in bookies]
    registered = {b.id for b in bookies}
    rows += [{"id": i, "host": h, "port": p, "read_only": None, "state": "not registered"}
             for i, (h, p) in sorted(configured.items()) if i not in registered]
    rows.sort(key=lambda r: r["id"])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(text_table(["bookie", "address", "state"], [[r["id"], f"{r['host']}:{r['port']}", r["state"]] for r in rows]))
    return 0
