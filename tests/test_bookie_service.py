"""The bookie service and client over real loopback sockets, on a real BookieStorage.

Each test starts a BookieService on an ephemeral port and talks to it with
BookieClient (or raw sockets for malformed input): pipelined adds and reads,
fencing, long polls, explicit LACs, wrong master keys, malformed frames that
close only their own connection, and connection loss failing what was in flight.
"""

from __future__ import annotations

import socket
import struct
from functools import partial
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import trio
import trio.testing

from bookie import protocol as P
from bookie.client import BookieClient, BookiePool, Completions
from bookie.entry import NO_ENTRY, master_key
from bookie.errors import (BadRequest, BookieUnavailable, EntryTooLarge, LedgerFenced, NoSuchEntry, NoSuchLedger,
                           Overloaded, StorageError, Unauthorized)
from bookie.service import BookieService, BookieServiceConfig
from bookie_fixtures import DIGESTER, KEY, entry, open_storage, serving_bookie, trio_test

OTHER_KEY = master_key(b"not the password")


@asynccontextmanager
async def client_of(service: BookieService, **options) -> AsyncIterator[BookieClient]:
    async with BookieClient("127.0.0.1", service.port, **options) as client:
        yield client


@trio_test
async def test_pipelined_adds_then_reads_from_one_task(tmp_path):
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            pending = [c.start_add(1, i, KEY, entry(1, i)) for i in range(500)]
            for p in pending:
                assert await p.result() is None
            reads = [c.start_read(1, i) for i in range(500)]
            for i, p in enumerate(reads):
                assert DIGESTER.verify(await p.result()).payload == f"entry {i}".encode()
            assert await c.read_lac(1) == 498  # the LAC piggybacked on entry 499
            assert c.statistics()["sends"] < 100  # queued requests left together, not one send each
            assert service.statistics()["adds"] == 500


@trio_test
async def test_many_tasks_share_one_connection_and_completions_collect_answers(tmp_path):
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            async with trio.open_nursery() as nursery:
                for t in range(10):
                    async def writer(t=t):
                        for i in range(20):
                            await c.add(100 + t, i, KEY, entry(100 + t, i))
                    nursery.start_soon(writer)
            sink = Completions()
            for t in range(10):
                c.start_read(100 + t, 19, tag=t, sink=sink)
            done: list = []
            while len(done) < 10:
                done += await sink.get()
            assert sorted(p.tag for p in done) == list(range(10)) and all(p.error is None for p in done)
            assert service.statistics()["connections"] == 1


