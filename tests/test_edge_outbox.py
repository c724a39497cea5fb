"""edge/outbox.py: write-through when idle, order kept across threads, bounds, detach.

Real socket pairs; the writer task is the real one (Outbox.pump)."""

from __future__ import annotations

import socket

import trio
import trio.testing

from edge.outbox import ByteBudget, Outbox
from bookie_fixtures import trio_test


def pair(sndbuf: int | None = None) -> tuple[trio.SocketStream, socket.socket]:
    """Our end as a trio stream; the far end a plain non-blocking socket (read without yielding)."""
    left, right = socket.socketpair()
    if sndbuf is not None:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    right.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(left)), right


async def receive(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        await trio.lowlevel.wait_readable(sock)
        data = sock.recv(1 << 20)
        assert data, "the connection ended early"
        got += data
    return bytes(got)


def received_now(sock: socket.socket) -> bytes:
    got = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            got += chunk
    except BlockingIOError:
        pass
    return bytes(got)


@trio_test
async def test_a_lone_message_to_an_idle_link_is_written_before_the_writer_task_runs():
    stream, right = pair()
    box = Outbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        await trio.testing.wait_all_tasks_blocked()
        writes = box.stats.writes
        box.send(b"hello")
        assert received_now(right) == b"hello"  # no checkpoint since send(): it was written through
        assert box.stats.writes == writes + 1
        box.send(b"queued", direct=False)  # the caller knows more is coming: the writer task sends it
        assert box.queued_bytes == 6
        assert await receive(right, 6) == b"queued"
        nursery.cancel_scope.cancel()


@trio_test
async def test_before_a_stream_is_attached_sends_wait_and_leave_in_order_once_it_is():
    stream, right = pair()
    box = Outbox()
    for i in range(5):
        box.send(b"%d" % i)
    assert box.queued_frames == 5
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        assert await receive(right, 5) == b"01234"
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_partial_thread_write_goes_first_and_whole_and_wakes_the_writer_task():
    stream, right = pair(sndbuf=4096)
    box = Outbox(threads=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        await trio.testing.wait_all_tasks_blocked()
        big = bytes(range(256)) * 800  # more than the kernel buffers hold
        assert await trio.to_thread.run_sync(box.send_from_thread, big)
        box.send(b"after")  # from trio's thread: never inside the rest
        refused = await trio.to_thread.run_sync(box.send_from_thread, b"not now")
        assert not refused, "a thread wrote while something was unsent"
        # Nothing else is sent from trio's thread: the rest leaves only because the thread woke the writer task.
        assert await receive(right, len(big) + 5) == big + b"after"
        assert box.stats.thread_frames_sent == 1
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_thread_never_writes_to_a_link_without_a_writer_task():
    stream, right = pair()
    box = Outbox(threads=True)
    assert not await trio.to_thread.run_sync(box.send_from_thread, b"x")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        await trio.testing.wait_all_tasks_blocked()
        box.detach()
        await trio.testing.wait_all_tasks_blocked()
        assert not await trio.to_thread.run_sync(box.send_from_thread, b"y")
    assert received_now(right) == b""


@trio_test
async def test_detach_drops_the_queue_and_later_sends_wait_for_the_next_stream():
    old, old_right = pair(sndbuf=4096)
    box = Outbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, old)
        await trio.testing.wait_all_tasks_blocked()
        box.send(b"a" * 300_000)  # fills the old socket: the rest stays queued or in the writer's hands
        box.send(b"dropped", direct=False)
        box.detach()
        box.send(b"new")  # after the detach: for the next stream only
        await trio.testing.wait_all_tasks_blocked()
        new, new_right = pair()
        nursery.start_soon(box.pump, new)
        assert await receive(new_right, 3) == b"new"
        seen = received_now(old_right)
        assert b"dropped" not in seen and b"new" not in seen
        nursery.cancel_scope.cancel()


@trio_test
async def test_bounds_refuse_what_would_pass_them_but_one_item_always_fits():
    box = Outbox(max_bytes=100, max_frames=3)  # no stream: everything queues
    assert box.send(b"x" * 500)  # alone in an empty queue
    assert not box.send(b"y")  # the queue is past max_bytes already
    box.detach()
    assert box.send(b"a") and box.send(b"b") and box.send(b"c")
    assert not box.send(b"d"), "a fourth frame was queued past max_frames"
    assert box.queued_frames == 3 and box.queued_bytes == 3


@trio_test
async def test_close_ends_the_writer_task_once_the_queue_is_written():
    stream, right = pair()
    box = Outbox()
    box.send(b"last words")
    box.close()
    box.send(b"too late")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
    assert await receive(right, 10) == b"last words"


@trio_test
async def test_push_writes_the_queue_now_and_stops_once_the_socket_is_full():
    stream, right = pair(sndbuf=4096)
    box = Outbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(4):
            box.send(b"p" * 100_000, direct=False)
        writes = box.stats.writes
        box.push()  # joined and handed to the kernel without yielding: the socket takes part
        assert box.stats.writes == writes + 1 and 0 < box.queued_bytes < 400_000
        box.push()  # the rest is still queued: joining it again would be in vain
        assert box.stats.writes == writes + 1
        assert await receive(right, 400_000) == b"p" * 400_000
        nursery.cancel_scope.cancel()


@trio_test
async def test_an_outbox_made_without_threads_never_takes_a_threads_write():
    stream, right = pair()
    box = Outbox()  # its sends skip the lock: no other thread may write
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.pump, stream)
        await trio.testing.wait_all_tasks_blocked()
        assert not await trio.to_thread.run_sync(box.send_from_thread, b"x")
        box.append(b"a")
        box.append(b"b")  # queued behind the first, in order
        assert await receive(right, 2) == b"ab"
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_shared_byte_budget_bounds_what_outboxes_hold_together_and_is_given_back():
    """Two outboxes share a ByteBudget of 100 bytes: past each one's first queued item, a send that
    would take their bytes together (queued, or in the writer task's hands) beyond it is refused;
    the bytes come back once written, or when an outbox is detached."""
    budget = ByteBudget(100)
    one, two = Outbox(budget=budget), Outbox(budget=budget)
    assert one.send(b"a" * 60) and two.send(b"b" * 30)  # no stream yet: queued, first items always fit
    assert budget.used == 90
    assert not one.send(b"c" * 20) and budget.refusals == 1  # 110 > 100: refused, nothing queued
    assert one.send(b"c" * 10) and budget.used == 100
    two.detach()
    assert budget.used == 70
    stream, right = pair(sndbuf=4096)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.pump, stream)
        assert await receive(right, 70) == b"a" * 60 + b"c" * 10
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 0  # written: given back
        # A reader that stops: the writer task's bytes in hand still count.
        one.send(b"x" * 50, direct=False)
        one.send(b"y" * 40, direct=False)
        assert budget.used == 90
        nursery.cancel_scope.cancel()
