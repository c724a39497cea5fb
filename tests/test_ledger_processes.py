"""Ledgers on real clusterd processes: bookies and writers SIGKILLed, every node restarted,
replica bytes corrupted on disk; nothing acknowledged may be lost and every read is digest-checked.

One 4-node cluster for the module (3 voters that are also bookies, node 4 a bookie only),
so that an ensemble of 3 always has a spare bookie to change to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bookie.client import BookiePool
from bookie.entry import Digester, DigestType, master_key
from bookie.errors import EntryCorrupt, NoSuchLedger
from clusterd import localcluster
from ledger.client import LedgerClient
from ledger.metadata import LedgerState
from metastore.client import MetaClient
from cluster_fixtures import four_node_config, with_quick_bookie_gc
from cluster_fixtures import ENV, REPO, Cluster

pytestmark = pytest.mark.multiprocess
PASSWORD = b"pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(with_quick_bookie_gc(four_node_config(tmp_path_factory.mktemp("ledgers"))))
    up = c.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield c
    c.ctl("down", "--timeout", "5")


def run_with_ledgers(cluster: Cluster, scenario) -> object:
    """Run `await scenario(ledger_client)` with a fresh metastore session and bookie pool."""
    async def main():
        with trio.fail_after(90):
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool(timeout_s=3.0) as pool, \
                    LedgerClient(meta, pool) as client:
                return await scenario(client)
    return trio.run(main)


def sigkill(cluster: Cluster, node_id: int) -> None:
    node = cluster.config.node(node_id)
    pid = localcluster.read_pid_file(node)
    assert pid is not None, f"node {node_id} is not running"
    os.kill(pid, signal.SIGKILL)
    localcluster.remove_pid_file(node, pid)


def restart_all_down_nodes(cluster: Cluster) -> None:
    up = cluster.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr


async def read_all(client: LedgerClient, ledger_id: int) -> list[bytes]:
    r = await client.open(ledger_id, PASSWORD)
    assert r.is_closed
    if r.last_entry < 0:
        return []
    return [e.payload for e in await r.read(0, r.last_entry)]  # every entry's digest is verified


def test_a_bookie_sigkilled_during_appends_costs_no_acknowledged_entry(cluster: Cluster):
    """E=3, Qw=2, Qa=2: a bookie of the ensemble dies a sixth of the way into 3,000 pipelined
    appends; the writer replaces it (a new fragment by CAS) and every append is acknowledged."""
    total, killed = 3000, []

    async def scenario(client: LedgerClient):
        w = await client.create(3, 2, 2, password=PASSWORD)
        victim = w.metadata.last_fragment.ensemble[0]
        acked: list[int] = []

        async def appender():
            window: deque = deque()
            for i in range(total):
                window.append(w.start_append(b"a%d" % i))
                if len(window) >= 100:
                    acked.append(await window.popleft().result())
            while window:
                acked.append(await window.popleft().result())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender)
            while len(acked) < total // 6:
                await trio.sleep(0.005)
            sigkill(cluster, victim)
            killed.append(victim)
        closed = await w.close()
        assert acked == list(range(total))
        assert closed.last_entry == total - 1
        assert len(closed.fragments) >= 2 and victim not in closed.last_fragment.ensemble
        assert await read_all(client, w.ledger_id) == [b"a%d" % i for i in range(total)]

    try:
        run_with_ledgers(cluster, scenario)
    finally:
        restart_all_down_nodes(cluster)


def test_a_deleted_ledger_is_collected_by_every_bookie_and_its_space_comes_back(cluster: Cluster):
    """Two ledgers on every bookie; one is deleted. Each bookie's collector sees it missing from
    two listings, confirms with an exists-check, deletes it and compacts its entry logs; the
    other ledger is untouched. Entries under an id outside the ledger layout are collected too
    (they once made the exists-check raise and stopped the node)."""
    payload = bytes(range(256)) * 2

    async def scenario(client: LedgerClient):
        kept = await client.create(4, 4, 2, password=PASSWORD)
        doomed = await client.create(4, 4, 2, password=PASSWORD)
        for w in (kept, doomed):
            await w.append_many([payload] * 600)  # ~300 KB per bookie: several 64 KB entry logs
            await w.close()
        client.pool.update(cluster.config.bookie_addresses())
        # An entry under an id no ledger can have (outside the 10-digit layout), sent by hand.
        rogue = 10**12
        await client.pool.client(1).add(rogue, 0, master_key(b"x"), Digester(DigestType.CRC32C, b"x").package(
            rogue, 0, -1, 1, b"?"))
        await client.delete(doomed.ledger_id)
        with trio.fail_after(30):
            for bookie, ledger_id in ((1, rogue), (1, doomed.ledger_id), (2, doomed.ledger_id),
                                      (3, doomed.ledger_id), (4, doomed.ledger_id)):
                while True:
                    try:
                        await client.pool.client(bookie).read(ledger_id, 0)
                    except NoSuchLedger:
                        break
                    await trio.sleep(0.1)
        assert await read_all(client, kept.ledger_id) == [payload] * 600
        with trio.move_on_after(30):  # each bookie compacts right after its deletion
            while True:
                statuses = await localcluster.fetch_statuses(cluster.config)
                gc = {i: s["bookie"]["gc"] for i, s in statuses.items()}
                if all(g["ledgers_deleted"] >= 1 and g["bytes_freed"] > 0 for g in gc.values()):
                    break
                await trio.sleep(0.1)
        assert all(g["ledgers_deleted"] >= 1 and g["bytes_freed"] > 0 for g in gc.values()), gc

    run_with_ledgers(cluster, scenario)


WRITER = """
import sys, trio
from bookie.client import BookiePool
from bookie.entry import Digester, DigestType, master_key
from bookie.errors import EntryCorrupt, NoSuchLedger
from ledger.client import LedgerClient
from metastore.client import MetaClient

