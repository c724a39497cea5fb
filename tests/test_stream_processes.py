"""Named logs (stream/) on a real 3-node cluster on loopback: writes read back in order and once,
a takeover fences the last owner, segments roll under a tailing reader, truncation and
subscriptions. The writers and readers run in this process, each on a metastore session of its
own, so that closing a session is a writer losing its ownership as a crash would."""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from bookie.client import BookiePool
from bookie.errors import NoSuchLedger
from clusterd import localcluster
from cluster_fixtures import Cluster, copy_config, start_cluster, wait_for, with_quick_bookie_gc
from stream_fixtures import READER, WRITER, acks_of, records_of, spawn
from ledger.client import LedgerClient
from metastore.client import MetaClient
from stream.errors import LogExists, LogFenced, LogNotFound, OwnershipTaken, PositionTruncated
from stream.log_metadata import LogSettings
from stream.namespace import Namespace
from stream.position import Position

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = start_cluster(Cluster(with_quick_bookie_gc(copy_config(tmp_path_factory.mktemp("streams")))), timeout=120)
    yield c
    c.down()  # SIGCONTs any node first


def run(cluster: Cluster, scenario, timeout_s: float = 90) -> object:
    """`await scenario(open_namespace)`; `open_namespace()` is an async context manager giving a
    Namespace on a metastore session and bookie pool of its own."""
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
            batches = [b async for b in ns.reader("orders", many[10], follow=False).batches()]
            assert [r for b in batches for r in b.records()] == await read_all(ns, "orders", many[10])
            assert len(batches) < 490 and batches[0].first_slot == many[10].slot  # entries, not records
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


