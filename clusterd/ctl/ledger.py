"""`clusterctl ledger ...`: create, write, read, tail, list, inspect, recover and delete ledgers.

    clusterctl ledger create [-E 3 -Q 2 -A 2] [--digest crc32c|hmac] [--password PW] [--keep-open]
    clusterctl ledger append DATA... | --stdin  [-E/-Q/-A/--digest/--password ...] [--keep-open]
    clusterctl ledger read ID [--first N] [--last N] [--password PW]
    clusterctl ledger tail ID [--from N] [--follow] [--password PW]
    clusterctl ledger recover ID [--password PW]
    clusterctl ledger ls | stat ID | delete ID
    each with --json; each action is its own sub-parser (`ledger ACTION --help`: its options
    and examples), so a missing ID or DATA is a usage error before anything is dialled.

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
from functools import partial
from typing import Any

from bookie.entry import DigestType, Entry
from bookie.errors import BookieError
from clusterd.daemon import tls_node
from clusterd.ctl import zk as zkctl
from clusterd.ctl.sdk_session import action_parser, check_data_or_stdin
from clusterd.config import ClusterConfig
from ledger.client_sync import SyncLedgerClient
from ledger.errors import LedgerError
from ledger.metadata import LedgerMetadata

Command = Callable[[ClusterConfig, argparse.Namespace], int]
EXIT_FAILED = 1
DIGESTS = {"crc32c": DigestType.CRC32C, "hmac": DigestType.HMAC_SHA256}


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Register `ledger ACTION` with clusterctl's parser (`command` is ctl's factory), one
    sub-parser per action, each with only its own options."""
    p = command("ledger", zkctl._zk(cmd_ledger), "ledgers: create, append, read, tail, ls, stat, recover, delete")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str, *examples: str) -> argparse.ArgumentParser:
        return action_parser(actions, name, help_text, *examples)

    _add_writing_actions(action)
    read = action("read", "print a ledger's entries, digests checked (an open ledger's up to its LAC)",
                  "clusterctl ledger read 1", "clusterctl ledger read 1 --first 10 --last 19 --json")
    _ledger_id_argument(read)
    read.add_argument("--first", type=int, default=0, help="first entry (default 0)")
    read.add_argument("--last", type=int, default=None, help="last entry (default: the last readable)")
    _password_option(read)
    tail = action("tail", "print a ledger's entries from one on; with --follow, wait for more",
                  "clusterctl ledger tail 2 --follow", "clusterctl ledger tail 2 --from 100 --json")
    _ledger_id_argument(tail)
    tail.add_argument("--from", dest="from_entry", type=int, default=0, help="first entry (default 0)")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new entries (Ctrl-C ends)")
    _password_option(tail)
    action("ls", "the ids of every ledger", "clusterctl ledger ls", "clusterctl ledger ls --json")
    _ledger_id_argument(action("stat", "a ledger's state, E/Qw/Qa, last entry and fragments with their bookies",
                               "clusterctl ledger stat 1", "clusterctl ledger stat 1 --json"))
    recover = action("recover", "fence an open ledger's bookies and close it at its true last entry",
                     "clusterctl ledger recover 2", "clusterctl ledger recover 2 --password pw --json")
    _ledger_id_argument(recover)
    _password_option(recover)
    _ledger_id_argument(action("delete", "delete a ledger (its bookies reclaim the space later)",
                               "clusterctl ledger delete 1"))


def _add_writing_actions(action: Callable[..., argparse.ArgumentParser]) -> None:
    create = action("create", "a new, empty ledger, closed unless --keep-open; prints its id",
                    "clusterctl ledger create --keep-open", "clusterctl ledger create -E 3 -Q 3 -A 2 --digest hmac "
                    "--password pw --json")
    _new_ledger_options(create)
    append = action("append", "a new ledger with one entry per DATA (or line of --stdin), closed unless "
                    "--keep-open; prints its id", "clusterctl ledger append a b c",
                    "seq 1000 | clusterctl ledger append --stdin --keep-open --json")
    append.add_argument("data", nargs="*", metavar="DATA", help="one entry per argument (UTF-8)")
    append.add_argument("--stdin", action="store_true", help="one entry per line of standard input instead")
    _new_ledger_options(append)
    append.set_defaults(check_usage=partial(check_data_or_stdin, append, "entries"))


def _new_ledger_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-E", "--ensemble", type=int, default=3, help="ensemble size E (default 3)")
    parser.add_argument("-Q", "--write-quorum", type=int, default=2, help="write quorum Qw (default 2)")
    parser.add_argument("-A", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    parser.add_argument("--digest", choices=sorted(DIGESTS), default="crc32c", help="entry digest (default crc32c)")
    _password_option(parser)
    parser.add_argument("--keep-open", action="store_true",
                        help="exit without closing the ledger, as a crashed writer would (then: recover ID)")


def _password_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--password", default="", help="the ledger's password (default empty)")


def _ledger_id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ledger_id", metavar="ID", type=_ledger_id, help="the ledger's id (`ledger ls` lists them)")


def _ledger_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a ledger ID is a number of 0 or more, got {text!r}")
    return int(text)


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
    """A command line refused only once the command runs (an empty --stdin): exit 2."""


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
    w = _new_ledger(ledgers, args)
    closed = None if args.keep_open else w.close()
    _report(args, w.ledger_id, [], closed)
    return 0


def _append(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    payloads = [line.rstrip("\n").encode() for line in sys.stdin] if args.stdin else [a.encode() for a in args.data]
    if not payloads:
        raise _Usage("standard input held no lines: nothing to append")
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
    r = ledgers.open(args.ledger_id, _password(args))
    end = r.last_entry if r.last_entry is not None else r.lac
    last = end if args.last is None else min(args.last, end)
    if last >= args.first:
        for e in r.read(args.first, last):
            _print_entry(e, args.json)
    return 0


def _tail(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    r = ledgers.open(args.ledger_id, _password(args))
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
    ids = ledgers.list_ledgers()
    print(json.dumps(ids) if args.json else "\n".join(map(str, ids)))
    return 0


def _stat(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    ledger_id = args.ledger_id
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
    closed = ledgers.recover(args.ledger_id, _password(args))
    if args.json:
        print(json.dumps(metadata_dict(closed)))
    else:
        print(f"ledger {closed.ledger_id}: CLOSED at entry {closed.last_entry}, length {closed.length}")
    return 0


def _delete(ledgers: SyncLedgerClient, args: argparse.Namespace) -> int:
    ledger_id = args.ledger_id
    ledgers.delete(ledger_id)
    print(json.dumps({"deleted": ledger_id}) if args.json else f"ledger {ledger_id} deleted")
    return 0
