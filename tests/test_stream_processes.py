"""Named logs (stream/) on a real 3-node cluster on loopback: writes read back in order and once,
a takeover fences the last owner, segments roll under a tailing reader, truncation and
subscriptions. The writers and readers run in this process, each on a metastore session of its
own, so that closing a session is a writer losing its ownership as a crash would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from bookie.client import BookiePool
from cluster_fixtures import Cluster, copy_config
from ledger.client import LedgerClient
from metastore.client import MetaClient
from stream.errors import LogExists, LogFenced, LogNotFound, OwnershipTaken, PositionTruncated
from stream.log_metadata import LogSettings
from stream.namespace import Namespace
from stream.position import Position

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(copy_config(tmp_path_factory.mktemp("streams")))
    up = c.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield c
    c.ctl("down", "--timeout", "5")


def run(cluster: Cluster, scenario, timeout_s: float = 90) -> object:
    """`await scenario(open_namespace)`; `open_namespace()` is an async context manager giving a
    Namespace on a metastore session and bookie pool of its own."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def open_namespace():
        async with MetaClient(cluster.config.client_addresses(), session_timeout_ms=4000) as meta, \
                BookiePool(timeout_s=3.0) as pool, LedgerClient(meta, pool) as ledgers:
            yield Namespace(meta, ledgers)

    async def main():
        with trio.fail_after(timeout_s):
            return await scenario(open_namespace)
    return trio.run(main)


async def read_all(ns: Namespace, name: str, start: Position | None = None) -> list:
    return [r async for r in ns.reader(name, start, follow=False)]


def test_records_read_back_in_order_once_and_a_clean_close_leaves_no_segment_in_progress(cluster):
    async def scenario(open_namespace):
        async with open_namespace() as ns:
            await ns.create("orders")
            with pytest.raises(LogExists):
                await ns.create("orders")
            async with ns.writer("orders") as w:
                first = await w.write(1, b"one")
                many = await w.write_many((txid, b"r%d" % txid) for txid in range(2, 502))
                assert first == Position(1, 0, 0) and many[-1] > many[0] > first
                assert await w.flush() == many[-1]
            records = await read_all(ns, "orders")
            assert [r.txid for r in records] == list(range(1, 502))
            assert [r.payload for r in records[:3]] == [b"one", b"r2", b"r3"]
            assert [r.position for r in records] == sorted({r.position for r in records})
            listing = await ns.read("orders")
            assert listing.in_progress is None and listing.segments[0].records == 501
            assert "orders" in await ns.list()
            from_txid = [r async for r in ns.reader("orders", txid=400, follow=False)]
            assert [r.txid for r in from_txid] == list(range(400, 502))
            assert [r.txid for r in await read_all(ns, "orders", many[10])] == list(range(12, 502))
            with pytest.raises(LogNotFound):
                await ns.read("nothing")
    run(cluster, scenario)


def test_a_new_owner_fences_the_last_one_and_readers_see_every_acknowledged_record_once(cluster):
    async def scenario(open_namespace):
        async with open_namespace() as ns:
            await ns.create("takeover")
            old_session = open_namespace()
            old_ns = await old_session.__aenter__()
            old = old_ns.writer("takeover")
            await old.__aenter__()
            for txid in range(1, 101):
                assert (await old.write(txid, b"old")).segment == 1
            with pytest.raises(OwnershipTaken):
                async with ns.writer("takeover"):
                    pass
            # The old owner's session ends (as a crash would end it): its ownership goes, its segment stays open.
            await old_ns.meta.close()
            async with ns.writer("takeover", wait=True) as new:
                assert (await new.write(101, b"new")).segment == 2
                with pytest.raises(LogFenced, match="another writer"):
                    await old.write(102, b"deposed")
                with pytest.raises(LogFenced):
                    await old.write(103, b"deposed again")
                await new.write_many((t, b"new") for t in range(102, 201))
            for leave in (lambda: old.__aexit__(LogFenced, LogFenced("deposed"), None),
                          lambda: old_session.__aexit__(None, None, None)):
                try:
                    await leave()
                except Exception:
                    pass  # its session is gone: releasing its ownership and closing it fail, as a crash's would
            records = await read_all(ns, "takeover")
            assert [r.txid for r in records] == list(range(1, 201))
            assert all(r.payload == b"old" for r in records[:100]) and all(r.payload == b"new" for r in records[100:])
            listing = await ns.read("takeover")
            assert [(s.seq, s.records) for s in listing.segments] == [(1, 100), (2, 100)]
            assert listing.log.epoch == 2
    run(cluster, scenario)


def test_segments_roll_under_a_tailing_reader_truncation_and_subscriptions(cluster):
    async def scenario(open_namespace):
        async with open_namespace() as ns:
            await ns.create("rolling", LogSettings(roll_bytes=3000, max_entry_bytes=1024))
            seen = []

            async def tail(task_status=trio.TASK_STATUS_IGNORED):
                async with open_namespace() as reader_ns:
                    task_status.started()
                    async for record in reader_ns.reader("rolling"):
                        seen.append(record)
                        if record.txid == 400:
                            return

            async with trio.open_nursery() as nursery:
                await nursery.start(tail)
                async with ns.writer("rolling") as w:
                    for txid in range(1, 401):
                        await w.write(txid, bytes(50))
            assert [r.txid for r in seen] == list(range(1, 401))
            listing = await ns.read("rolling")
            assert len(listing.segments) >= 5 and listing.in_progress is None
            cut = seen[250].position
            await ns.commit("rolling", "billing", seen[99].position)
            resumed = [r async for r in ns.reader("rolling", subscription="billing", follow=False)]
            assert [r.txid for r in resumed] == list(range(101, 401))
            await ns.truncate("rolling", cut)
            after = await ns.read("rolling")
            assert after.segments[0].seq == cut.segment and after.log.truncated_before == cut
            assert [r.txid for r in await read_all(ns, "rolling")] == list(range(251, 401))
            with pytest.raises(PositionTruncated):
                await read_all(ns, "rolling", seen[0].position)
            gone = {s.ledger_id for s in listing.segments} - {s.ledger_id for s in after.segments}
            assert gone and not gone & set(await ns.ledgers.list_ledgers())
            await ns.delete("rolling")
            assert "rolling" not in await ns.list()
    run(cluster, scenario, timeout_s=120)
