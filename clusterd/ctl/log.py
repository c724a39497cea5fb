"""`clusterctl log ...`: named logs (stream/, docs/streams.md) from the command line.

    clusterctl log create NAME [-E 3 -Q 3 -A 2] [--roll-bytes N] [--roll-ms N] [--retention-ms N] [--retention-bytes N]
    clusterctl log ls
    clusterctl log stat NAME
    clusterctl log append NAME DATA... [--stdin] [--txid N]
    clusterctl log tail NAME [--from POSITION | --txid N | --head] [--follow]
    clusterctl log truncate NAME POSITION
    clusterctl log delete NAME
    each with --json.

`append` takes the log's ownership for the command's duration (as any writer: the last owner's
open segment is recovered first) and closes it cleanly. Records' transaction ids continue after
the log's last one unless `--txid` gives the first. A position is written segment:entry:slot.
Exit status: 0 done, 1 the operation failed (no such log, another writer owns it, ...), 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from bookie.errors import BookieError
from clusterd.config import ClusterConfig
from clusterd.ctl import zk as zkctl
from clusterd.ctl.sdk_session import Session, action_parser, check_data_or_stdin, failure_in, out
from ledger.errors import LedgerError
from metastore.errors import MetastoreError
from stream.errors import StreamError
from stream.log_metadata import LogSettings
from stream.namespace import Namespace
from stream.position import Position
from stream.reader import LogRecord
from stream.segment_list import SegmentList

EXIT_FAILED, EXIT_USAGE = 1, 2


def add_commands(command: Callable[[str, Any, str], argparse.ArgumentParser]) -> None:
    """Register `log ACTION` with clusterctl's parser, one sub-parser per action."""
    p = command("log", zkctl._zk(cmd_log), "named logs: create, ls, stat, append, tail, truncate, delete")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str, example: str) -> argparse.ArgumentParser:
        return action_parser(actions, name, help_text, example)

    create = action("create", "a new, empty log", "clusterctl log create orders -E 3 -Q 3 -A 2")
    create.add_argument("name")
    defaults = LogSettings()
    create.add_argument("-E", "--ensemble", type=int, default=defaults.ensemble, help="segment ledgers' E (default 3)")
    create.add_argument("-Q", "--write-quorum", type=int, default=defaults.write_quorum, help="Qw (default 3)")
    create.add_argument("-A", "--ack-quorum", type=int, default=defaults.ack_quorum, help="Qa (default 2)")
    create.add_argument("--roll-bytes", type=int, default=defaults.roll_bytes, help="roll a segment at this size")
    create.add_argument("--roll-ms", type=int, default=defaults.roll_ms, help="roll a segment at this age")
    create.add_argument("--retention-ms", type=int, default=0, help="truncate segments older than this (0: keep)")
    create.add_argument("--retention-bytes", type=int, default=0, help="keep at most this much (0: keep)")
    action("ls", "the logs", "clusterctl log ls --json")
    action("stat", "a log's metadata, segments and subscriptions", "clusterctl log stat orders").add_argument("name")
    append = action("append", "write records (as the log's owner for the command's duration)",
                    "clusterctl log append orders first second")
    append.add_argument("name")
    append.add_argument("data", nargs="*", help="one record per argument (UTF-8)")
    append.add_argument("--stdin", action="store_true", help="one record per line of standard input")
    append.add_argument("--txid", type=int, default=None, help="the first record's transaction id (default: next)")
    append.set_defaults(check_usage=partial(check_data_or_stdin, append, "records"))
    tail = action("tail", "print records", "clusterctl log tail orders --from 1:0:0 --follow")
    tail.add_argument("name")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=_position, default=None, help="from this position on")
    start.add_argument("--txid", type=int, default=None, help="from the first record with this txid or more")
    start.add_argument("--head", action="store_true", help="from the first record kept (the default)")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new records (Ctrl-C ends)")
    truncate = action("truncate", "drop every record before POSITION", "clusterctl log truncate orders 3:0:0")
    truncate.add_argument("name")
    truncate.add_argument("position", type=_position)
    action("delete", "a log, its segments' ledgers and its subscriptions", "clusterctl log delete orders") \
        .add_argument("name")


