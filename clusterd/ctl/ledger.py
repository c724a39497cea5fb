"""`clusterctl ledger ...`: create, write, read, tail, list, inspect, recover and delete ledgers.

    clusterctl ledger create [-E 3 -Q 2 -A 2] [--digest crc32c|hmac] [--password PW]
    clusterctl ledger append DATA... [--stdin] [--keep-open] [-E/-Q/-A ...]
    clusterctl ledger read ID [--first N] [--last N]
    clusterctl ledger tail ID [--from N] [--follow]
    clusterctl ledger ls | stat ID | recover ID | delete ID
    each with --json.

A ledger has exactly one writer, the client that created it (seed 001), so
`append` writes to a ledger it creates, then closes it (`--keep-open` leaves it
OPEN when the command exits, as a crashed writer would: `recover` then fences and
closes it at its true last entry). `create` makes an empty OPEN ledger the same
way. `read` of an open ledger stops at its LAC; `tail --follow` keeps
long-polling for new entries until interrupted. Entry data on the command line
is UTF-8; `--json` prints payloads as text when they decode and always in base64.

Exit status: 0 done, 1 the operation failed (no such ledger, wrong password,
not enough bookies, ...), 2 usage or a cluster that does not run the metastore.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable
from typing import Any

from bookie.entry import DigestType, Entry
from bookie.errors import BookieError
from clusterd.daemon import tls_node
from clusterd.ctl import zk as zkctl
from clusterd.config import ClusterConfig
from ledger.client_sync import SyncLedgerClient
from ledger.errors import LedgerError
from ledger.metadata import LedgerMetadata

Command = Callable[[ClusterConfig, argparse.Namespace], int]
EXIT_FAILED = 1
DIGESTS = {"crc32c": DigestType.CRC32C, "hmac": DigestType.HMAC_SHA256}
ACTIONS = ("create", "append", "read", "tail", "ls", "stat", "recover", "delete")


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Register `ledger ACTION` with clusterctl's parser (`command` is ctl's factory)."""
    p = command("ledger", zkctl._zk(cmd_ledger), "ledgers: create, append, read, tail, ls, stat, recover, delete")
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("args", nargs="*", help="ID for read/tail/stat/recover/delete; DATA... for append")
    p.add_argument("-E", "--ensemble", type=int, default=3, help="ensemble size E (default 3)")
    p.add_argument("-Q", "--write-quorum", type=int, default=2, help="write quorum Qw (default 2)")
    p.add_argument("-A", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    p.add_argument("--digest", choices=sorted(DIGESTS), default="crc32c", help="entry digest (default crc32c)")
    p.add_argument("--password", default="", help="the ledger's password (default empty)")
    p.add_argument("--stdin", action="store_true", help="append: one entry per line of standard input")
    p.add_argument("--keep-open", action="store_true", help="append/create: exit without closing the ledger")
    p.add_argument("--first", type=int, default=0, help="read: first entry (default 0)")
    p.add_argument("--last", type=int, default=None, help="read: last entry (default: the last readable)")
    p.add_argument("--from", dest="from_entry", type=int, default=0, help="tail: first entry (default 0)")
    p.add_argument("--follow", action="store_true", help="tail: keep waiting for new entries (Ctrl-C ends)")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_ledger(config: ClusterConfig, args: argparse.Namespace) -> int:
    handler = {"create": _create, "append": _append, "read": _read, "tail": _tail, "ls": _ls,
               "stat": _stat, "recover": _recover, "delete": _delete}[args.action]
    try:
        with SyncLedgerClient(config.client_addresses(), config.bookie_addresses(),
                              meta_tls=tls_node.operator_tls(config), bookie_tls=tls_node.operator_tls(config, "bookie")) \
                as ledgers:
            return handler(ledgers, args)
    except (LedgerError, BookieError) as e:
        print(f"clusterctl: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    except _Usage as e:
        print(f"clusterctl: ledger {args.action}: {e}", file=sys.stderr)
        return 2


class _Usage(Exception):
    pass


def _ledger_id(args: argparse.Namespace) -> int:
    if len(args.args) != 1 or not args.args[0].isdigit():
        raise _Usage("takes exactly one ledger ID (a number)")
    return int(args.args[0])


def _password(args: argparse.Namespace) -> bytes:
    return args.password.encode()


def metadata_dict(m: LedgerMetadata) -> dict[str, Any]:
    """The metadata as plain JSON-able data (what `stat --json` prints)."""
    return {"ledger_id": m.ledger_id, "state": m.state.value, "ensemble_size": m.ensemble_size,
            "write_quorum": m.write_quorum, "ack_quorum": m.ack_quorum, "last_entry": m.last_entry,
            "length": m.length, "digest_type": m.digest_type.name, "ctime_ms": m.ctime_ms,
            "fragments": [{"first_entry": f.first_entry, "ensemble": list(f.ensemble)} for f in m.fragments],
            "custom": {k: base64.b64encode(v).decode() for k, v in m.custom.items()}}


def _entry_dict(e: Entry) -> dict[str, Any]:
    try:
        text: str | None = e.payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"entry_id": e.entry_id, "data": text, "data_base64": base64.b64encode(e.payload).decode()}


def _print_entry(e: Entry, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_entry_dict(e)), flush=True)
    else:
        print(f"{e.entry_id}\t{e.payload.decode('utf-8', errors='replace')}", flush=True)


