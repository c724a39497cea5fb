"""Child processes for the named logs' multi-process tests: a writer that prints what was
acknowledged as it goes (so that a test can SIGKILL or SIGSTOP it anywhere), and a tailing
reader that prints every record it reads until one says END."""

from __future__ import annotations

import json
import subprocess
import sys

from cluster_fixtures import ENV, REPO, Cluster

# argv: hosts JSON, log name, records, session timeout ms, payload prefix.
# Prints OWNED, then "ACK txid position" per acknowledged record, then CLOSED (or FENCED).
# The last record's payload is END. Its first txid follows the log's last one.
WRITER = r"""
import json, sys, trio
from bookie.client import BookiePool
from ledger.client import LedgerClient
from metastore.client import MetaClient
from stream.errors import LogFenced
from stream.namespace import Namespace

hosts, name, count, session_ms, prefix = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

async def main():
    async with MetaClient([tuple(h) for h in hosts], session_timeout_ms=session_ms) as meta, \
            BookiePool(timeout_s=3.0) as pool, LedgerClient(meta, pool) as ledgers:
        ns = Namespace(meta, ledgers)
        try:
            async with ns.writer(name, wait=True) as w:
                print("OWNED", w.last_txid, flush=True)
                first = w.last_txid + 1
                for i in range(count):
                    payload = b"END" if i == count - 1 else prefix.encode()
                    position = await w.write(first + i, payload)
                    print("ACK", first + i, position, flush=True)
            print("CLOSED", flush=True)
        except LogFenced as e:
            print("FENCED", e, flush=True)
            sys.exit(3)

trio.run(main)
"""

# argv: hosts JSON, log name[, subscription, commit every N records]. Prints "REC txid position
# payload" per record until END; with a subscription, starts after its position and prints
# "COMMITTED position" after storing each Nth record's.
READER = r"""
import json, sys, trio
from bookie.client import BookiePool
from ledger.client import LedgerClient
from metastore.client import MetaClient
from stream.namespace import Namespace

hosts, name = json.loads(sys.argv[1]), sys.argv[2]
subscription, every = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, 0)

async def main():
    async with MetaClient([tuple(h) for h in hosts]) as meta, BookiePool(timeout_s=3.0) as pool, \
            LedgerClient(meta, pool) as ledgers:
        ns = Namespace(meta, ledgers)
        print("READING", flush=True)
        read = 0
        async for r in ns.reader(name, subscription=subscription):
            print("REC", r.txid, r.position, r.payload.decode(), flush=True)
            read += 1
            if every and read % every == 0:
                await ns.commit(name, subscription, r.position)
                print("COMMITTED", r.position, flush=True)
            if r.payload == b"END":
                return

trio.run(main)
"""


def spawn(cluster: Cluster, script: str, *args: str) -> subprocess.Popen[str]:
    hosts = json.dumps(cluster.config.client_addresses())
    return subprocess.Popen([sys.executable, "-c", script, hosts, *args], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records_of(output: str) -> list[tuple[int, str, str]]:
    """A reader's (txid, position, payload) lines; a last line without its newline (the process
    was SIGKILLed between two writes of its buffered output) is not one."""
    out = []
    for line in output.split("\n")[:-1]:
        parts = line.split()
        if parts and parts[0] == "REC":
            out.append((int(parts[1]), parts[2], parts[3]))
    return out


def acks_of(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("ACK ")]
