"""The bookie client's own behaviour (bookie/client.py): connecting, failing fast, pools,
write-quorum adds, and what it does with a bookie that misbehaves.

Real loopback sockets: a real BookieService on a real BookieStorage, or, for
misbehaviour, a tiny raw server that answers with bytes of the test's choosing.
"""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing

from bookie import protocol as P
from bookie.client import BookieClient, BookiePool, Completions
from bookie.entry import Digester, DigestType, master_key
from bookie.errors import BookieUnavailable, LedgerFenced
from bookie.registration import BookieInfo
from bookie.service import BookieService
from bookie_fixtures import open_storage, trio_test
from clusterd.localcluster import free_ports

KEY = master_key(b"pw")
DIGESTER = Digester(DigestType.CRC32C, b"pw")


def entry(ledger: int, entry_id: int) -> bytes:
    return DIGESTER.package(ledger, entry_id, entry_id - 1, entry_id + 1, b"payload %d" % entry_id)


async def start_bookies(nursery: trio.Nursery, tmp_path, count: int) -> dict[int, tuple[str, int]]:
    addresses = {}
    for b in range(1, count + 1):
        storage = await nursery.start(_storage_task, tmp_path / f"b{b}", b)
        service = BookieService(storage, "127.0.0.1", 0)
        await nursery.start(service.run)
        addresses[b] = ("127.0.0.1", service.port)
    return addresses


async def _storage_task(directory, bookie_id, *, task_status=trio.TASK_STATUS_IGNORED):
    async with open_storage(directory, bookie_id) as storage:
        task_status.started(storage)
        await trio.sleep_forever()


async def raw_server(nursery: trio.Nursery, answer) -> int:
    """A server that feeds each connection's frames to answer(body) and sends back what it returns."""
    async def handle(stream):
        splitter = P.FrameSplitter(1 << 20)
        async with stream:
            while data := await stream.receive_some(65536):
                for body in splitter.feed(data):
                    await stream.send_all(answer(body))
    [listener] = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return listener.socket.getsockname()[1]


@trio_test
async def test_a_write_quorum_add_goes_to_every_bookie_and_completions_say_which(tmp_path):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            addresses = await start_bookies(nursery, tmp_path, 3)
            async with BookiePool(addresses) as pool:
                sink = Completions()
                for entry_id in range(100):
                    pool.start_add([1, 2, 3], 5, entry_id, KEY, entry(5, entry_id), tag=entry_id, sink=sink)
                done = []
                while len(done) < 300:
                    done += await sink.get()
                assert all(p.error is None and p.outcome() is None for p in done)
                assert sorted((p.tag, p.client.bookie_id) for p in done) == \
                    [(e, b) for e in range(100) for b in (1, 2, 3)]
                lacs = [await pool.client(b).read_lac(5) for b in (1, 2, 3)]
                assert lacs == [98, 98, 98]
                # Fencing on one bookie refuses the writer there only (recovery's job is the rest).
                assert await pool.client(2).fence(5, KEY) == 98
                outcomes = pool.start_add([1, 2, 3], 5, 100, KEY, entry(5, 100))
                for p in outcomes:
                    try:
                        await p.result()
                    except LedgerFenced:
                        assert p.client.bookie_id == 2
                assert [p.error is not None for p in outcomes] == [False, True, False]
            nursery.cancel_scope.cancel()


@trio_test
async def test_an_unreachable_bookie_fails_fast_then_is_reconnected_once_it_is_up(tmp_path):
    [port] = free_ports(1)
    with trio.fail_after(20):
        async with BookieClient("127.0.0.1", port) as c:
            with pytest.raises(BookieUnavailable, match="cannot connect"):
                await c.read_lac(1)
            start = trio.current_time()
            with pytest.raises(BookieUnavailable, match="unreachable"):  # within the backoff: no new attempt
                await c.read_lac(1)
            assert trio.current_time() - start < 0.01
            assert c.stats["connect_failures"] == 1 and c.stats["fast_failures"] == 1
            async with open_storage(tmp_path) as storage, trio.open_nursery() as nursery:
                await nursery.start(BookieService(storage, "127.0.0.1", port).run)
                await trio.sleep(0.1)  # the first backoff is 50 ms
                await c.add(1, 0, KEY, entry(1, 0))
                assert c.connected and await c.read_lac(1) == -1
                nursery.cancel_scope.cancel()


@trio_test
async def test_the_pool_knows_only_registered_bookies_and_renews_a_moved_one(tmp_path):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            addresses = await start_bookies(nursery, tmp_path, 2)
            async with BookiePool() as pool:
                with pytest.raises(BookieUnavailable, match="bookie 1 is not registered"):
                    pool.client(1)
                pool.update([BookieInfo(1, *addresses[1]), BookieInfo(2, *addresses[2])])
                first = pool.client(1)
                await first.add(3, 0, KEY, entry(3, 0))
                pool.update({1: addresses[2], 2: addresses[2]})  # bookie 1 "moved"
                assert pool.client(1) is not first
                assert (pool.client(1).host, pool.client(1).port) == addresses[2]
                with pytest.raises(BookieUnavailable):
                    await first.read_lac(3)  # the old client was closed
                assert pool.bookies == [1, 2]
            nursery.cancel_scope.cancel()


@trio_test
async def test_an_answer_of_the_wrong_kind_breaks_the_connection_and_fails_what_was_pending():
    def answer(body: bytes) -> bytes:
        req = P.decode_request(body)
        if isinstance(req, P.ReadLac):  # answer a READ_LAC as if it were an ADD
            return P.encode_response(P.Response(req.request_id, P.Kind.ADD, P.Status.OK, req.ledger_id, 0))
        return b""

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await raw_server(nursery, answer)
            async with BookieClient("127.0.0.1", port) as c:
                poll = c.start_long_poll(1, 0, 10_000)
                with pytest.raises(BookieUnavailable, match="protocol violation"):
                    await c.read_lac(1)
                with pytest.raises(BookieUnavailable, match="outcome is unknown"):
                    await poll.result()
            nursery.cancel_scope.cancel()