async def main():
    hosts = [(h, int(p)) for h, p in (a.split(":") for a in sys.argv[1].split(","))]
    async with MetaClient(hosts) as meta, BookiePool() as pool, LedgerClient(meta, pool) as client:
        w = await client.create(3, 3, 2, password=b"pw")
        print("ledger", w.ledger_id, flush=True)
        window, i = [], 0
        while True:
            while len(window) < 200:
                window.append(w.start_append(b"e%d" % i))
                i += 1
            print("ack", await window.pop(0).result(), flush=True)

trio.run(main)
"""


def test_a_sigkilled_writer_is_recovered_with_every_acknowledged_entry(cluster: Cluster):
    """A writer process prints each entry id once its append is acknowledged and is SIGKILLed
    with 200 appends in flight; another client recovers the ledger: it closes at or past the
    last acknowledged entry, with every entry up to there readable and intact."""
    hosts = ",".join(f"{h}:{p}" for h, p in cluster.config.client_addresses())
    writer = subprocess.Popen([sys.executable, "-c", WRITER, hosts], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ledger_line = writer.stdout.readline()
        assert ledger_line.startswith("ledger "), ledger_line + writer.stderr.read()
        ledger_id = int(ledger_line.split()[1])
        acked = 0
        while acked < 500:
            line = writer.stdout.readline()
            assert line.startswith("ack "), line + writer.stderr.read()
            acked += 1
        writer.send_signal(signal.SIGKILL)
        rest = writer.communicate(timeout=10)[0].split()
    finally:
        if writer.poll() is None:
            writer.kill()
    last_acked = acked - 1 + sum(1 for word in rest if word == "ack")

    async def scenario(client: LedgerClient):
        closed = await client.recover(ledger_id, PASSWORD)
        assert closed.state is LedgerState.CLOSED and closed.last_entry >= last_acked
        assert await read_all(client, ledger_id) == [b"e%d" % i for i in range(closed.last_entry + 1)]
        again = await client.recover(ledger_id, PASSWORD)  # a second recoverer agrees
        assert again.last_entry == closed.last_entry

    run_with_ledgers(cluster, scenario)


def test_every_node_restarted_then_a_corrupt_replica_on_disk_is_read_around(cluster: Cluster):
    """Ledgers written, every node SIGKILLed and restarted: everything reads back (the bookies
    replay their journals). Then, with the cluster stopped cleanly, one bookie's stored copy of
    an entry is damaged on disk: reads skip that replica and still return the right bytes."""
    payloads = [b"restart-%05d" % i for i in range(400)]

    async def write(client: LedgerClient):
        closed_one = await client.create(3, 3, 3, password=PASSWORD)
        await closed_one.append_many(payloads)
        await closed_one.close()
        open_one = await client.create(3, 2, 2, password=PASSWORD)
        await open_one.append_many(payloads[:50])
        return closed_one.ledger_id, open_one.ledger_id, closed_one.metadata.ensemble_for(123)

    closed_id, open_id, ensemble = run_with_ledgers(cluster, write)
    for node in cluster.config.nodes:
        sigkill(cluster, node.id)
    restart_all_down_nodes(cluster)

    async def read_back(client: LedgerClient):
        assert await read_all(client, closed_id) == payloads
        recovered = await client.recover(open_id, PASSWORD)
        assert recovered.last_entry >= 49
        assert (await read_all(client, open_id))[:50] == payloads[:50]

    run_with_ledgers(cluster, read_back)

    down = cluster.ctl("down", "--timeout", "10")
    assert down.returncode == 0, down.stderr
    first_asked = ensemble[123 % 3]  # entry 123's write quorum starts there: readers ask it first
    damaged = damage_stored_copy(cluster.config.node(first_asked).data_dir / "bookie", payloads[123])
    assert damaged, f"the entry's bytes were not found in node {first_asked}'s entry logs"
    restart_all_down_nodes(cluster)

    async def read_around(client: LedgerClient):
        client.pool.update(cluster.config.bookie_addresses())
        with pytest.raises(EntryCorrupt):
            await client.pool.client(first_asked).read(closed_id, 123)
        await read_back(client)

    run_with_ledgers(cluster, read_around)


def damage_stored_copy(bookie_dir: Path, payload: bytes) -> int:
    """Flip one byte of `payload` wherever it is stored in the bookie's entry logs; how many copies."""
    damaged = 0
    for path in sorted(bookie_dir.rglob("*")):
        if not path.is_file() or "journal" in path.parts:
            continue
        data = bytearray(path.read_bytes())
        at = data.find(payload)
        while at != -1:
            data[at + len(payload) - 1] ^= 0xFF
            damaged += 1
            at = data.find(payload, at + 1)
        if damaged:
            path.write_bytes(bytes(data))
    return damaged


