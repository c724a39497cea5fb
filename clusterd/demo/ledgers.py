"""The ledger part of `clusterctl demo`: write with a tailing reader, SIGKILL a writer, recover.

After the metastore part, on the same cluster (every node is a bookie):

1. a writer appends `entries` entries, pipelined, to a ledger with E=3, Qw=2, Qa=2
   while a reader in the same process tails it with long polls; the reader must
   see every acknowledged entry, in order, with its digest verified;
2. a second writer, a separate process (this module run with `writer`), appends
   to its own ledger and prints each entry id as it is acknowledged; it is
   SIGKILLed with appends in flight;
3. another client recovers that ledger (fence, find the last entry, close by CAS):
   it must close at or past the last acknowledged entry, and every entry up to
   its end must read back intact, from a fresh client.

Seed 001: an acknowledged entry survives its writer; recoverers converge.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

import trio

from bookie.client import BookiePool
from clusterd.config import ClusterConfig
from ledger.client import LedgerClient
from metastore.client import MetaClient

PASSWORD = b"demo"
KILL_AFTER_ACKS = 500
WINDOW = 200


def payload(prefix: str, i: int) -> bytes:
    return f"{prefix}-{i:06d}".encode()


async def run(config: ClusterConfig, entries: int, say: Callable[[str], None]) -> list[str]:
    """The three steps; returns the problems found (empty: all good)."""
    problems: list[str] = []
    async with MetaClient(config.client_addresses()) as meta, BookiePool(config.bookie_addresses()) as pool, \
            LedgerClient(meta, pool) as client:
        tailed = await _write_and_tail(client, entries, say, problems)
        ledger_id, acked = await trio.to_thread.run_sync(_killed_writer, config, say)
        started = time.monotonic()
        closed = await client.recover(ledger_id, PASSWORD)
        say(f"recovered ledger {ledger_id} in {(time.monotonic() - started) * 1000:.0f} ms: closed at entry "
            f"{closed.last_entry}; the killed writer had {acked} appends acknowledged (entries 0..{acked - 1})")
        if closed.last_entry < acked - 1:
            problems.append(f"ledger {ledger_id} closed at {closed.last_entry}, before acknowledged entry {acked - 1}")
    async with MetaClient(config.client_addresses()) as meta, BookiePool(config.bookie_addresses()) as pool, \
            LedgerClient(meta, pool) as fresh:
        for lid, prefix, wanted in ((tailed, "tail", entries), (ledger_id, "killed", closed.last_entry + 1)):
            reader = await fresh.open(lid, PASSWORD)
            got = [e.payload for e in await reader.read(0, reader.last_entry)] if reader.last_entry >= 0 else []
            if got != [payload(prefix, i) for i in range(wanted)]:
                problems.append(f"ledger {lid}: read back {len(got)} entries, not the {wanted} written")
        say(f"read both ledgers back through a fresh client, every entry's CRC32C digest checked: "
            f"{entries} + {closed.last_entry + 1} entries" + ("" if not problems else " (see the problems below)"))
    return problems


async def _write_and_tail(client: LedgerClient, entries: int, say: Callable[[str], None],
                          problems: list[str]) -> int:
    w = await client.create(3, 2, 2, password=PASSWORD)
    say(f"ledger {w.ledger_id} (E=3 Qw=2 Qa=2 on bookies {', '.join(map(str, w.metadata.last_fragment.ensemble))}): "
        f"appending {entries} entries, pipelined, while a reader tails it")
    reader = await client.open(w.ledger_id, PASSWORD)
    sent: dict[int, float] = {}
    lags: list[float] = []
    seen: list[bytes] = []

    async def tail() -> None:
        async for entry in reader.tail(0):
            lags.append(time.monotonic() - sent[entry.entry_id])
            seen.append(entry.payload)
            if len(seen) == entries:
                return

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tail)
        window: deque = deque()
        for i in range(entries):
            window.append(w.start_append(payload("tail", i)))
            sent[window[-1].entry_id] = time.monotonic()
            if len(window) >= WINDOW:
                await window.popleft().result()
        while window:
            await window.popleft().result()
        elapsed = time.monotonic() - started
        closed = await w.close()
    lags.sort()
    say(f"{entries} appends acknowledged in {elapsed:.2f} s ({entries / elapsed:.0f}/s); ledger closed at entry "
        f"{closed.last_entry}; the tailing reader saw all {len(seen)} in order, median {lags[len(lags) // 2] * 1000:.1f}"
        f" ms after the append was sent")
    if seen != [payload("tail", i) for i in range(entries)]:
        problems.append(f"the tailing reader of ledger {w.ledger_id} saw {len(seen)} entries, not the {entries} written")
    return w.ledger_id


def _killed_writer(config: ClusterConfig, say: Callable[[str], None]) -> tuple[int, int]:
    """A writer process appends until KILL_AFTER_ACKS acks, then is SIGKILLed; (ledger id, acks seen)."""
    hosts = ",".join(f"{h}:{p}" for h, p in config.client_addresses())
    writer = subprocess.Popen([sys.executable, "-m", "clusterd.demo.ledgers", "writer", hosts],
                              stdout=subprocess.PIPE, text=True)
    try:
        ledger_id = int(writer.stdout.readline().split()[1])
        acked = 0
        while acked < KILL_AFTER_ACKS:
            line = writer.stdout.readline()
            if not line.startswith("ack"):
                raise RuntimeError(f"the demo's ledger writer stopped: {line!r}")
            acked += 1
        writer.send_signal(signal.SIGKILL)
        acked += writer.communicate(timeout=10)[0].split().count("ack")
    finally:
        if writer.poll() is None:
            writer.kill()
    say(f"a writer process appended to ledger {ledger_id} (E=3 Qw=3 Qa=2) with {WINDOW} appends in flight; "
        f"SIGKILLed after {acked} acknowledgements")
    return ledger_id, acked


async def _writer(hosts: str) -> None:
    """Child process: append forever, printing each acknowledged entry id in order."""
    addresses = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in hosts.split(","))]
    async with MetaClient(addresses) as meta, BookiePool() as pool, LedgerClient(meta, pool) as client:
        w = await client.create(3, 3, 2, password=PASSWORD)
        print("ledger", w.ledger_id, flush=True)
        window: deque = deque()
        i = 0
        while True:
            while len(window) < WINDOW:
                window.append(w.start_append(payload("killed", i)))
                i += 1
            print("ack", await window.popleft().result(), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"]:
        trio.run(_writer, sys.argv[2])