@trio_test
async def test_garbage_from_the_bookie_fails_pending_requests_without_crashing_the_client():
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await raw_server(nursery, lambda body: b"\x00\x00\x00\x03garbage")
            async with BookieClient("127.0.0.1", port) as c:
                with pytest.raises(BookieUnavailable, match="bad frame from the bookie"):
                    await c.read_lac(1)
            nursery.cancel_scope.cancel()


@trio_test
async def test_a_closed_client_refuses_new_requests_and_fails_pending_ones(tmp_path):
    with trio.fail_after(10):
        async with open_storage(tmp_path) as storage, trio.open_nursery() as nursery:
            service = BookieService(storage, "127.0.0.1", 0)
            await nursery.start(service.run)
            async with BookieClient("127.0.0.1", service.port) as c:
                poll = c.start_long_poll(1, 5, 10_000)
                await c.aclose()
                with pytest.raises(BookieUnavailable, match="closed"):
                    await poll.result()
                with pytest.raises(BookieUnavailable, match="not running"):
                    await c.read_lac(1)
            nursery.cancel_scope.cancel()


@trio_test
async def test_answers_of_one_read_reach_the_sink_in_the_order_they_came():
    """Successful ADDs of one socket read are handed to their sink together; an answer of another
    kind, or a failed add, between them keeps its place (a writer must see an ack before a later
    FENCED, or it would fail an entry that a bookie acknowledged first)."""
    count = 12

    async def handle(stream):
        splitter = P.FrameSplitter(1 << 20)
        requests = []
        async with stream:
            while len(requests) < count and (data := await stream.receive_some(65536)):
                requests += [P.decode_request(body) for body in splitter.feed(data)]
            answers = []
            for req in reversed(requests):  # out of order, all in one send
                if isinstance(req, P.ReadLac):
                    answers.append(P.Response(req.request_id, P.Kind.READ_LAC, P.Status.OK, req.ledger_id, lac=41))
                elif req.entry_id == 5:
                    answers.append(P.Response(req.request_id, P.Kind.ADD, P.Status.FENCED, req.ledger_id, 5))
                else:
                    answers.append(P.Response(req.request_id, P.Kind.ADD, P.Status.OK, req.ledger_id, req.entry_id))
            await stream.send_all(b"".join(P.encode_response(a) for a in answers))
            await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            async with BookieClient("127.0.0.1", port) as c:
                sink = Completions()
                sent = []
                for e in range(count - 1):
                    sent.append(c.start_add(7, e, KEY, entry(7, e), tag=("add", e), sink=sink))
                    if e == 8:
                        sent.append(c.start_read_lac(7, tag=("lac", None), sink=sink))
                got = []
                while len(got) < count:
                    got += await sink.get()
                assert [p.tag for p in got] == [p.tag for p in reversed(sent)]
                for p in got:
                    if p.tag == ("add", 5):
                        assert isinstance(p.error, LedgerFenced)
                    elif p.tag[0] == "lac":
                        assert p.outcome() == 41
                    else:
                        assert p.error is None and p.outcome() is None
            nursery.cancel_scope.cancel()


@trio_test
async def test_a_burst_of_adds_leaves_in_socket_writes_of_flush_bytes_before_the_caller_yields():
    """Many adds started in one step are written as they pass FLUSH_BYTES, not all at the next yield
    (the bookie can start on the first ones meanwhile); a socket that takes nothing more leaves the
    rest to the writer task, without a flush (a copy of the backlog) per further add."""
    from bookie.client import FLUSH_BYTES

    received = []
    accepted, got_first, stalled = trio.Event(), trio.Event(), trio.Event()

    async def handle(stream):
        accepted.set()
        async with stream:
            received.append(await stream.receive_some(1 << 20))  # the first flush: then it stops reading
            got_first.set()
            await stalled.wait()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
            async with BookieClient("127.0.0.1", listener.socket.getsockname()[1]) as c:
                c.start_read_lac(1)  # connects; the raw server never answers
                await accepted.wait()
                await trio.testing.wait_all_tasks_blocked()  # connected, the READ_LAC sent, the writer task idle
                assert c.connected
                data = entry(1, 0)
                frame_bytes = len(P.encode_add(1, 1, 0, KEY, data))
                per_flush = -(-FLUSH_BYTES // frame_bytes)
                sends = c.statistics()["sends"]  # the READ_LAC's
                for i in range(per_flush - 1):
                    c.start_add(1, i, KEY, data)
                assert c.statistics()["sends"] == sends and c.statistics()["queued_frames"] == per_flush - 1
                c.start_add(1, per_flush, KEY, data)  # this one passes FLUSH_BYTES: all leave now, unyielded
                assert c.statistics()["sends"] == sends + 1 and c.statistics()["queued_frames"] == 0
                await got_first.wait()
                # Now fill the socket: the server reads no more.
                sends = c.statistics()["sends"]
                big = DIGESTER.package(1, 1, 0, 2, b"x" * FLUSH_BYTES)  # each add alone passes FLUSH_BYTES
                for i in range(200):
                    c.start_add(1, 1000 + i, KEY, big)
                assert c.statistics()["sends"] - sends < 200  # flushes stopped once one was short
                assert c.statistics()["queued_frames"] > 0
                stalled.set()
            nursery.cancel_scope.cancel()
