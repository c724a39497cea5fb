"""Add answers written by the storage's worker thread right after the fsync (ThreadAnswer in
bookie/service_connection.py, bookie/storage_commit.py's after_sync and settle): they leave while the event loop
is busy, a batch answered that way is indexed before any later request is served, and what the
socket does not take goes out first, whole, from the event loop. Real sockets, real fsync."""

from __future__ import annotations

import socket
import struct
import threading

import trio
import trio.testing

from bookie import protocol as P
from bookie.entry import Digester, DigestType, master_key
from bookie.errors import NoSuchEntry
from bookie.service_connection import BookieConnection, ThreadAnswer
from bookie_fixtures import open_storage, serving_bookie, trio_test

KEY = master_key(b"secret")
DIGESTER = Digester(DigestType.CRC32C, b"secret")


def entry(ledger: int, entry_id: int) -> bytes:
    return DIGESTER.package(ledger, entry_id, entry_id - 1, 10 * (entry_id + 1), f"entry {entry_id}".encode())


def connect(service) -> socket.socket:  # noqa: ANN001 - a BookieService
    """A plain blocking socket to the bookie (10 s timeout): the test's event loop can be held on it."""
    sock = socket.create_connection(("127.0.0.1", service.port))
    sock.settimeout(10)
    return sock


def recv_answers(sock: socket.socket, count: int) -> list[P.Response]:
    """Blocking: the caller's event loop does not run meanwhile."""
    splitter, answers = P.FrameSplitter(1 << 20), []
    while len(answers) < count:
        data = sock.recv(65536)
        assert data, "the bookie closed the connection"
        answers += [P.decode_response(body) for body in splitter.feed(data)]
    return answers


@trio_test
async def test_adds_are_answered_from_the_worker_thread_while_the_event_loop_is_held(tmp_path, monkeypatch):
    held = threading.Event()
    answer_from_thread = ThreadAnswer.send_from_thread

    def answer_once_held(self: ThreadAnswer) -> None:
        held.wait(10)  # the batch's wake-up, queued after this, cannot apply it before the check below
        answer_from_thread(self)

    monkeypatch.setattr(ThreadAnswer, "send_from_thread", answer_once_held)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service:
            storage = service.storage
            writer = connect(service)
            for i in range(20):
                writer.sendall(P.encode_add(i, 9, i, KEY, entry(9, i)))
                await trio.testing.wait_all_tasks_blocked()  # read, dispatched, its batch in the worker thread
                # The event loop is held from here: only the worker thread can answer.
                held.set()
                (answer,) = recv_answers(writer, 1)
                held.clear()
                assert (answer.request_id, answer.status, answer.entry_id) == (i, P.Status.OK, i)
                assert storage.statistics()["adds"] == i, "not applied yet: the loop has not run"
            # The worker thread queues the last batch's wake-up after its answer left, maybe after
            # every task here has blocked: apply it as the service does before any later request.
            await trio.testing.wait_all_tasks_blocked()
            storage.settle()
            assert storage.statistics()["adds"] == 20 and storage.lac(9) == 18
            writer.close()


@trio_test
async def test_a_read_after_an_answer_from_the_thread_finds_the_entry_before_the_wake_up(tmp_path, monkeypatch):
    gate = threading.Event()
    answer_from_thread = ThreadAnswer.send_from_thread

    def answer_then_hold(self: ThreadAnswer) -> None:
        answer_from_thread(self)
        gate.wait(10)  # the batch's wake-up is queued only once this returns

    monkeypatch.setattr(ThreadAnswer, "send_from_thread", answer_then_hold)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service:
            storage = service.storage
            writer = connect(service)
            reader = connect(service)
            try:
                writer.sendall(P.encode_add(1, 9, 0, KEY, entry(9, 0)))
                (answer,) = await trio.to_thread.run_sync(recv_answers, writer, 1)
                assert answer.status is P.Status.OK
                reader.sendall(P.encode_request(P.ReadEntry(2, 9, 0)))
                (read,) = await trio.to_thread.run_sync(recv_answers, reader, 1)
                assert read.status is P.Status.OK and DIGESTER.verify(read.data).payload == b"entry 0"
            finally:
                gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert storage.statistics()["adds"] == 1  # applied once: the late wake-up found it done
            writer.sendall(P.encode_add(3, 9, 1, KEY, entry(9, 1)))  # and the next batch goes on as usual
            (answer,) = await trio.to_thread.run_sync(recv_answers, writer, 1)
            assert (answer.request_id, answer.status) == (3, P.Status.OK)
            writer.close()
            reader.close()


