"""`clusterctl verify zab|ledgers|logs|tables [DIR[=ID]...]`: the Spark verifiers
(replay/verify_zab.py, verify_ledgers.py, verify_logs.py, verify_tables.py).

Without DIRs it verifies the data directories of the config's ensemble, with the
config's voter count for majorities. Exit status as replay.verify_zab: 0 every
check passed, 1 a check failed, 2 the input was refused or there is no Java 17+
for Spark (checked first: one line on stderr saying what to install).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clusterd.config import ClusterConfig

EXIT_USAGE = 2


def add_commands(command: Any) -> None:
    """Register `verify` (with its `zab` target) through clusterctl's `command` helper."""
    verify = command("verify", cmd_verify, "check the cluster's logs on Spark (docs/verify.md)")
    targets = verify.add_subparsers(dest="target", required=True, metavar="TARGET")
    zab = targets.add_parser("zab", help="Zab logs and snapshots: Agreement, PrefixConsistency, ..., Replay",
                             description="Check Zab logs and snapshots of a cluster's data directories.")
    _zab_arguments(zab)
    ledgers = targets.add_parser("ledgers", help="every ledger's entries on Qa bookies of its write quorum, digests, "
                                 "closed ledgers", description="Check the bookies' entries against the ledger metadata.")
    _zab_arguments(ledgers)
    logs = targets.add_parser("logs", help="named logs: segments, record sets, txids, truncation, subscriptions",
                              description="Check every named log's segments against their ledgers' entries.")
    _zab_arguments(logs)
    tables = targets.add_parser("tables", help="tablespaces: checkpoint + log replayed, against --expect digests",
                                description="Replay every tablespace from its checkpoint and its log.")
    from replay.verify_tables import add_table_arguments
    add_table_arguments(tables, dirs_required=False)


def _zab_arguments(parser: argparse.ArgumentParser) -> None:
    from replay.verify_zab import add_arguments
    add_arguments(parser, dirs_required=False)  # the config names them


def cmd_verify(config: ClusterConfig, args: argparse.Namespace) -> int:
    from replay import verify_ledgers, verify_logs, verify_tables, verify_zab
    from replay.spark_session import JavaUnavailable, require_java
    # Checked before reading anything, so that a missing Java is this one line on stderr.
    try:
        require_java()
    except JavaUnavailable as e:
        print(f"clusterctl: verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    run = {"ledgers": verify_ledgers.run, "logs": verify_logs.run, "tables": verify_tables.run}.get(
        args.target, verify_zab.run)
    if not args.dirs:
        args.dirs = [f"{node.data_dir}={node.id}" for node in config.ensemble]
        if args.voters is None:
            args.voters = len(config.voters)
    return run(args)
