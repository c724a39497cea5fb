"""The admin port's HTTP reading (clusterd/daemon/admin_http.py, on h11) against hostile bytes:
whatever arrives, the server answers an HTTP status or closes, never raises, never waits past its
timeout, and never changes anything for a request it refused."""

from __future__ import annotations

import json
import socket
from functools import partial

import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from clusterd.daemon import admin
from clusterd.daemon.admin import AdminServer
from clusterd.daemon.admin_http import Answer
from cluster_fixtures import bytes_until_closed

STATUS = {"role": "leader", "epoch": 1, "peers": [], "log": {"queued": 0}}


def serve(data: bytes, *, close: bool = True) -> bytes:
    """What the server writes back for `data` (then the end of the client's stream, if `close`)."""
    calls: list[str] = []

    async def api(request):
        calls.append(request.method)
        return Answer(200, "application/json", b"{}\n")

    server = AdminServer(lambda: dict(STATUS), commands=lambda name: {"command": name} if name == "ruok" else None,
                         api=api)

    async def main() -> bytes:
        client, srv = trio.testing.memory_stream_pair()
        out = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve_stream, srv)
            await client.send_all(data)
            if close:
                await client.send_eof()
            with trio.fail_after(30):
                while chunk := await client.receive_some(65536):
                    out += chunk
        return out

    answer = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not calls or answer.startswith(b"HTTP/1.1 200"), calls
    return answer


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ")[1]) if answer.startswith(b"HTTP/1.1 ") else None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_get_an_error_status_or_a_close(data: bytes) -> None:
    answer = serve(data)
    assert answer == b"" or status_of(answer) in (200, 400, 404, 405, 408, 413, 431)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([b"GET", b"PUT", b"POST", b"DELETE", b"G\x00T"]),
       st.sampled_from([b"/", b"/status", b"/metrics", b"/cluster", b"/commands/ruok", b"/commands/x",
                        b"/api/v1/bookie/gc", b"/api/v1/%00", b"//", b"*", b"/\xff"]),
       st.binary(max_size=300), st.integers(min_value=-5, max_value=1 << 40))
def test_mangled_requests_are_answered_or_refused(method, path, body, length) -> None:
    head = method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(length).encode() + b"\r\n\r\n"
    answer = serve(head + body)
    assert answer == b"" or status_of(answer) is not None


def test_a_stalled_request_gets_408() -> None:
    assert status_of(serve(b"GET /status HTTP/1.1\r\nHost: x\r\n", close=False)) == 408


def test_good_requests_are_served() -> None:
    answer = serve(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 200 and json.loads(answer.split(b"\r\n\r\n", 1)[1]) == STATUS
    assert b"quire_role" in serve(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(serve(b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")) == 200
    assert status_of(serve(b"GET /commands/ruok HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
    assert status_of(serve(b"GET /commands/nope HTTP/1.1\r\nHost: x\r\n\r\n")) == 404


def test_connections_over_the_limit_are_closed_at_once_and_a_lazy_reader_is_let_go(monkeypatch) -> None:
    """On a real socket: the 17th connection from one address is closed without a word while 16
    wait; a client that never reads a large answer holds its task only SEND_TIMEOUT_S."""
    monkeypatch.setattr(admin, "SEND_TIMEOUT_S", 0.3)
    big = {"pad": "x" * (32 << 20)}
    server = AdminServer(lambda: big)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(partial(trio.serve_tcp, server.handle_connection, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            waiting = [socket.create_connection(("127.0.0.1", port)) for _ in range(admin.MAX_CONNECTIONS_PER_ADDRESS)]
            while server.connections.open < len(waiting):  # each admitted by its own task, in any order
                await trio.sleep(0.01)
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert await trio.to_thread.run_sync(extra.recv, 1) == b""  # closed at once, not after a timeout
            extra.close()
            for s in waiting:
                s.close()
            while server.connections.open:  # the server sees them go
                await trio.sleep(0.01)

            lazy = socket.create_connection(("127.0.0.1", port), timeout=5)
            lazy.sendall(b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n")
            while not server.connections.open:  # admitted, then its answer waits for a reader ...
                await trio.sleep(0.01)
            while server.connections.open:  # ... until the server gives up on it and lets it go
                await trio.sleep(0.01)
            assert await trio.to_thread.run_sync(bytes_until_closed, lazy) < 32 << 20  # cut off, not waited for
            lazy.close()
            nursery.cancel_scope.cancel()
    trio.run(main)