@trio_test
async def test_an_answer_the_event_loop_claimed_by_settling_first_is_sent_once(tmp_path, monkeypatch):
    arrived, gate, went_on = threading.Event(), threading.Event(), threading.Event()
    answer_from_thread = ThreadAnswer.send_from_thread

    def wait_then_answer(self: ThreadAnswer) -> None:
        arrived.set()  # the batch is durable and settle()-able from here
        gate.wait(10)
        answer_from_thread(self)
        went_on.set()

    monkeypatch.setattr(ThreadAnswer, "send_from_thread", wait_then_answer)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service:
            writer = connect(service)
            other = connect(service)
            try:
                writer.sendall(P.encode_add(1, 9, 0, KEY, entry(9, 0)))
                assert await trio.to_thread.run_sync(arrived.wait, 10)
                other.sendall(P.encode_request(P.ReadLac(2, 9)))  # its dispatch settles the batch
                (lac,) = await trio.to_thread.run_sync(recv_answers, other, 1)
                assert lac.status is P.Status.OK
                (answer,) = await trio.to_thread.run_sync(recv_answers, writer, 1)  # sent by the event loop
                assert (answer.request_id, answer.status) == (1, P.Status.OK)
            finally:
                gate.set()
            assert await trio.to_thread.run_sync(went_on.wait, 10)  # the thread went on: it must not answer again
            writer.setblocking(False)
            try:
                extra = writer.recv(65536)
            except BlockingIOError:
                extra = b""
            assert extra == b"", "answered twice"
            writer.close()
            other.close()


@trio_test
async def test_the_thread_and_the_event_loop_claim_an_answer_once():
    left, right = socket.socketpair()
    conn = BookieConnection(1, trio.SocketStream(trio.socket.from_stdlib_socket(left)), max_outgoing_bytes=1 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.write_loop)  # attaches the stream: thread writes go only to a pumped link
        await trio.testing.wait_all_tasks_blocked()
        first = ThreadAnswer(conn, b"x")
        assert first.claim_for_loop()
        await trio.to_thread.run_sync(first.send_from_thread)  # too late: the event loop sends it
        assert first.by_thread is False
        second = ThreadAnswer(conn, b"y")
        await trio.to_thread.run_sync(second.send_from_thread)
        assert second.by_thread and not second.claim_for_loop()
        assert right.recv(16) == b"y"
        nursery.cancel_scope.cancel()
    left.close()
    right.close()


@trio_test
async def test_settle_applies_a_durable_batch_whose_wake_up_has_not_come(tmp_path):
    with trio.fail_after(20):
        async with open_storage(tmp_path) as storage:
            synced = threading.Event()
            outcomes, batch = storage.join_adds([(4, 0, KEY, entry(4, 0), False)], synced.set)
            assert outcomes == [None] and batch is not None
            assert synced.wait(10)  # the loop is held meanwhile: the batch's own wake-up cannot run
            try:
                storage.read(4, 0)
                raise AssertionError("indexed before the event loop applied the batch")
            except NoSuchEntry:
                pass
            storage.settle()
            assert DIGESTER.verify(storage.read(4, 0)).payload == b"entry 0"
            assert batch.done.is_set()
            await trio.testing.wait_all_tasks_blocked()  # the late wake-up finds it applied
            assert storage.statistics()["adds"] == 1


@trio_test
async def test_what_the_socket_does_not_take_from_the_thread_goes_first_and_whole(tmp_path):
    with trio.fail_after(20):
        left, right = trio.socket.socketpair()
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn = BookieConnection(1, trio.SocketStream(left), max_outgoing_bytes=1 << 30)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.write_loop)
            await trio.testing.wait_all_tasks_blocked()
            answer = ThreadAnswer(conn, b"A" * 200_000)  # more than the kernel buffers hold
            await trio.to_thread.run_sync(answer.send_from_thread)
            assert answer.by_thread, "the thread wrote what fit and left the rest to the writer task"
            conn.send(b"B" * 1000)  # the event loop's next answer: after the rest, never inside it
            blocked = ThreadAnswer(conn, b"C")
            await trio.to_thread.run_sync(blocked.send_from_thread)  # nobody reads: the rest is still unsent
            assert blocked.by_thread is False and blocked.claim_for_loop(), "never while something is unsent"
            received = bytearray()
            while len(received) < 201_000:
                received += await right.recv(65536)
            nursery.cancel_scope.cancel()
        assert bytes(received) == b"A" * 200_000 + b"B" * 1000


def test_an_answer_for_a_closed_connection_is_never_written_by_the_thread():
    left, right = socket.socketpair()
    conn = BookieConnection(1, trio.SocketStream(trio.socket.from_stdlib_socket(left)), max_outgoing_bytes=1 << 20)
    conn.closing = True
    answer = ThreadAnswer(conn, struct.pack(">I", 7))
    answer.send_from_thread()
    assert answer.by_thread is False and conn.out.queued_bytes == 0
    right.setblocking(False)
    try:
        assert right.recv(16) == b""
    except BlockingIOError:
        pass  # nothing was written
