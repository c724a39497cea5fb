"""AutoRecovery on real clusterd processes (issue 6): a bookie lost for good costs no durability.

One 4-node cluster for the module (3 voters that are also bookies, node 4 a bookie only), with
short grace periods. Ledgers are E=3, Qw=2, Qa=2, so each entry lives on 2 of 3 bookies and
there is always a fourth to copy to. "Fully replicated" is checked the hard way: every entry is
read from every bookie of its write quorum in the (new) metadata and its digest verified.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
import trio

from bookie.client import BookiePool
from bookie.entry import Digester, DigestType, master_key, password_key
from bookie.errors import NoSuchEntry, NoSuchLedger
from clusterd import config as cfg
from clusterd import localcluster
from ledger.autorecovery.tasks import TASKS, read_task
from ledger.client import LedgerClient
from ledger.handles import WriteHandle
from ledger.metadata import Fragment, LedgerMetadata
from ledger.quorum import write_quorum
from metastore.client import MetaClient
from metastore.errors import NoNode
from replay.verify_ledgers import verify
from replay.verify_zab import add_arguments
from cluster_fixtures import four_node_config
from cluster_fixtures import Cluster

pytestmark = pytest.mark.multiprocess
PASSWORD = b"pw"
DIGESTER = Digester(DigestType.CRC32C, PASSWORD)
SPARE = 4  # the bookie-only node: losing it keeps the metastore's quorum
GRACE_MS = 5_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    for _ in range(5):  # the two port picks of four_node_config may collide (ports are released in between)
        path = four_node_config(tmp_path_factory.mktemp("autorecovery"))
        try:
            cfg.load(path)
            break
        except cfg.ConfigError:
            continue
    path.write_text(path.read_text().replace("[cluster]\n", (
        f"[cluster]\nautorecovery_grace_ms = {GRACE_MS}\nautorecovery_open_ledger_grace_ms = 2000\n"
        "audit_interval_ms = 4000\naudit_check_reads_per_s = 20000\nautorecovery_session_timeout_ms = 4000\n"), 1))
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


async def ledger_on(client: LedgerClient, bookie: int, digest: DigestType = DigestType.CRC32C) -> WriteHandle:
    """A new E=3 Qw=2 Qa=2 ledger whose ensemble includes `bookie` (placement is random)."""
    while True:
        w = await client.create(3, 2, 2, digest, password=PASSWORD)
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
    digester = Digester(metadata.digest_type, PASSWORD)
    for entry_id in range(metadata.last_entry + 1):
        quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
        assert len(quorum) == 2
        for bookie in quorum:
            entry = digester.verify(await client.pool.client(bookie).read(ledger_id, entry_id))
            assert entry.entry_id == entry_id


async def _tasks(meta: MetaClient) -> set[int]:
    try:
        return {int(n) for n in await meta.children(TASKS)}
    except NoNode:
        return set()


def copied_entries(cluster: Cluster, others_than: int | None = None) -> int:
    statuses = trio.run(localcluster.fetch_statuses, cluster.config)
    return sum(s["bookie"]["autorecovery"]["worker"].get("entries_copied", 0) for n, s in statuses.items()
               if s and n != others_than)


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


def test_a_writer_keeps_appending_while_its_older_fragments_are_repaired(cluster: Cluster):
    """Bookie 4 dies under an appending writer: the writer replaces it in a new fragment, and a
    worker copies the old fragment's entries and replaces 4 there by CAS, while the writer goes on
    appending. The writer adopts the repaired metadata; every acknowledged entry is in the closed
    ledger, on both bookies of its write quorum."""
    async def scenario(client: LedgerClient):
        w = await ledger_on(client, SPARE)
        acked: list[int] = []
        repaired = trio.Event()
        more_after_repair = []

        async def appender():
            i = 0
            while not repaired.is_set() or i < more_after_repair[0]:
                acked.append(await w.append(b"w%d" % i))
                i += 1
                await trio.sleep(0.002)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender)
            while len(acked) < 300:
                await trio.sleep(0.01)
            kill(cluster, SPARE)
            while True:  # until no fragment names bookie 4 any more: the worker's CAS landed
                metadata, _ = await client.manager.read(w.ledger_id)
                if len(metadata.fragments) > 1 and SPARE not in metadata.bookies:
                    break
                await trio.sleep(0.1)
            more_after_repair.append(len(acked) + 200)
            repaired.set()
        closed = await w.close()
        assert acked == list(range(len(acked))) and closed.last_entry == acked[-1]
        assert SPARE not in closed.bookies
        await assert_every_copy_readable(client, w.ledger_id)
        r = await client.open(w.ledger_id, PASSWORD)
        assert [e.payload for e in await r.read(0, closed.last_entry)] == [b"w%d" % i for i in acked]

    try:
        run(cluster, scenario)
    finally:
        start(cluster, SPARE)


def test_a_lost_bookie_is_re_replicated_and_a_new_auditor_finishes(cluster: Cluster):
    """Closed ledgers on bookie 4 (one with HMAC digests), an idle open one whose last fragment is on it, and a writer
    appending when 4 is SIGKILLed for good; right after, the auditor's node is SIGKILLed too (and
    restarted: the cluster needs 3 bookies for E=3). Another auditor takes over, and within a
    bounded time every ledger is back to Qw copies on bookies its metadata names."""
    async def before(client: LedgerClient):
        closed = await closed_ledgers_on(client, SPARE, 4, 120)
        hmac = await ledger_on(client, SPARE, DigestType.HMAC_SHA256)  # copied unverified, checked by readers here
        await hmac.append_many([b"hmac-%d" % i for i in range(60)])
        await hmac.close()
        closed.append(hmac.ledger_id)
        idle = await ledger_on(client, SPARE)  # abandoned open: fenced and closed after the open grace
        await idle.append_many([b"idle-%d" % i for i in range(40)])
        return closed, idle.ledger_id

    closed, idle = run(cluster, before)
    auditor = auditor_node(cluster)

    async def during(client: LedgerClient):
        w = await ledger_on(client, SPARE)
        acked = await w.append_many([b"a%d" % i for i in range(200)])
        kill(cluster, SPARE)
        acked += await w.append_many([b"b%d" % i for i in range(200)])  # the writer replaces 4 itself
        await w.close()
        if auditor != SPARE:  # within the grace period: the next auditor must find 4 lost by itself
            kill(cluster, auditor)
        return w.ledger_id, acked

    written, acked = run(cluster, during)
    if auditor != SPARE:
        start(cluster, auditor)
    new_auditor = auditor_node(cluster)

    async def after(client: LedgerClient):
        await wait_replicated(client, [*closed, idle, written], SPARE)
        r = await client.open(written, PASSWORD)
        assert r.last_entry == 399 and len(acked) == 400
        assert (await client.open(idle, PASSWORD)).last_entry == 39

    try:
        run(cluster, after, timeout_s=58)
        assert auditor_node(cluster) not in (auditor, None) or auditor == SPARE, new_auditor
    finally:
        start(cluster, SPARE)


def test_decommissioning_a_live_bookie_leaves_no_ledger_on_it(cluster: Cluster):
    """`clusterctl bookie decommission 4` while 4 serves, first with AutoRecovery paused (its ledgers
    are marked, nothing moves, `recovery status` lists them), then resumed: its ledgers are copied off
    it, the command reports when nothing references it, and everything still reads."""
    ledgers = run(cluster, lambda client: closed_ledgers_on(client, SPARE, 3, 80))
    try:
        assert cluster.ctl("recovery", "pause").returncode == 0
        marked = cluster.ctl("bookie", "decommission", str(SPARE), "--no-wait")
        assert marked.returncode == 0 and "3 ledger(s) reference it" in marked.stdout, marked.stdout + marked.stderr
        time.sleep(2)
        status = json.loads(cluster.ctl("recovery", "status", "--json").stdout)
        assert status["paused"] and status["decommissioned"] == [SPARE]
        assert set(ledgers) <= {t["ledger_id"] for t in status["underreplicated"]}
        assert all(t["lost"] == [SPARE] for t in status["underreplicated"] if t["ledger_id"] in ledgers)
        assert cluster.ctl("recovery", "resume").returncode == 0
        done = cluster.ctl("bookie", "decommission", str(SPARE), "--timeout", "40", timeout=50)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "safe to remove" in done.stdout

        async def check(client: LedgerClient):
            for ledger_id in await client.list_ledgers():
                assert SPARE not in (await client.manager.read(ledger_id))[0].bookies, ledger_id
            for ledger_id in ledgers:
                await assert_every_copy_readable(client, ledger_id)

        run(cluster, check)
    finally:
        cluster.ctl("recovery", "resume")
        undo = cluster.ctl("bookie", "recommission", str(SPARE))
        assert undo.returncode == 0, undo.stderr


def test_the_replica_check_finds_missing_copies_on_a_live_bookie(cluster: Cluster):
    """A closed ledger whose entries 0, 5, 10, ... never reached bookie 2 (written by hand, as if
    the copies were lost after the ack quorum): the auditor's replica check marks bookie 2 damaged
    and a worker copies the missing entries back; the metadata is unchanged."""
    async def scenario(client: LedgerClient):
        draft = LedgerMetadata(0, 3, 2, 2, (Fragment(0, (1, 2, 3)),), DigestType.CRC32C,
                               password_key(PASSWORD, b"check"), 0, master_key=master_key(PASSWORD))
        metadata, version = await client.manager.create(draft)
        length, skipped = 0, 0
        for entry_id in range(30):
            payload = b"hand-%d" % entry_id
            length += len(payload)
            data = DIGESTER.package(metadata.ledger_id, entry_id, entry_id - 1, length, payload)
            for bookie in write_quorum(metadata.fragments[0].ensemble, entry_id, 2):
                if bookie == 2 and entry_id % 5 == 0:
                    skipped += 1
                    continue
                await client.pool.client(bookie).add(metadata.ledger_id, entry_id, master_key(PASSWORD), data)
        closed = metadata.closed(29, length)
        await client.manager.write(closed, version)
        assert skipped > 0
        while True:
            try:
                await assert_every_copy_readable(client, metadata.ledger_id)
                break
            except (NoSuchEntry, NoSuchLedger):
                await trio.sleep(0.5)
        assert (await client.manager.read(metadata.ledger_id))[0].fragments == closed.fragments
        while metadata.ledger_id in await _tasks(client.meta):
            await trio.sleep(0.1)

    run(cluster, scenario, timeout_s=40)


def test_a_bookie_back_after_the_grace_period_finishes_its_unrepairable_task(cluster: Cluster):
    """A ledger with E=Qw=Qa=1 on bookie 4 only. Bookie 4 stops past the grace period: its ledger is
    marked and every repair fails ("no readable replica": no other copy). Bookie 4 comes back with
    its disks: the worker taking the task again finds it registered, lost no more, and deletes the
    task; nothing was copied, the metadata is unchanged and every entry reads back from bookie 4."""
    async def write(client: LedgerClient):
        while True:
            w = await client.create(1, 1, 1, DigestType.CRC32C, password=PASSWORD)
            if w.metadata.last_fragment.ensemble == (SPARE,):
                break
            await w.close()
            await client.delete(w.ledger_id)
        await w.append_many([b"only-%d" % i for i in range(30)])
        await w.close()
        return await client.manager.read(w.ledger_id), w.ledger_id

    closed, ledger_id = run(cluster, write)
    before = copied_entries(cluster, others_than=SPARE)  # bookie 4's count starts again at its restart
    kill(cluster, SPARE, signal.SIGTERM)

    async def wait_stuck(client: LedgerClient):
        while True:
            found = await read_task(client.meta, ledger_id)
            if found is not None and "no readable replica" in (found[0].error or ""):
                return found[0]
            await trio.sleep(0.1)

    try:
        stuck = run(cluster, wait_stuck, timeout_s=40)
        assert stuck.lost == {SPARE}
        while localcluster.running_pid(cluster.config.node(SPARE)) is not None:
            time.sleep(0.05)
        start(cluster, SPARE)

        async def finished(client: LedgerClient):
            while ledger_id in await _tasks(client.meta):
                await trio.sleep(0.1)
            assert await client.manager.read(ledger_id) == closed  # same metadata, same version
            r = await client.open(ledger_id, PASSWORD)
            assert [e.payload for e in await r.read(0, 29)] == [b"only-%d" % i for i in range(30)]
            await client.delete(ledger_id)  # the verifier below wants no ledger left on bookie 4

        run(cluster, finished, timeout_s=50)
    finally:
        if localcluster.running_pid(cluster.config.node(SPARE)) is None:
            start(cluster, SPARE)
    statuses = trio.run(localcluster.fetch_statuses, cluster.config)
    assert sum(s["bookie"]["autorecovery"]["worker"].get("lost_bookies_back", 0) for s in statuses.values() if s)
    assert copied_entries(cluster, others_than=SPARE) == before and copied_entries(cluster) == before


def test_verify_ledgers_passes_once_every_repair_is_done(cluster: Cluster, spark):
    """Last in the module: with the cluster stopped, the Spark ledger verifier (what `clusterctl
    verify ledgers` runs, here on the test session's shared Spark) reads every bookie's files
    against the metadata: every entry of every ledger the tests wrote, lost bookies, drains and
    refills included, is held with a valid digest by all Qw bookies of its write set."""
    async def nothing_left(client: LedgerClient):
        while await _tasks(client.meta):
            await trio.sleep(0.2)
        for ledger_id in await client.list_ledgers():
            metadata = (await client.manager.read(ledger_id))[0]
            assert metadata.is_closed and SPARE not in metadata.bookies, metadata

    run(cluster, nothing_left, timeout_s=30)
    down = cluster.ctl("down", "--timeout", "10")
    assert down.returncode == 0, down.stderr
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # The dirs `clusterctl verify ledgers` uses: the ensemble's (bookies 1-3; no ledger is on 4 any more).
    verdict = verify(parser.parse_args([f"{n.data_dir}={n.id}" for n in cluster.config.ensemble]))
    assert verdict.passed, verdict.to_json()
    assert verdict.facts["ledgers"] >= 10, verdict.facts
    notes = [n for c in verdict.checks for n in c.notes]
    assert not [n for n in notes if "under-replicated" in n], notes
