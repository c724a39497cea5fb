"""The admin port's client (clusterd/daemon/admin.py fetch_status, on h11) against real loopback
servers: a node's own admin server answers its status; a server that answers badly in any way
(another status, bytes that are not HTTP, a body without end, silence) gives AdminUnavailable,
never another exception and never a wait past timeout_s."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio
import trio.testing

from clusterd.daemon.admin import MAX_RESPONSE_BYTES, AdminServer, AdminUnavailable, fetch_status

STATUS = {"role": "follower", "epoch": 3, "peers": [1, 2], "last_zxid": 0x3_0000_0007}

Handler = Callable[[trio.SocketStream], Awaitable[None]]


def fetch_from(handler: Handler, *, timeout_s: float = 30.0,
               clock: trio.testing.MockClock | None = None) -> dict | AdminUnavailable:
    """fetch_status from a loopback server running `handler` per connection: the status, or
    the AdminUnavailable it raised (anything else fails the test)."""
    async def main() -> dict | AdminUnavailable:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            try:
                with trio.fail_after(timeout_s + 60):  # a guard: fetch_status must end by itself
                    outcome: dict | AdminUnavailable = await fetch_status("127.0.0.1", port, timeout_s=timeout_s)
            except AdminUnavailable as e:
                outcome = e
            nursery.cancel_scope.cancel()
        return outcome
    return trio.run(main, clock=clock)


async def read_head(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and (chunk := await stream.receive_some(4096)):
        data += chunk
    return data


def answering(*parts: bytes, then_forever: bytes = b"", stall: bool = False) -> Handler:
    """A server that reads the request head, sends `parts`, then sends `then_forever` again and
    again, or stalls (`stall`), or closes."""
    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await read_head(stream)
            try:
                for part in parts:
                    await stream.send_all(part)
                while then_forever:
                    await stream.send_all(then_forever)
            except trio.BrokenResourceError:
                return  # the client hung up on an answer it refused, as it should
            if stall:
                await trio.sleep_forever()
    return handler


def unavailable(outcome: dict | AdminUnavailable, *words: str) -> str:
    assert isinstance(outcome, AdminUnavailable), outcome
    message = str(outcome)
    assert message.startswith("127.0.0.1:") and all(w in message for w in words), message
    return message


def test_a_nodes_admin_server_answers_its_status() -> None:
    server = AdminServer(lambda: dict(STATUS))
    assert fetch_from(server.handle_connection) == STATUS


def test_a_status_split_into_chunks_and_read_until_close_is_read_whole() -> None:
    chunked = answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                        b"5\r\n{\"a\":\r\n", b"3\r\n 1}\r\n", b"0\r\n\r\n")
    assert fetch_from(chunked) == {"a": 1}
    until_close = answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b'{"b": 2}')
    assert fetch_from(until_close) == {"b": 2}


@pytest.mark.parametrize("status", [500, 404, 301])
def test_another_status_than_200_is_unavailable(status: int) -> None:
    body = b"the node is on fire\n"
    handler = answering(b"HTTP/1.1 %d Whatever\r\nContent-Length: %d\r\n\r\n" % (status, len(body)), body)
    unavailable(fetch_from(handler), f"HTTP {status}")


@pytest.mark.parametrize("garbage", [
    b"\x00\xff\x13garbage\r\n\r\n",  # not a status line
    b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n{}",  # a bad header
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a bad chunk size
    b"SSH-2.0-OpenSSH_9.6\r\n",  # another protocol, then the close
])
def test_bytes_that_are_not_an_http_answer_are_unavailable(garbage: bytes) -> None:
    unavailable(fetch_from(answering(garbage)))


def test_a_head_without_end_is_unavailable() -> None:
    unavailable(fetch_from(answering(b"HTTP/1.1 200 OK\r\n", then_forever=b"X-Padding: " + b"p" * 1000 + b"\r\n")),
                "malformed")


def test_an_answer_cut_short_is_unavailable() -> None:
    unavailable(fetch_from(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\"")))
    unavailable(fetch_from(answering(b"")), "malformed")  # h11: closed before a response


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 40)])
def test_a_body_beyond_the_limit_is_unavailable(head: bytes) -> None:
    piece = b"x" * (64 << 10)
    forever = b"%x\r\n%s\r\n" % (len(piece), piece) if b"chunked" in head else piece
    unavailable(fetch_from(answering(head, then_forever=forever)), f"larger than {MAX_RESPONSE_BYTES}")


def test_an_answer_that_is_not_a_json_object_is_unavailable() -> None:
    for body, words in ((b"not json", "not JSON"), (b"[1, 2]", "not a JSON object")):
        handler = answering(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), body)
        unavailable(fetch_from(handler), words)


@pytest.mark.parametrize("parts", [(), (b"HTTP/1.1 200 OK\r\nContent-",),
                                   (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\": ",)],
                         ids=["silent", "half a head", "half a body"])
def test_a_server_that_stalls_is_unavailable_after_timeout_s(parts: tuple[bytes, ...]) -> None:
    # Simulated time: the clock jumps to the client's deadline once every task waits.
    clock = trio.testing.MockClock(autojump_threshold=0.01)
    unavailable(fetch_from(answering(*parts, stall=True), timeout_s=5.0, clock=clock), "within 5.0 s")
    assert 5.0 <= clock.current_time() < 65.0


def test_no_server_is_unavailable() -> None:
    async def main() -> None:
        with trio.socket.socket() as s:  # a port bound, never listened on: the connection is refused
            await s.bind(("127.0.0.1", 0))
            with pytest.raises(AdminUnavailable):
                await fetch_status("127.0.0.1", s.getsockname()[1], timeout_s=30.0)
    trio.run(main)
