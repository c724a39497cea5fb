"""Client processes of the ledger part (bench/ledger.py): a writer that dies without closing, a tailing reader.

    python -m bench.ledger_proc writer --hosts '[["127.0.0.1", 21811]]' --entries 10000 --window 1000 --mode kill
    python -m bench.ledger_proc tail --hosts '[["127.0.0.1", 21811]]' --ledger 7

`writer` creates a ledger (E, Qw, Qa from the command line), prints its id,
appends `--entries` entries pipelined (at most `--window` not yet
acknowledged) and then stops without closing it: `--mode kill` SIGKILLs itself
as soon as its LAC reaches entry `--entries - 1`, with the window still full of
later appends in flight (sent, maybe stored on some bookies, not acknowledged); `--mode quiet`
appends exactly `--entries`, waits until the writer's explicit LAC has gone out,
then SIGKILLs itself. Its last stdout line before dying: `acked <count> <lac>`.

`tail` opens the ledger without recovery (the writer has appended a few
entries already, so that reading the LAC opens the connections to the
bookies), prints `ready`, and tails it from entry 0 until it is closed. Each payload starts with the writer's
`time.perf_counter()` at start_append (CLOCK_MONOTONIC: one clock for every
process of the machine); the reader prints one JSON list of delivery delays in
seconds, in entry order.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import struct
import sys
import time

import trio

from bookie.client import BookiePool
from ledger.client import LedgerClient
from metastore.client import MetaClient

PASSWORD = b"bench"
STAMP = struct.Struct(">d")


def stamped(size: int) -> bytes:
    """A payload of `size` bytes (at least 8) that starts with the current perf_counter."""
    return STAMP.pack(time.perf_counter()) + b"s" * max(0, size - STAMP.size)


def stamp_of(payload: bytes) -> float:
    return STAMP.unpack_from(payload)[0]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _writer(args: argparse.Namespace) -> None:
    hosts = [tuple(h) for h in json.loads(args.hosts)]
    async with MetaClient(hosts) as meta, BookiePool() as pool, LedgerClient(meta, pool) as ledgers:
        w = await ledgers.create(args.ensemble, args.write_quorum, args.ack_quorum, password=PASSWORD)
        _say(f"ledger {w.ledger_id}")
        payload = b"w" * args.size
        in_flight: collections.deque = collections.deque()
        started = 0
        limit = args.entries if args.mode == "quiet" else None
        while True:
            # The window counts appends the writer has not acknowledged yet (not ones this loop has not seen).
            while w.in_flight < args.window and (limit is None or started < limit):
                in_flight.append(w.start_append(payload))
                started += 1
            if w.lac >= args.entries - 1:
                break
            await in_flight.popleft().result()
        if args.mode == "kill":
            # The appends just started leave for the bookies first (a crash comes at any time, but this
            # figure is about recovering a full window): until no bookie connection has frames queued,
            # at most 0.2 s, and not a moment longer. Every pass of the scheduler also handles acks that
            # already wait in the sockets (they come in bursts: a 1 ms sleep here once let a whole
            # window of 1,000 be acknowledged before the kill, leaving recovery nothing to do).
            with trio.move_on_after(0.2):
                while any(c["queued_frames"] for c in pool.statistics().values()):
                    await trio.sleep(0)
        else:
            with trio.fail_after(5):
                while w._writer.lac_sent < w.lac:  # the writer's record of its explicit LAC
                    await trio.sleep(0.005)
            await trio.sleep(0.05)  # the explicit LAC's answers
        _say(f"acked {w.lac + 1} {w.lac} in_flight {w.in_flight}")
        os.kill(os.getpid(), signal.SIGKILL)


async def _tail(args: argparse.Namespace) -> None:
    hosts = [tuple(h) for h in json.loads(args.hosts)]
    delays: list[float] = []
    async with MetaClient(hosts) as meta, BookiePool() as pool, LedgerClient(meta, pool) as ledgers:
        r = await ledgers.open(args.ledger, PASSWORD)  # reads the LAC: the bookie connections are open
        _say("ready")
        async for entry in r.tail(0):
            delays.append(time.perf_counter() - stamp_of(entry.payload))
    _say(json.dumps(delays))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    writer = sub.add_parser("writer")
    writer.add_argument("--hosts", required=True, help="JSON list of [host, port] client ports")
    writer.add_argument("--entries", type=int, default=10_000)
    writer.add_argument("--window", type=int, default=1000)
    writer.add_argument("--size", type=int, default=100)
    writer.add_argument("--ensemble", type=int, default=3)
    writer.add_argument("--write-quorum", type=int, default=3)
    writer.add_argument("--ack-quorum", type=int, default=2)
    writer.add_argument("--mode", choices=("kill", "quiet"), default="kill")
    tail = sub.add_parser("tail")
    tail.add_argument("--hosts", required=True)
    tail.add_argument("--ledger", type=int, required=True)
    args = parser.parse_args(argv)
    trio.run(_writer if args.command == "writer" else _tail, args)


if __name__ == "__main__":
    main()