def _position(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_log(config: ClusterConfig, args: argparse.Namespace) -> int:
    handler: Callable[[Namespace, argparse.Namespace], Awaitable[int]] = {
        "create": _create, "ls": _ls, "stat": _stat, "append": _append, "tail": _tail, "truncate": _truncate,
        "delete": _delete}[args.action]

    async def main() -> int:
        async with Session(config) as (meta, ledgers):
            return await handler(Namespace(meta, ledgers), args)
    try:
        return trio.run(main)
    except (*_FAILURES, BaseExceptionGroup) as e:
        failure = _failure(e)
        if failure is None:
            raise
        print(f"clusterctl: log {args.action}: {type(failure).__name__}: {failure}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 0


_FAILURES = (StreamError, LedgerError, BookieError, MetastoreError, ValueError)


def _failure(error: BaseException) -> BaseException | None:
    return failure_in(error, _FAILURES)


async def _create(ns: Namespace, args: argparse.Namespace) -> int:
    settings = LogSettings(ensemble=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum,
                           roll_bytes=args.roll_bytes, roll_ms=args.roll_ms, retention_ms=args.retention_ms,
                           retention_bytes=args.retention_bytes)
    await ns.create(args.name, settings)
    out(args, {"created": args.name}, f"log {args.name} created")
    return 0


async def _ls(ns: Namespace, args: argparse.Namespace) -> int:
    names = await ns.list()
    out(args, names, "\n".join(names))
    return 0


def listing_dict(listing: SegmentList) -> dict[str, Any]:
    """A log's metadata and segments as plain JSON-able data (what `stat --json` prints)."""
    log = listing.log
    return {"epoch": log.epoch, "next_segment": log.next_segment, "truncated_before": str(log.truncated_before),
            "created_ms": log.created_ms, "settings": {k: getattr(log.settings, k) for k in log.settings.__slots__},
            "segments": [{"seq": s.seq, "ledger_id": s.ledger_id, "state": s.state.value, "records": s.records,
                          "bytes": s.bytes, "first_txid": s.first_txid, "last_txid": s.last_txid,
                          "last_position": str(s.last_position) if s.last_position else None,
                          "created_ms": s.created_ms, "completed_ms": s.completed_ms} for s in listing.segments]}


async def _stat(ns: Namespace, args: argparse.Namespace) -> int:
    listing = await ns.read(args.name)
    subscriptions = {k: str(v) for k, v in (await ns.subscriptions(args.name)).items()}
    data = listing_dict(listing) | {"name": args.name, "subscriptions": subscriptions}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"log {args.name}: epoch {data['epoch']}, truncated before {data['truncated_before']}, "
          f"{len(listing.segments)} segment(s)")
    for s in data["segments"]:
        print(f"  segment {s['seq']}: ledger {s['ledger_id']}, {s['state']}, {s['records']} records, {s['bytes']} bytes, "
              f"txids {s['first_txid']}..{s['last_txid']}")
    for name, position in subscriptions.items():
        print(f"  subscription {name}: at {position}")
    return 0


async def _append(ns: Namespace, args: argparse.Namespace) -> int:
    payloads = [line.rstrip("\n").encode() for line in sys.stdin] if args.stdin else [d.encode() for d in args.data]
    if not payloads:
        raise ValueError("standard input held no records (one per line)")
    async with ns.writer(args.name) as w:
        first = w.last_txid + 1 if args.txid is None else args.txid
        positions = await w.write_many((first + i, p) for i, p in enumerate(payloads))
    out(args, {"positions": [str(p) for p in positions], "first_txid": first},
         f"{len(positions)} record(s) at {positions[0]}..{positions[-1]}, txids {first}..{first + len(payloads) - 1}")
    return 0


def _record_dict(r: LogRecord) -> dict[str, Any]:
    try:
        text: str | None = r.payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"position": str(r.position), "txid": r.txid, "data": text, "data_base64": base64.b64encode(r.payload).decode()}


async def _tail(ns: Namespace, args: argparse.Namespace) -> int:
    async for r in ns.reader(args.name, args.start, txid=args.txid, follow=args.follow):
        out(args, _record_dict(r), f"{r.position}\t{r.txid}\t{r.payload.decode('utf-8', errors='replace')}")
    return 0


async def _truncate(ns: Namespace, args: argparse.Namespace) -> int:
    listing = await ns.truncate(args.name, args.position)
    out(args, {"truncated_before": str(listing.log.truncated_before), "segments": len(listing.segments)},
         f"log {args.name}: truncated before {listing.log.truncated_before}")
    return 0


async def _delete(ns: Namespace, args: argparse.Namespace) -> int:
    await ns.delete(args.name)
    out(args, {"deleted": args.name}, f"log {args.name} deleted")
    return 0