def collect(process) -> list[str]:
    """The process's stdout lines, gathered by a thread as they come."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True).start()
    return lines


def create_log(cluster: Cluster, name: str, settings: LogSettings | None = None) -> None:
    async def scenario(open_namespace):
        async with open_namespace() as ns:
            await ns.create(name, settings)
    run(cluster, scenario)


def read_back(cluster: Cluster, name: str) -> list:
    async def scenario(open_namespace):
        async with open_namespace() as ns:
            return await read_all(ns, name)
    return run(cluster, scenario)  # type: ignore[return-value]


def test_a_writer_sigkilled_mid_stream_is_replaced_and_tailing_readers_see_every_acknowledged_record_once(cluster):
    """Three reader processes tail the log from before the first write and never restart; writer
    A is SIGKILLed at a random point of a stream that rolls segments; writer B takes over once A's
    session has expired, writes 200 more and ends with END. Each reader must read the same records:
    every one acknowledged to A or B, in order, none twice."""
    name = "sigkilled"
    create_log(cluster, name, LogSettings(roll_bytes=100, max_entry_bytes=1024))  # a roll every 100 records of 1 B
    readers = [spawn(cluster, READER, name) for _ in range(3)]
    reader_lines = [collect(r) for r in readers]
    a = b = None
    try:
        assert wait_for(lambda: all(lines for lines in reader_lines), 30), "the readers did not start"
        a = spawn(cluster, WRITER, name, "1000000", "2000", "a")
        a_lines = collect(a)
        target = random.Random(7).randrange(200, 800)
        assert wait_for(lambda: len(acks_of(a_lines)) >= target, 60), "".join(a_lines) + a.stderr.read()
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=10)
        b = spawn(cluster, WRITER, name, "200", "4000", "b")
        b_lines = collect(b)
        assert b.wait(timeout=60) == 0, b.stderr.read()
        for r in readers:
            r.wait(timeout=60)
    finally:
        for p in [*readers, a, b]:
            if p is not None and p.poll() is None:
                p.kill()
    acked = acks_of(a_lines) + acks_of(b_lines)
    owned = [line for line in b_lines if line.startswith("OWNED")]
    recovered_last = int(owned[0].split()[1])
    assert recovered_last >= acks_of(a_lines)[-1]  # nothing acknowledged to A was lost by the recovery
    seen = [records_of("".join(lines)) for lines in reader_lines]
    assert seen[0] == seen[1] == seen[2]
    txids = [t for t, _, _ in seen[0]]
    assert txids == list(range(0, recovered_last + 201)), "every record once, in order (txids from 0)"
    assert set(acked) <= set(txids)
    assert [p for _, _, p in seen[0]] == ["a"] * (recovered_last + 1) + ["b"] * 199 + ["END"]
    assert [r.txid for r in read_back(cluster, name)] == txids
    assert len({pos.split(":")[0] for _, pos, _ in seen[0]}) > 3  # the stream rolled segments under the readers


def test_a_writer_paused_past_its_ownership_is_fenced_and_nothing_it_writes_then_is_visible(cluster):
    """Writer A (1.5 s sessions) is SIGSTOPped; B takes over after A's session expired and writes;
    A resumed fails as fenced, and the log holds A's records only up to where B's recovery closed
    A's segment: every record A had acknowledged, then B's."""
    name = "paused"
    create_log(cluster, name)
    a = spawn(cluster, WRITER, name, "1000000", "1500", "a")
    a_lines = collect(a)
    b = None
    try:
        assert wait_for(lambda: len(acks_of(a_lines)) >= 50, 60), "".join(a_lines) + a.stderr.read()
        os.kill(a.pid, signal.SIGSTOP)
        acked_before_pause = acks_of(list(a_lines))
        b = spawn(cluster, WRITER, name, "100", "4000", "b")
        b_lines = collect(b)
        assert b.wait(timeout=60) == 0, b.stderr.read()
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=30) == 3, a.stderr.read()
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    assert any(line.startswith("FENCED") for line in a_lines)
    recovered_last = int(next(line for line in b_lines if line.startswith("OWNED")).split()[1])
    records = read_back(cluster, name)
    a_txids = [r.txid for r in records if r.payload == b"a"]
    assert a_txids == list(range(0, recovered_last + 1))
    assert set(acks_of(a_lines)) <= set(a_txids) and set(acked_before_pause) <= set(a_txids)
    assert [r.payload for r in records[recovered_last + 1:]] == [b"b"] * 99 + [b"END"]


def test_clusterctl_log_commands(cluster):
    """create, append, tail (from a position, a txid, following), stat, truncate, ls, delete, and usage errors."""
    import json

    def ctl(*args: str, status: int = 0) -> str:
        done = cluster.ctl("log", *args)
        assert done.returncode == status, done.stdout + done.stderr
        return done.stdout if status == 0 else done.stderr

    ctl("create", "cli", "--roll-bytes", "64", "-A", "2")
    assert "exists" in ctl("create", "cli", status=1)
    first = json.loads(ctl("append", "cli", "one", "two", "--json"))
    assert first["first_txid"] == 0 and first["positions"][0] == "1:0:0"
    ctl("append", "cli", "three", "--txid", "10")
    assert "TxidOutOfOrder" in ctl("append", "cli", "four", "--txid", "10", status=1)
    lines = [json.loads(line) for line in ctl("tail", "cli", "--json").splitlines()]
    assert [(r["txid"], r["data"]) for r in lines] == [(0, "one"), (1, "two"), (10, "three")]
    assert [line.split("\t")[1:] for line in ctl("tail", "cli", "--txid", "1").splitlines()] == [["1", "two"], ["10", "three"]]
    third = lines[2]["position"]
    assert ctl("tail", "cli", "--from", third).split("\t")[2].strip() == "three"
    stat = json.loads(ctl("stat", "cli", "--json"))
    # The refused append left its (empty) segment in progress, as a writer that fails does: the next owner recovers it.
    assert [s["state"] for s in stat["segments"]] == ["completed", "completed", "in_progress"] and stat["epoch"] == 3
    assert "truncated before" in ctl("truncate", "cli", third)
    assert [json.loads(line)["txid"] for line in ctl("tail", "cli", "--json").splitlines()] == [10]
    assert "cli" in json.loads(ctl("ls", "--json"))
    assert "segment:entry:slot" in ctl("tail", "cli", "--from", "x", status=2)
    assert "LogNotFound" in ctl("stat", "missing", status=1)
    ctl("delete", "cli")
    assert "cli" not in json.loads(ctl("ls", "--json"))


def test_a_reader_sigkilled_resumes_after_its_subscriptions_position(cluster):
    """A reader process commits its subscription every 37 records and is SIGKILLed; a new one with
    the same subscription starts right after the last committed position and reads on to the end."""
    name = "subscribed"
    create_log(cluster, name, LogSettings(roll_bytes=2048, max_entry_bytes=512))

    async def write(open_namespace):
        async with open_namespace() as ns, ns.writer(name) as w:
            await w.write_many((t, b"r" * 10) for t in range(1, 600))  # three segments or more
            await w.write(600, b"END")
    run(cluster, write)
    first = spawn(cluster, READER, name, "audit", "37")
    first_lines = collect(first)
    try:
        assert wait_for(lambda: sum(line.startswith("COMMITTED") for line in first_lines) >= 5, 60)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    committed = [line.split()[1] for line in first_lines if line.startswith("COMMITTED")][-1]
    second = spawn(cluster, READER, name, "audit", "37")
    second_lines = collect(second)
    assert second.wait(timeout=60) == 0, second.stderr.read()
    before = records_of("".join(first_lines))
    after = records_of("".join(second_lines))
    at = next(i for i, (_, position, _) in enumerate(before) if position == committed)
    full = records_of("".join(read_lines(cluster, name)))
    start = full.index(after[0])
    assert after == full[start:] and after[-1][2] == "END"  # from there to the end, nothing skipped
    # Right after a committed position: the last one it printed, or one it stored and was killed
    # before printing (a commit every 37 records read).
    assert start >= at + 1 and start % 37 == 0, (start, at)
    assert len({position.split(":")[0] for _, position, _ in full}) >= 3


def read_lines(cluster: Cluster, name: str) -> list[str]:
    return [f"REC {r.txid} {r.position} {r.payload.decode()}\n" for r in read_back(cluster, name)]


def test_truncation_deletes_whole_segments_and_the_bookies_reclaim_their_space(cluster):
    name = "reclaimed"
    create_log(cluster, name, LogSettings(roll_bytes=20_000, max_entry_bytes=4096))

    async def scenario(open_namespace):
        async with open_namespace() as ns:
            async with ns.writer(name) as w:
                await w.write_many((t, bytes(500)) for t in range(1, 401))  # 200 KB: ten segments
            listing = await ns.read(name)
            cut = Position(listing.segments[-2].seq, 0, 0)
            after = await ns.truncate(name, cut)
            gone = [s.ledger_id for s in listing.segments if s.seq < cut.segment]
            assert len(gone) >= 5 and [s.seq for s in after.segments] == [cut.segment, cut.segment + 1]
            assert [r.txid for r in await read_all(ns, name)] == [t for t in range(1, 401)][-sum(
                s.records for s in after.segments):]
            pool = ns.ledgers.pool
            pool.update(cluster.config.bookie_addresses())
            with trio.fail_after(30):
                for bookie in (1, 2, 3):
                    for ledger_id in gone:
                        while True:
                            try:
                                await pool.client(bookie).read(ledger_id, 0)
                            except NoSuchLedger:
                                break
                            await trio.sleep(0.1)
            with trio.move_on_after(30):
                while True:
                    statuses = await localcluster.fetch_statuses(cluster.config)
                    gc = {i: s["bookie"]["gc"] for i, s in statuses.items()}
                    if all(g["ledgers_deleted"] >= len(gone) and g["bytes_freed"] > 0 for g in gc.values()):
                        break
                    await trio.sleep(0.1)
            assert all(g["ledgers_deleted"] >= len(gone) and g["bytes_freed"] > 0 for g in gc.values()), gc
    run(cluster, scenario)


def test_retention_by_size_is_applied_by_the_writer_as_its_segments_roll(cluster):
    name = "retained"
    create_log(cluster, name, LogSettings(roll_bytes=2_000, retention_bytes=5_000))

    async def scenario(open_namespace):
        async with open_namespace() as ns:
            async with ns.writer(name) as w:
                for t in range(1, 201):  # 20 KB in entries of one record: about ten rolls
                    await w.write(t, bytes(100))
            with trio.fail_after(30):
                while True:  # retention runs beside the writer, after each roll: the segment the
                    listing = await ns.read(name)  # close completed came after the last one
                    if sum(s.bytes for s in listing.segments) <= 5_000 + 2_100 and listing.segments[0].seq > 3:
                        break
                    await trio.sleep(0.1)
            assert listing.segments[0].seq > 3 and listing.log.truncated_before == Position(listing.segments[0].seq, 0, 0)
            kept = [r.txid for r in await read_all(ns, name)]
            assert kept == list(range(201 - len(kept), 201)) and 0 < len(kept) <= 71
    run(cluster, scenario)
