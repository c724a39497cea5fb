"""The ledger SDK edge (ledger/client.py, handles.py, driver.py) over real bookies on loopback.

Real BookieServices on real BookieStorage in temporary directories; the metadata lives in an
in-memory versioned register with LedgerManager's interface (the metastore-backed manager is tested
by its own tests and the multi-process ones). Stories: pipelined appends read back with digests
checked; a tailing reader sees entries as they are confirmed; a bookie dies during appends and the
writer changes ensemble; a second client recovers the ledger and the first one's next append is
fenced; a wrong password is refused.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from bookie_fixtures import trio_test
from ledger.client_sync import SyncLedgerClient
from ledger.errors import LedgerFenced, OutcomeUnknown, WrongPassword
from ledger_fixtures import MemoryManager, NoRegistrations, bookies, ledger_client


@trio_test
async def test_pipelined_appends_close_and_read_back(tmp_path):
    with trio.fail_after(30):
        async with bookies(tmp_path, 3) as services, ledger_client(services, MemoryManager()) as client:
            w = await client.create(3, 2, 2, password=b"pw")
            ids = await w.append_many([b"entry %d" % i for i in range(2000)])
            assert ids == list(range(2000)) and w.lac == 1999
            closed = await w.close()
            assert closed.last_entry == 1999
            r = await client.open(w.ledger_id, b"pw")
            assert r.last_entry == 1999
            entries = await r.read(0, 1999)
            assert [e.payload for e in entries] == [b"entry %d" % i for i in range(2000)]


async def tail_into(reader, seen: list[bytes]) -> None:
    async for entry in reader.tail(0):
        seen.append(entry.payload)


@trio_test
async def test_a_tailing_reader_sees_entries_as_they_are_confirmed(tmp_path):
    with trio.fail_after(30):
        manager = MemoryManager()
        async with bookies(tmp_path, 3) as services, ledger_client(services, manager, long_poll_ms=200) as client:
            w = await client.create(3, 3, 2, password=b"pw")
            r = await client.open(w.ledger_id, b"pw")
            seen: list[bytes] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tail_into, r, seen)
                for i in range(20):
                    await w.append(b"t%d" % i)
                with trio.fail_after(5):
                    while len(seen) < 20:
                        await trio.sleep(0.01)
                await w.close()
            assert seen == [b"t%d" % i for i in range(20)]


@trio_test
async def test_a_tailing_reader_takes_each_entry_from_the_long_poll_answer_without_a_read(tmp_path):
    """Appends awaited one at a time, each seen by the reader before the next: the writer's explicit LAC
    goes out with the ack, the long poll answers with the entry (Qw = Qa: every replica has it), and
    the handle delivers it from that answer: no READ reaches any bookie."""
    with trio.fail_after(30):
        async with bookies(tmp_path, 3) as services, ledger_client(services, MemoryManager()) as client:
            w = await client.create(3, 3, 3, password=b"pw")
            r = await client.open(w.ledger_id, b"pw")
            seen: list[bytes] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tail_into, r, seen)
                for i in range(10):
                    await w.append(b"t%d" % i)
                    while len(seen) <= i:
                        await trio.sleep(0.001)
                await w.close()
            assert seen == [b"t%d" % i for i in range(10)]
            assert sum(s.stats["reads"] for s, _ in services.values()) == 0
            assert sum(s.stats["long_polls"] for s, _ in services.values()) >= 10


@trio_test
async def test_a_quiet_writer_sends_one_explicit_lac_per_append_and_never_more(tmp_path):
    """The driver answers the writer's RequestIdle once the application had its turn: an application
    that pauses after each append gets one explicit LAC round per append (long polls answer at once);
    one that appends back to back never gets more rounds than appends (its adds carry the LAC)."""
    with trio.fail_after(30):
        async with bookies(tmp_path, 3) as services, ledger_client(services, MemoryManager()) as client:
            def write_lacs() -> int:
                return sum(s.stats["requests"] - s.stats["adds"] for s, _ in services.values())

            w = await client.create(3, 3, 3, password=b"pw")
            for i in range(5):
                await w.append(b"quiet %d" % i)
                await trio.testing.wait_all_tasks_blocked()
                assert write_lacs() == 3 * (i + 1)
            for i in range(20):
                await w.append(b"busy %d" % i)
            await trio.testing.wait_all_tasks_blocked()
            assert write_lacs() <= 3 * 25
            assert await (await client.open(w.ledger_id, b"pw")).read_lac() == 24


@trio_test
async def test_a_bookie_dies_during_appends_and_the_writer_changes_ensemble(tmp_path):
    """Qa = Qw: no entry after the death can be acknowledged without the change. (With Qa < Qw the two
    live bookies may acknowledge every append before the dead one's failure is seen, and the writer
    rightly closes on the old ensemble: that race made this story flaky.)"""
    with trio.fail_after(30):
        async with bookies(tmp_path, 4) as services, ledger_client(services, MemoryManager()) as client:
            w = await client.create(3, 3, 3, password=b"pw")
            first = await w.append_many([b"a%d" % i for i in range(100)])
            victim = w.metadata.last_fragment.ensemble[1]
            services[victim][1].cancel()
            more = await w.append_many([b"b%d" % i for i in range(100)])
            assert first + more == list(range(200))
            await w.close()
            assert victim not in w.metadata.last_fragment.ensemble and len(w.metadata.fragments) == 2
            r = await client.open(w.ledger_id, b"pw")
            assert len(await r.read(0, 199)) == 200


@trio_test
async def test_recovery_by_another_client_fences_the_writer(tmp_path):
    with trio.fail_after(30):
        manager = MemoryManager()
        async with bookies(tmp_path, 3) as services, ledger_client(services, manager) as c1, \
                ledger_client(services, manager) as c2:
            w = await c1.create(3, 3, 2, password=b"pw")
            await w.append_many([b"x%d" % i for i in range(50)])
            r = await c2.open(w.ledger_id, b"pw", recover=True)
            assert r.is_closed and r.last_entry == 49
            with pytest.raises(LedgerFenced) as failure:
                await w.append(b"too late")
            assert isinstance(failure.value, OutcomeUnknown)
            assert [e.payload for e in await r.read(48, 49)] == [b"x48", b"x49"]


@trio_test
async def test_wrong_password_is_refused(tmp_path):
    with trio.fail_after(30):
        async with bookies(tmp_path, 3) as services, ledger_client(services, MemoryManager()) as client:
            w = await client.create(3, 3, 2, password=b"right")
            await w.append(b"x")
            with pytest.raises(WrongPassword):
                await client.open(w.ledger_id, b"wrong")


@trio_test
async def test_the_synchronous_facade(tmp_path):
    @asynccontextmanager
    async def no_metastore():
        yield NoRegistrations()

    def story(addresses):
        with SyncLedgerClient([], addresses, manager=MemoryManager(), meta_factory=no_metastore) as ledgers:
            w = ledgers.create(3, 2, 2, password=b"pw")
            assert w.append(b"first") == 0
            assert w.append_many([b"second", b"third"]) == [1, 2]
            assert w.close().last_entry == 2
            r = ledgers.open(w.ledger_id, b"pw")
            assert [e.payload for e in r.tail(1)] == [b"second", b"third"]
            assert ledgers.list_ledgers() == [w.ledger_id]

    with trio.fail_after(30):
        async with bookies(tmp_path, 3) as services:
            addresses = {b: ("127.0.0.1", s.port) for b, (s, _) in services.items()}
            await trio.to_thread.run_sync(story, addresses)
