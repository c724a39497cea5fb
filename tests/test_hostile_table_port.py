"""The table service's HTTP layer (tablespace/http.py, server.py's request parsing) against
hostile bytes, on real loopback sockets: garbage, oversized heads and bodies, a request that
never ends, bodies that are not JSON objects, ops with extreme values. Each gets an error answer
or a closed connection; the server goes on serving the next connection."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_fixtures import bytes_until_closed
from tablespace import http
from tablespace.errors import BadRequest
from tablespace.server import TableServer, _op


async def _echo(method: str, target: str, body: dict | None) -> tuple[int, dict]:
    return 200, {"method": method, "target": target, "body": body}


def exchange(payloads: list[bytes], *, read_timeout: float = 3.0, half_close: bool = True) -> list[bytes]:
    """Serve on loopback; send each payload on its own connection; what each got back (until close)."""
    async def main() -> list[bytes]:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, lambda s: http.serve_connection(s, _echo), 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]

            def talk(data: bytes) -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
                    try:
                        s.sendall(data)
                        if half_close:
                            s.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    out = b""
                    try:
                        while chunk := s.recv(65536):
                            out += chunk
                    except (socket.timeout, ConnectionResetError):
                        pass
                    return out
            answers = [await trio.to_thread.run_sync(talk, p) for p in payloads]
            answers.append(await trio.to_thread.run_sync(talk, b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n"))
            nursery.cancel_scope.cancel()
            return answers
    return trio.run(main)


def status_of(answer: bytes) -> int | None:
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def test_bad_requests_get_an_error_or_a_closed_connection_and_the_server_goes_on():
    big_head = b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (64 << 10) + b"\r\n\r\n"
    answers = exchange([
        b"\x00\xff garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",                                        # no host header
        big_head,
        b"POST /tx HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999\r\n\r\n",
        b"POST /tx HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n[1,2]",   # JSON, not an object
        b"POST /tx HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\n\xff\xfe\x00",
        b"POST /tx HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ])
    statuses = [status_of(a) for a in answers[:7]]
    assert statuses[3] == 413 and all(s in (400, 431) for i, s in enumerate(statuses) if i != 3), statuses
    assert status_of(answers[-1]) == 200 and b'"target":"/status"' in answers[-1]  # still serving


def test_a_request_that_never_ends_is_dropped_after_the_timeout(monkeypatch):
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.3)
    answers = exchange([b"POST /tx HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc"], read_timeout=5,
                       half_close=False)
    assert answers[0] == b""  # closed without an answer: the body never came whole


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_end_in_an_answer_or_a_close(data):
    answers = exchange([data], read_timeout=2)
    assert status_of(answers[-1]) == 200
    assert answers[0] == b"" or status_of(answers[0]) in (200, 400, 404, 413, 431)


@given(st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()), st.dictionaries(
    st.sampled_from(["op", "table", "key", "value", "expect"]),
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=300), st.floats()))))
def test_ops_from_json_are_checked_field_by_field(raw):
    try:
        op = _op(raw)
    except BadRequest:
        return
    assert op.kind in ("put", "delete", "check") and 0 < len(op.table.encode()) <= 255
    assert op.expect is None or -1 <= op.expect < 2**63


def test_the_client_connection_reads_an_answer_and_survives_a_server_that_closes():
    async def main():
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, lambda s: http.serve_connection(s, _echo), 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            conn = http.HttpConnection(await trio.open_tcp_stream("127.0.0.1", port), f"127.0.0.1:{port}")
            status, answer = await conn.request("POST", "/tx", {"ops": []})
            assert status == 200 and answer["body"] == {"ops": []} and conn.usable
            status, answer = await conn.request("GET", "/again")
            assert status == 200 and answer["target"] == "/again"
            await conn.aclose()
            with pytest.raises(http.HttpFailure):
                await conn.request("GET", "/closed")
            nursery.cancel_scope.cancel()
    trio.run(main)



class _EchoServer(TableServer):
    """The real server's connection handling (limits, admission) with the echo handler."""

    def __init__(self) -> None:
        pass

    async def handle(self, method: str, target: str, body: dict | None) -> tuple[int, dict]:
        if target == "/big":
            return 200, {"pad": "a" * (32 << 20)}
        return await _echo(method, target, body)


def test_connections_over_the_limits_are_closed_at_once_and_a_freed_place_is_served_again():
    async def main():
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(_EchoServer().serve, "127.0.0.1", 0, max_connections=3,
                                               max_connections_per_address=2))

            def connect() -> socket.socket:
                return socket.create_connection(("127.0.0.1", port), timeout=5)

            def status(s: socket.socket) -> int | None:
                s.sendall(b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n")
                return status_of(s.recv(65536))

            first, second = connect(), connect()
            assert await trio.to_thread.run_sync(status, first) == 200
            assert await trio.to_thread.run_sync(status, second) == 200  # both admitted before the third
            third = connect()  # over 2 from this address: closed without a word
            assert await trio.to_thread.run_sync(third.recv, 1) == b""
            third.close()
            second.close()
            await trio.sleep(0.2)  # the server sees the close and frees the place
            fourth = connect()
            assert await trio.to_thread.run_sync(status, fourth) == 200
            for s in (first, fourth):
                s.close()
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_a_client_that_does_not_read_its_answer_is_dropped_after_the_timeout(monkeypatch):
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.3)

    async def main():
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(_EchoServer().serve, "127.0.0.1", 0))
            lazy = socket.create_connection(("127.0.0.1", port), timeout=5)
            lazy.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            await trio.sleep(1.5)  # reads nothing while the server's send waits, then gives up
            assert await trio.to_thread.run_sync(bytes_until_closed, lazy) < 32 << 20  # cut off, not waited for
            lazy.close()
            after = socket.create_connection(("127.0.0.1", port), timeout=5)
            after.sendall(b"GET /after HTTP/1.1\r\nhost: x\r\n\r\n")
            assert status_of(await trio.to_thread.run_sync(after.recv, 65536)) == 200
            after.close()
            nursery.cancel_scope.cancel()
    trio.run(main)