def _new_ledger(ledgers: SyncLedgerClient, args: argparse.Namespace) -> Any:
    return ledgers.create(args.ensemble, args.write_quorum, args.ack_quorum, DIGESTS[args.digest], _password(args))


def _create(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    if args.args:
        raise _Usage("takes no arguments")
    w = _new_ledger(ledgers, args)
    closed = None if args.keep_open else w.close()
    _report(args, w.ledger_id, [], closed)
    return 0


def _append(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    payloads = [line.rstrip("\n").encode() for line in sys.stdin] if args.stdin else [a.encode() for a in args.args]
    if not payloads:
        raise _Usage("give DATA arguments or --stdin")
    w = _new_ledger(ledgers, args)
    entry_ids = w.append_many(payloads)
    closed = None if args.keep_open else w.close()
    _report(args, w.ledger_id, entry_ids, closed)
    return 0


def _report(args: argparse.Namespace, ledger_id: int, entry_ids: list[int], closed: LedgerMetadata | None) -> None:
    state = "CLOSED" if closed is not None else "OPEN (no writer: recover it to close)"
    if args.json:
        print(json.dumps({"ledger_id": ledger_id, "entries": entry_ids, "closed": closed is not None}))
    else:
        last = f"entries 0..{entry_ids[-1]}" if entry_ids else "no entries"
        print(f"ledger {ledger_id}: {last}, {state}")


def _read(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    r = ledgers.open(_ledger_id(args), _password(args))
    end = r.last_entry if r.last_entry is not None else r.lac
    last = end if args.last is None else min(args.last, end)
    if last >= args.first:
        for e in r.read(args.first, last):
            _print_entry(e, args.json)
    return 0


def _tail(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    r = ledgers.open(_ledger_id(args), _password(args))
    if not args.follow:
        end = r.last_entry if r.last_entry is not None else r.lac
        for e in r.read(args.from_entry, end) if end >= args.from_entry else []:
            _print_entry(e, args.json)
        return 0
    try:
        for e in r.tail(args.from_entry):
            _print_entry(e, args.json)
    except KeyboardInterrupt:
        pass
    return 0


def _ls(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    if args.args:
        raise _Usage("takes no arguments")
    ids = ledgers.list_ledgers()
    print(json.dumps(ids) if args.json else "\n".join(map(str, ids)))
    return 0


def _stat(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    ledger_id = _ledger_id(args)
    metadata, version = ledgers.run(ledgers.client.manager.read, ledger_id)
    if args.json:
        print(json.dumps(metadata_dict(metadata) | {"version": version}, indent=2))
        return 0
    m = metadata
    print(f"ledger {m.ledger_id}: {m.state.value}, E={m.ensemble_size} Qw={m.write_quorum} Qa={m.ack_quorum}, "
          f"digest {m.digest_type.name}, last entry {m.last_entry}, length {m.length}, version {version}")
    for f in m.fragments:
        print(f"  from entry {f.first_entry}: bookies {', '.join(map(str, f.ensemble))}")
    return 0


def _recover(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    closed = ledgers.recover(_ledger_id(args), _password(args))
    if args.json:
        print(json.dumps(metadata_dict(closed)))
    else:
        print(f"ledger {closed.ledger_id}: CLOSED at entry {closed.last_entry}, length {closed.length}")
    return 0


def _delete(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    ledger_id = _ledger_id(args)
    ledgers.delete(ledger_id)
    print(json.dumps({"deleted": ledger_id}) if args.json else f"ledger {ledger_id} deleted")
    return 0
