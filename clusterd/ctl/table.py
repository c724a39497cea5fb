"""`clusterctl table ...`: the replicated table service (tablespace/, docs/tablespace.md).

    clusterctl table create NAME [-E 3 -Q 3 -A 2] [--roll-bytes N]
    clusterctl table serve NAME --replica ID [--listen 127.0.0.1:0] [--checkpoint-every N]
    clusterctl table put NAME TABLE KEY VALUE [--expect VERSION]
    clusterctl table get NAME TABLE KEY
    clusterctl table delete NAME TABLE KEY [--expect VERSION]
    clusterctl table scan NAME TABLE [--start KEY] [--end KEY] [--limit N]
    clusterctl table status NAME
    each with --json.

`serve` runs one replica until interrupted: it follows the tablespace's log, leads when it gets
the log's ownership, and serves clients at --listen (the address it publishes while it leads).
The other actions find the leader through the metastore. Exit status: 0 done, 1 failed (no
leader, version mismatch, ...), 2 usage; `get` of a missing key: 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from bookie.errors import BookieError
from clusterd.config import ClusterConfig
from clusterd.ctl import zk as zkctl
from clusterd.ctl.sdk_session import Session, action_parser, failure_in, out
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from metastore.client import MetaClient
from metastore.errors import MetastoreError, SessionExpired
from stream.errors import StreamError
from stream.log_metadata import LogSettings
from tablespace.client import TableClient
from tablespace.errors import TableError
from tablespace.replica import CHECKPOINT_EVERY, Replica
from tablespace.server import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS, TableServer

EXIT_FAILED, EXIT_USAGE = 1, 2
SERVE_SESSION_MS = 4000  # a paused leader's session expires within this; another replica then takes over
log = logging.getLogger("quire.tablespace")


def add_commands(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    p = command("table", zkctl._zk(cmd_table), "replicated tables: create, serve, put, get, delete, scan, status")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str, example: str) -> argparse.ArgumentParser:
        a = action_parser(actions, name, help_text, example)
        a.add_argument("name", help="the tablespace")
        return a

    create = action("create", "a new tablespace (its log)", "clusterctl table create shop")
    defaults = LogSettings()
    create.add_argument("-E", "--ensemble", type=int, default=defaults.ensemble, help="log ledgers' E (default 3)")
    create.add_argument("-Q", "--write-quorum", type=int, default=defaults.write_quorum, help="Qw (default 3)")
    create.add_argument("-A", "--ack-quorum", type=int, default=defaults.ack_quorum, help="Qa (default 2)")
    create.add_argument("--roll-bytes", type=int, default=64 << 20, help="roll a log segment at this size")
    serve = action("serve", "run a replica of the tablespace", "clusterctl table serve shop --replica r1")
    serve.add_argument("--replica", required=True, help="this replica's id (unique per tablespace)")
    serve.add_argument("--listen", default="127.0.0.1:0", help="host:port for clients (default 127.0.0.1:0)")
    serve.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, help="changes between checkpoints")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                       help=f"client connections open at once; more are closed at once (default {MAX_CONNECTIONS})")
    serve.add_argument("--max-connections-per-address", type=int, default=MAX_CONNECTIONS_PER_ADDRESS,
                       help=f"from one client address (default {MAX_CONNECTIONS_PER_ADDRESS})")
    for name, extra in (("put", ("value",)), ("delete", ())):
        a = action(name, f"{name} a key", f"clusterctl table {name} shop orders o1" + (" paid" if extra else ""))
        a.add_argument("table")
        a.add_argument("key")
        for e in extra:
            a.add_argument(e)
        a.add_argument("--expect", type=int, default=None, help="compare-and-set: the version it must have (-1: absent)")
    get = action("get", "a key's value and version", "clusterctl table get shop orders o1")
    get.add_argument("table")
    get.add_argument("key")
    scan = action("scan", "keys in order", "clusterctl table scan shop orders --start o --limit 10")
    scan.add_argument("table")
    scan.add_argument("--start", default="")
    scan.add_argument("--end", default=None)
    scan.add_argument("--limit", type=int, default=1000)
    action("status", "the leader and its state", "clusterctl table status shop")


def cmd_table(config: ClusterConfig, args: argparse.Namespace) -> int:
    if args.action == "serve":
        return _serve(config, args)
    handler: Callable[[ClusterConfig, MetaClient, LedgerClient, argparse.Namespace], Awaitable[int]] = {
        "create": _create, "put": _put, "get": _get, "delete": _delete, "scan": _scan, "status": _status}[args.action]

    async def main() -> int:
        async with Session(config) as (meta, ledgers):
            return await handler(config, meta, ledgers, args)
    try:
        return trio.run(main)
    except (*_FAILURES, BaseExceptionGroup) as e:
        failure = _failure(e)
        if failure is None:
            raise
        print(f"clusterctl: table {args.action}: {type(failure).__name__}: {failure}", file=sys.stderr)
        return EXIT_FAILED


_FAILURES = (TableError, StreamError, LedgerError, BookieError, MetastoreError, ValueError, OSError)


def _failure(error: BaseException) -> BaseException | None:
    return failure_in(error, _FAILURES)


async def _create(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    settings = LogSettings(ensemble=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum,
                           roll_bytes=args.roll_bytes)
    await Replica.create(meta, ledgers, args.name, settings)
    out(args, {"created": args.name}, f"tablespace {args.name} created")
    return 0


async def _put(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    async with TableClient(meta, args.name) as t:
        version = await t.put(args.table, args.key, args.value, args.expect)
    out(args, {"version": version}, f"version {version}")
    return 0


async def _delete(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    async with TableClient(meta, args.name) as t:
        await t.delete(args.table, args.key, args.expect)
    out(args, {"deleted": args.key}, "deleted")
    return 0


async def _get(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    async with TableClient(meta, args.name) as t:
        found = await t.get(args.table, args.key)
    if found is None:
        out(args, None, f"no key {args.key!r}")
        return EXIT_FAILED
    out(args, {"value": found[0], "version": found[1]}, f"{found[0]}  (version {found[1]})")
    return 0


async def _scan(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    async with TableClient(meta, args.name) as t:
        items = await t.scan(args.table, args.start, args.end, args.limit)
    out(args, [list(i) for i in items], "\n".join(f"{k}\t{v}\t{n}" for k, v, n in items))
    return 0


async def _status(config: ClusterConfig, meta: MetaClient, ledgers: LedgerClient, args: argparse.Namespace) -> int:
    async with TableClient(meta, args.name) as t:
        if await t.find_leader() is None:
            out(args, {"leader": None}, f"tablespace {args.name}: no leader")
            return EXIT_FAILED
        status, answer = await t._request("GET", "/status", None)
    out(args, answer, "\n".join(f"{k}: {v}" for k, v in answer.items()))
    return 0 if status == 200 else EXIT_FAILED


def _serve(config: ClusterConfig, args: argparse.Namespace) -> int:
    """One replica until interrupted; a new metastore session (and a reload) if its session expires."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    host, _, port = args.listen.rpartition(":")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            holder: dict[str, Replica] = {}
            server = _Router(holder)
            bound = await nursery.start(partial(
                server.serve, host or "127.0.0.1", int(port or 0), max_connections=args.max_connections,
                max_connections_per_address=args.max_connections_per_address))
            address = f"{host or '127.0.0.1'}:{bound}"
            print(f"SERVING {address}", flush=True)
            while True:
                try:
                    async with Session(config, SERVE_SESSION_MS) as (meta, ledgers):
                        replica = Replica(meta, ledgers, args.name, args.replica, address,
                                          checkpoint_every=args.checkpoint_every)
                        holder["replica"] = replica
                        await replica.run()
                except (SessionExpired, MetastoreError, StreamError, LedgerError, BaseExceptionGroup) as e:
                    if isinstance(e, BaseExceptionGroup) and _failure(e) is None:
                        raise
                    log.warning("event=tablespace_replica_restart tablespace=%s error=%s", args.name, _failure(e) or e)
                    holder.pop("replica", None)
                    await trio.sleep(0.5)
    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
    return 0


class _Router(TableServer):
    """A server whose replica is replaced when the replica restarts with a new session."""

    def __init__(self, holder: dict[str, Replica]) -> None:
        self.holder = holder

    @property
    def replica(self) -> Replica:  # type: ignore[override]
        return self.holder["replica"]

    async def handle(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if "replica" not in self.holder:
            if target == "/status":
                return 200, {"role": "restarting"}
            return 421, {"error": "NotLeader", "message": "the replica is restarting", "leader": None}
        return await super().handle(method, target, body)