def test_clusterctl_ledger_commands(cluster: Cluster):
    """The CLI round trip: append (closing, and leaving open), read, tail, stat, recover, ls,
    delete, each with --json; a wrong password and a missing ledger exit 1."""
    def ctl_json(*args: str) -> object:
        done = cluster.ctl("ledger", *args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()] if args[0] in ("read", "tail") \
            else json.loads(done.stdout)

    written = ctl_json("append", "alpha", "beta", "gamma", "--password", "pw")
    assert written["entries"] == [0, 1, 2] and written["closed"]
    ledger = str(written["ledger_id"])
    assert [e["data"] for e in ctl_json("read", ledger, "--password", "pw")] == ["alpha", "beta", "gamma"]
    stat = ctl_json("stat", ledger)
    assert stat["state"] == "CLOSED" and stat["last_entry"] == 2 and len(stat["fragments"][0]["ensemble"]) == 3

    left_open = ctl_json("append", "x", "y", "--keep-open", "-E", "3", "-Q", "3", "-A", "2", "--password", "pw")
    assert not left_open["closed"] and ctl_json("stat", str(left_open["ledger_id"]))["state"] == "OPEN"
    recovered = ctl_json("recover", str(left_open["ledger_id"]), "--password", "pw")
    assert recovered["state"] == "CLOSED" and recovered["last_entry"] == 1
    assert [e["data"] for e in ctl_json("tail", str(left_open["ledger_id"]), "--password", "pw")] == ["x", "y"]

    wrong = cluster.ctl("ledger", "read", ledger, "--password", "nope")
    assert wrong.returncode == 1 and "WrongPassword" in wrong.stderr
    assert int(ledger) in ctl_json("ls")
    assert ctl_json("delete", ledger) == {"deleted": int(ledger)}
    assert int(ledger) not in ctl_json("ls")
    missing = cluster.ctl("ledger", "stat", ledger)
    assert missing.returncode == 1 and "NoSuchLedger" in missing.stderr
