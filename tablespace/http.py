"""HTTP/1.1 for the table service, on h11 (the sans-I/O HTTP library) over trio streams: the
server's connection loop and the client's connection. Requests and answers are JSON.

Bounded against a hostile peer: a request's head and body are limited (MAX_BODY_BYTES), a
connection must send a whole request within REQUEST_TIMEOUT_S of starting one and take its
answer within as long, and anything h11 refuses closes the connection after a 400. The
server (tablespace/server.py) limits how many connections are open at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from edge.http11 import next_event, read_body

log = logging.getLogger("quire.tablespace.http")

MAX_BODY_BYTES = 8 << 20
MAX_HEAD_BYTES = 16 << 10
REQUEST_TIMEOUT_S = 10.0

Handler = Callable[[str, str, dict[str, Any] | None], Awaitable[tuple[int, dict[str, Any]]]]


class HttpFailure(Exception):
    """The connection broke or the peer spoke no HTTP we accept. `sent`: the request had been
    sent whole (the server may have acted on it)."""

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


async def _send_json(conn: h11.Connection, stream: trio.abc.Stream, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    out = conn.send(h11.Response(status_code=status, headers=headers)) + conn.send(h11.Data(data=data)) \
        + conn.send(h11.EndOfMessage())
    await stream.send_all(out)


async def serve_connection(stream: trio.abc.Stream, handler: Handler) -> None:
    """Answer requests on one connection until the peer closes it or breaks the protocol."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        while True:
            with trio.move_on_after(REQUEST_TIMEOUT_S) as idle:
                event = await next_event(conn, stream)
            if idle.cancelled_caught or isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                raise h11.RemoteProtocolError("expected a request", 400)
            with trio.move_on_after(REQUEST_TIMEOUT_S) as slow:
                raw = await read_body(conn, stream, event, MAX_BODY_BYTES)
            if slow.cancelled_caught:
                return
            body: dict[str, Any] | None = None
            if raw:
                try:
                    body = json.loads(raw)
                except (ValueError, UnicodeDecodeError):
                    body = None
                if not isinstance(body, dict):
                    await _send_json(conn, stream, 400, {"error": "BadRequest", "message": "the body is not a JSON object"})
                    return
            status, answer = await handler(event.method.decode("ascii", "replace"),
                                           event.target.decode("ascii", "replace"), body)
            with trio.move_on_after(REQUEST_TIMEOUT_S) as stuck:
                await _send_json(conn, stream, status, answer)
            if stuck.cancelled_caught:  # a client that does not read its answers holds no task for long
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except h11.RemoteProtocolError as e:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await _send_json(conn, stream, e.error_status_hint, {"error": "BadRequest", "message": str(e)})
            except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
    except (HttpFailure, trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError) as e:
        log.debug("event=http_connection_ended error=%s", e)
    finally:
        await trio.aclose_forcefully(stream)


class HttpConnection:
    """One client connection, for one request at a time (HTTP/1.1 keep-alive)."""

    def __init__(self, stream: trio.abc.Stream, host: str) -> None:
        self.stream, self.host = stream, host
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.usable = True  # False once broken or closed by the server: open another
        self.last_used = trio.current_time()

    async def request(self, method: str, target: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer); HttpFailure if the connection broke (then it is unusable)."""
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = [("host", self.host), ("content-length", str(len(data)))]
        if data:
            headers.append(("content-type", "application/json"))
        sent = False
        try:
            out = self.conn.send(h11.Request(method=method, target=target, headers=headers))
            out += self.conn.send(h11.Data(data=data)) if data else b""
            out += self.conn.send(h11.EndOfMessage())
            await self.stream.send_all(out)
            sent = True
            event = await next_event(self.conn, self.stream)
            if not isinstance(event, h11.Response):
                raise HttpFailure(f"expected a response, got {type(event).__name__}", sent)
            raw = await read_body(self.conn, self.stream, event, MAX_BODY_BYTES)
            answer = json.loads(raw) if raw else {}
            if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                self.conn.start_next_cycle()
            else:
                self.usable = False  # the server closes it after this answer
            self.last_used = trio.current_time()
            return event.status_code, answer
        except HttpFailure as e:
            self.usable = False
            raise HttpFailure(str(e), sent) from None
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, ValueError, OSError) as e:
            self.usable = False
            raise HttpFailure(f"{type(e).__name__}: {e}", sent) from None

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
