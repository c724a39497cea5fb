"""Child processes of bench/streams.py: a tailing reader of a named log that reports each record's
delivery delay, and a writer that owns a log until it is SIGKILLed.

    python -m bench.streams_proc tail --hosts JSON --log NAME --count N
    python -m bench.streams_proc own --hosts JSON --log NAME --session-ms N
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time

import trio

from bookie.client import BookiePool
from ledger.client import LedgerClient
from metastore.client import MetaClient
from stream.namespace import Namespace

STAMP = struct.Struct(">d")


def stamped(size: int) -> bytes:
    """A payload of `size` bytes beginning with the send time (time.perf_counter: one clock for every process)."""
    return STAMP.pack(time.perf_counter()).ljust(size, b"s")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _tail(args: argparse.Namespace) -> None:
    delays: list[float] = []
    async with MetaClient(json.loads(args.hosts)) as meta, BookiePool() as pool, LedgerClient(meta, pool) as ledgers:
        _say("ready")  # from the head of a fresh log: every record the benchmark writes
        async for record in Namespace(meta, ledgers).reader(args.log):
            delays.append(time.perf_counter() - STAMP.unpack_from(record.payload)[0])
            if len(delays) == args.count:
                break
    _say(json.dumps(delays))


async def _own(args: argparse.Namespace) -> None:
    async with MetaClient(json.loads(args.hosts), session_timeout_ms=args.session_ms) as meta, BookiePool() as pool, \
            LedgerClient(meta, pool) as ledgers:
        async with Namespace(meta, ledgers).writer(args.log, wait=True) as w:
            for i in range(100):
                await w.write(w.last_txid + 1, b"o" * 100)
            _say("owned")
            await trio.sleep_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tail", "own"):
        p = sub.add_parser(name)
        p.add_argument("--hosts", required=True, help="JSON list of [host, port] client ports")
        p.add_argument("--log", required=True)
        p.add_argument("--count", type=int, default=1000)
        p.add_argument("--session-ms", type=int, default=2000)
    args = parser.parse_args(argv)
    trio.run(_tail if args.command == "tail" else _own, args)


if __name__ == "__main__":
    main()
