"""AutoRecovery on real clusterd processes (issue 6): a bookie lost for good costs no durability.

One 4-node cluster for the module (3 voters that are also bookies, node 4 a bookie only), with
short grace periods. Ledgers are E=3, Qw=2, Qa=2, so each entry lives on 2 of 3 bookies and
there is always a fourth to copy to. "Fully replicated" is checked the hard way: every entry is
read from every bookie of its write quorum in the (new) metadata and its digest verified.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
import trio

from bookie.client import BookiePool
from bookie.entry import Digester, DigestType
from clusterd import localcluster
from clusterd.autorecovery import TASKS
from ledger.client import LedgerClient
from ledger.handles import WriteHandle
from ledger.quorum import write_quorum
from metastore.client import MetaClient
from metastore.errors import NoNode
from test_bookie_registration import four_node_config
from test_cluster_processes import Cluster

pytestmark = pytest.mark.multiprocess
PASSWORD = b"pw"
DIGESTER = Digester(DigestType.CRC32C, PASSWORD)
SPARE = 4  # the bookie-only node: losing it keeps the metastore's quorum
GRACE_MS = 5_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    path = four_node_config(tmp_path_factory.mktemp("autorecovery"))
    path.write_text(path.read_text().replace("[cluster]\n", (
        f"[cluster]\nautorecovery_grace_ms = {GRACE_MS}\nautorecovery_open_ledger_grace_ms = 2000\n"
        "audit_interval_ms = 4000\nautorecovery_session_timeout_ms = 4000\n"), 1))
    c = Cluster(path)
    up = c.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield c
    c.ctl("down", "--timeout", "5")


def run(cluster: Cluster, scenario, timeout_s: float = 55) -> object:
    async def main():
        with trio.fail_after(timeout_s):
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool(timeout_s=3.0) as pool, \
                    LedgerClient(meta, pool) as client:
                client.pool.update(cluster.config.bookie_addresses())
                return await scenario(client)
    return trio.run(main)


def kill(cluster: Cluster, node_id: int, signum: int = signal.SIGKILL) -> None:
    node = cluster.config.node(node_id)
    pid = localcluster.read_pid_file(node)
    assert pid is not None, f"node {node_id} is not running"
    os.kill(pid, signum)
    if signum == signal.SIGKILL:
        localcluster.remove_pid_file(node, pid)


def start(cluster: Cluster, node_id: int) -> None:
    """Start one node that is down (and only it), and wait until it serves."""
    node = cluster.config.node(node_id)
    child = localcluster.spawn(cluster.config, node)

    async def serving():
        with trio.fail_after(60):
            while True:
                assert child.poll() is None, localcluster.tail(localcluster.log_path(node))
                status = (await localcluster.fetch_statuses(cluster.config, timeout_s=1.0)).get(node_id)
                if status and status.get("bookie", {}).get("registered"):
                    return
                await trio.sleep(0.1)
    trio.run(serving)


async def ledger_on(client: LedgerClient, bookie: int) -> WriteHandle:
    """A new E=3 Qw=2 Qa=2 ledger whose ensemble includes `bookie` (placement is random)."""
    while True:
        w = await client.create(3, 2, 2, password=PASSWORD)
        if bookie in w.metadata.last_fragment.ensemble:
            return w
        await w.close()
        await client.delete(w.ledger_id)


async def closed_ledgers_on(client: LedgerClient, bookie: int, count: int, entries: int) -> list[int]:
    ids = []
    for n in range(count):
        w = await ledger_on(client, bookie)
        await w.append_many([b"closed-%d-%d" % (n, i) for i in range(entries)])
        await w.close()
        ids.append(w.ledger_id)
    return ids


async def wait_replicated(client: LedgerClient, ledger_ids: list[int], gone: int) -> None:
    """Until no ledger references `gone` and none has a task left; then read every copy."""
    while True:
        metadatas = [(await client.manager.read(i))[0] for i in ledger_ids]
        tasks = await _tasks(client.meta)
        if all(gone not in m.bookies for m in metadatas) and not set(ledger_ids) & tasks:
            break
        await trio.sleep(0.2)
    for m in metadatas:
        await assert_every_copy_readable(client, m.ledger_id)


async def assert_every_copy_readable(client: LedgerClient, ledger_id: int) -> None:
    metadata, _ = await client.manager.read(ledger_id)
    assert metadata.is_closed
    for entry_id in range(metadata.last_entry + 1):
        quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
        assert len(quorum) == 2
        for bookie in quorum:
            entry = DIGESTER.verify(await client.pool.client(bookie).read(ledger_id, entry_id))
            assert entry.entry_id == entry_id


async def _tasks(meta: MetaClient) -> set[int]:
    try:
        return {int(n) for n in await meta.children(TASKS)}
    except NoNode:
        return set()


def copied_entries(cluster: Cluster) -> int:
    statuses = trio.run(localcluster.fetch_statuses, cluster.config)
    return sum(s["bookie"]["autorecovery"]["worker"].get("entries_copied", 0) for s in statuses.values() if s)


def auditor_node(cluster: Cluster) -> int:
    done = cluster.ctl("recovery", "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["auditor"]


def test_a_bookie_restarted_within_the_grace_period_causes_no_copying(cluster: Cluster):
    """Bookie 4 stops (its registration goes at once) and is back within the grace period:
    nothing is marked, nothing copied, no metadata changed."""
    async def write(client: LedgerClient):
        return await closed_ledgers_on(client, SPARE, 2, 50)

    ledgers = run(cluster, write)
    before = copied_entries(cluster)
    kill(cluster, SPARE, signal.SIGTERM)

    async def wait_unregistered(client: LedgerClient):
        while await client.meta.exists(f"/quire/bookies/available/{SPARE}") is not None:
            await trio.sleep(0.05)
        return [(await client.manager.read(i))[0] for i in ledgers]

    metadata = run(cluster, wait_unregistered)
    gone_at = time.monotonic()
    while localcluster.running_pid(cluster.config.node(SPARE)) is not None:
        time.sleep(0.05)
    start(cluster, SPARE)
    assert time.monotonic() - gone_at < GRACE_MS / 1000, "the restart took longer than the grace period"

    async def check(client: LedgerClient):
        await trio.sleep(GRACE_MS / 1000 + 1)
        assert not set(ledgers) & await _tasks(client.meta)
        assert [(await client.manager.read(i))[0] for i in ledgers] == metadata

    run(cluster, check)
    assert copied_entries(cluster) == before