@trio_test
async def test_missing_ledger_and_entry_are_explicit_answers(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            with pytest.raises(NoSuchLedger):
                await c.read(9, 0)
            await c.add(9, 0, KEY, entry(9, 0))
            with pytest.raises(NoSuchEntry):
                await c.read(9, 1)


@trio_test
async def test_a_fence_refuses_later_adds_but_not_recovery_adds(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            await c.add(2, 0, KEY, entry(2, 0))
            await c.add(2, 1, KEY, entry(2, 1))
            assert await c.fence(2, KEY) == 0  # the LAC entry 1 carried
            with pytest.raises(LedgerFenced):
                await c.add(2, 2, KEY, entry(2, 2))
            await c.add(2, 2, KEY, entry(2, 2), recovery=True)  # how recovery re-replicates (seed 001)
            assert DIGESTER.verify(await c.read(2, 2)).entry_id == 2


@trio_test
async def test_a_fencing_read_fences_first_and_answers_no_such_entry_past_the_end(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            await c.add(3, 0, KEY, entry(3, 0))
            assert DIGESTER.verify(await c.read(3, 0, fence=True, master_key=KEY)).entry_id == 0
            with pytest.raises(NoSuchEntry):
                await c.read(3, 1, fence=True, master_key=KEY)
            with pytest.raises(LedgerFenced):  # the old writer can no longer add behind the recoverer
                await c.add(3, 1, KEY, entry(3, 1))


@trio_test
async def test_a_wrong_master_key_is_unauthorized(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            await c.add(4, 0, KEY, entry(4, 0))
            with pytest.raises(Unauthorized):
                await c.add(4, 1, OTHER_KEY, entry(4, 1))
            with pytest.raises(Unauthorized):
                await c.fence(4, OTHER_KEY)
            with pytest.raises(Unauthorized):
                await c.write_lac(4, 0, OTHER_KEY)
            await c.add(4, 1, KEY, entry(4, 1))


@trio_test
async def test_explicit_lac_is_written_and_read_back(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            for i in range(3):
                await c.add(5, i, KEY, entry(5, i))
            assert await c.read_lac(5) == 1
            await c.write_lac(5, 2, KEY)
            assert await c.read_lac(5) == 2


@trio_test
async def test_an_explicit_lac_wakes_a_long_poll_and_binds_an_unseen_ledger_durably(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            await c.add(5, 0, KEY, entry(5, 0, lac=NO_ENTRY))
            poll = c.start_long_poll(5, NO_ENTRY, timeout_ms=5_000)
            await c.write_lac(5, 0, KEY)  # the ledger's key is bound here: served at once, without a task
            lac, data = await poll.result()
            assert lac == 0 and DIGESTER.verify(data).entry_id == 0
            with pytest.raises(Unauthorized):
                await c.write_lac(5, 1, OTHER_KEY)
            fsyncs = service.storage.statistics()["fsyncs"]
            await c.write_lac(9, 3, KEY)  # unseen: its key record is durable before the answer
            assert service.storage.statistics()["fsyncs"] > fsyncs and await c.read_lac(9) == 3
            with pytest.raises(Unauthorized):
                await c.write_lac(9, 4, OTHER_KEY)


@trio_test
async def test_a_journal_that_cannot_be_written_stops_the_service_without_answering(tmp_path):
    """The adds of a failed batch are never answered (they are not durable): the service stops, and
    with it the node (the client sees its connection go: outcome unknown)."""
    with trio.fail_after(10):
        async with open_storage(tmp_path) as storage:
            service = BookieService(storage, "127.0.0.1", 0)
            with pytest.raises(BaseExceptionGroup) as stopped:
                async with trio.open_nursery() as nursery:
                    await nursery.start(service.run)
                    async with client_of(service) as c:
                        await c.add(2, 0, KEY, entry(2, 0))

                        def broken_sync() -> None:
                            raise StorageError("journal: fsync failed (simulated); restart the bookie")

                        storage._journal.sync = broken_sync
                        with pytest.raises(BookieUnavailable):
                            await c.add(2, 1, KEY, entry(2, 1))
            assert stopped.group_contains(StorageError, match="simulated")


@trio_test
async def test_long_poll_answers_when_the_lac_advances_with_the_next_entry(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            await c.add(6, 0, KEY, entry(6, 0, lac=NO_ENTRY))
            poll = c.start_long_poll(6, NO_ENTRY, timeout_ms=5_000)
            await c.add(6, 1, KEY, entry(6, 1))  # carries LAC 0
            lac, data = await poll.result()
            assert lac == 0 and DIGESTER.verify(data).entry_id == 0


@trio_test
async def test_long_poll_answers_at_its_timeout_with_the_current_lac(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            for i in range(3):
                await c.add(7, i, KEY, entry(7, i))
            start = trio.current_time()
            assert await c.long_poll(7, 1, timeout_ms=200) == (1, None)
            assert trio.current_time() - start >= 0.19
            lac, data = await c.long_poll(7, 0, timeout_ms=200)  # already past: at once, with entry 1
            assert lac == 1 and DIGESTER.verify(data).entry_id == 1


@trio_test
async def test_an_entry_over_the_limit_is_too_large(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path, BookieServiceConfig(max_entry_bytes=1000)) as service, client_of(service) as c:
            await c.add(8, 0, KEY, entry(8, 0, payload=b"x" * 500))
            with pytest.raises(EntryTooLarge):
                await c.add(8, 1, KEY, entry(8, 1, payload=b"x" * 1000))


@trio_test
async def test_requests_beyond_max_in_flight_are_overloaded(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path, BookieServiceConfig(max_in_flight=4)) as service, client_of(service) as c:
            polls = [c.start_long_poll(10 + i, NO_ENTRY, 2_000) for i in range(4)]
            await trio.sleep(0.2)
            with pytest.raises(Overloaded):
                await c.add(20, 0, KEY, entry(20, 0))
            for p in polls:
                with pytest.raises(NoSuchLedger):
                    await p.result()
            await c.add(20, 0, KEY, entry(20, 0))


# --- bad input: only the sender's connection closes --------------------------------------

async def _raw_exchange(port: int, data: bytes) -> list[P.Response]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        splitter, answers = P.FrameSplitter(1 << 20), []
        while (chunk := await stream.receive_some(65536)):
            answers += [P.decode_response(b) for b in splitter.feed(chunk)]
        return answers  # the bookie closed the connection


@pytest.mark.parametrize("damage", ["unknown_type", "truncated_body", "bad_crc", "oversized", "wrong_entry"])
@trio_test
async def test_a_malformed_frame_closes_only_its_connection(tmp_path, damage):
    good = P.encode_request(P.ReadLac(1, 42))
    body = struct.pack(">BBQQ", 1, 0x3F, 77, 42)
    bad = {
        "unknown_type": struct.pack(">II", len(body), P.crc32c(body)) + body,
        "truncated_body": _reframe(P.encode_request(P.Fence(77, 42, KEY))[8:-5]),
        "bad_crc": good[:-1] + bytes([good[-1] ^ 1]),
        "oversized": struct.pack(">II", 10 << 20, 0) + struct.pack(">BBQ", 1, 1, 77),
        "wrong_entry": P.encode_add(77, 42, 5, KEY, entry(42, 6)),
    }[damage]
    with trio.fail_after(10):
        async with serving_bookie(tmp_path, BookieServiceConfig(max_entry_bytes=1 << 20)) as service, \
                client_of(service) as c:
            await c.add(42, 0, KEY, entry(42, 0))
            answers = await _raw_exchange(service.port, good + bad + good)
            assert answers[0].status is P.Status.OK and answers[0].lac == NO_ENTRY
            if damage != "bad_crc":
                assert answers[-1].request_id == 77 and answers[-1].status is P.Status.BAD_REQUEST
            assert all(a.request_id != 1 for a in answers[1:])  # nothing after the bad frame was served
            await c.add(42, 1, KEY, entry(42, 1))  # the other client never noticed
            assert service.statistics()["bad_frames"] == 1


def _reframe(body: bytes) -> bytes:
    return struct.pack(">II", len(body), P.crc32c(body)) + body


@trio_test
async def test_a_bad_request_answer_is_a_typed_error_for_the_client(tmp_path):
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            p = c.start_add(50, 1, KEY, entry(50, 2))  # the entry inside names entry 2
            with pytest.raises(BadRequest):
                await p.result()


# --- connection loss ----------------------------------------------------------------------

@trio_test
async def test_losing_the_bookie_fails_pending_requests_and_a_restart_is_reconnected(tmp_path):
    with trio.fail_after(20):
        async with open_storage(tmp_path) as storage, BookiePool() as pool:
            async with trio.open_nursery() as nursery:
                service = BookieService(storage, "127.0.0.1", 0)
                await nursery.start(service.run)
                pool.update({1: ("127.0.0.1", service.port)})
                c = pool.client(1)
                await c.add(60, 0, KEY, entry(60, 0))
                polls = [c.start_long_poll(60, 5, 10_000) for _ in range(3)]
                await trio.sleep(0.1)
                nursery.cancel_scope.cancel()  # the bookie goes away with requests in flight
            for p in polls:
                with pytest.raises(BookieUnavailable, match="outcome is unknown"):
                    await p.result()
            with pytest.raises(BookieUnavailable):
                await c.read_lac(60)  # refused while the bookie is down
            async with trio.open_nursery() as nursery:
                service = BookieService(storage, "127.0.0.1", pool.address(1)[1])
                await nursery.start(service.run)
                await trio.sleep(1.1)  # past the client's reconnect backoff
                assert await c.read_lac(60) == NO_ENTRY
                nursery.cancel_scope.cancel()


@trio_test
async def test_a_request_the_bookie_never_answers_times_out_and_the_connection_stays():
    async def silent(stream):
        async with stream:
            await stream.receive_some(1)  # reads once, never answers
            await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
            async with BookieClient("127.0.0.1", listener.socket.getsockname()[1], timeout_s=0.3) as c:
                start = trio.current_time()
                with pytest.raises(BookieUnavailable, match="did not answer a READ_LAC in time"):
                    await c.read_lac(70)
                assert 0.3 <= trio.current_time() - start < 1 and c.connected
            nursery.cancel_scope.cancel()


# --- fuzz: random bytes on one connection never hurt the bookie or its other clients ----------

@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(
    st.binary(max_size=64),
    st.sampled_from([P.encode_request(P.ReadLac(1, 42)), P.encode_add(2, 42, 1, KEY, entry(42, 1))]),
    st.builds(lambda b: struct.pack(">II", len(b), P.crc32c(b)) + b, st.binary(min_size=1, max_size=80)),
), max_size=6))
def test_random_bytes_close_at_most_their_own_connection(tmp_path_factory, chunks):
    tmp_path = tmp_path_factory.mktemp("fuzz")

    async def main():
        with trio.fail_after(10):
            async with serving_bookie(tmp_path) as service, client_of(service) as c:
                await c.add(42, 0, KEY, entry(42, 0))
                stream = await trio.open_tcp_stream("127.0.0.1", service.port)
                async with stream:
                    for chunk in chunks:
                        try:
                            await stream.send_all(chunk)
                        except trio.BrokenResourceError:
                            break  # the bookie closed this connection: allowed
                    assert await c.read_lac(42) in (NO_ENTRY, 0)  # the well-behaved client goes on (0: a fuzz add)
                    assert DIGESTER.verify(await c.read(42, 0)).entry_id == 0
    trio.run(main)


@trio_test
async def test_a_client_that_resets_its_connection_does_not_take_the_bookie_down(tmp_path):
    """A peer vanishing with a TCP RST (SO_LINGER 0) mid-request: only that connection ends.
    (It used to escape the connection's nursery as an ExceptionGroup and stop the node.)"""
    with trio.fail_after(10):
        async with serving_bookie(tmp_path) as service, client_of(service) as c:
            for _ in range(3):
                sock = trio.socket.socket()
                await sock.connect(("127.0.0.1", service.port))
                await sock.send(P.encode_request(P.ReadLac(1, 42))[:-3])  # half a request
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                await trio.sleep(0.05)
            await c.add(42, 0, KEY, entry(42, 0))
            assert await c.read_lac(42) == NO_ENTRY
