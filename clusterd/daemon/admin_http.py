"""HTTP/1.1 on the admin port, on h11 (the sans-I/O HTTP library): one request per
connection, read whole within a bounded size and time, and its answer.

Bounds against a hostile client: the request head at most MAX_HEAD_BYTES, a body at most
MAX_BODY_BYTES (only the BookKeeper API's mutations carry one), the whole request within
READ_TIMEOUT_S; anything h11 refuses gets a 400 and the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import trio

from edge.http11 import next_event, read_body

MAX_HEAD_BYTES = 8 << 10
MAX_BODY_BYTES = 64 << 10
READ_TIMEOUT_S = 5.0


class HttpError(Exception):
    """The request cannot be served; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)  # the first value of each parameter
    body: bytes = b""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


async def read_request(conn: h11.Connection, stream: trio.abc.Stream) -> Request:
    """The next request, whole; HttpError(400 or 413) for what h11 or the bounds refuse."""
    try:
        event = await next_event(conn, stream)
        if isinstance(event, h11.ConnectionClosed):
            raise HttpError(400, "connection closed before a whole request")
        if not isinstance(event, h11.Request):
            raise HttpError(400, "expected a request")
        body = await read_body(conn, stream, event, MAX_BODY_BYTES)
    except h11.RemoteProtocolError as e:
        raise HttpError(400 if e.error_status_hint < 400 else e.error_status_hint, f"bad request: {e}") from None
    target = urlsplit(event.target.decode("ascii", "replace"))
    if not target.path.startswith("/"):
        raise HttpError(400, "the request target is not a path")
    query = {k: v[0] for k, v in parse_qs(target.query, keep_blank_values=True).items()}
    return Request(event.method.decode("ascii", "replace"), unquote(target.path), query, body)


async def send_answer(conn: h11.Connection, stream: trio.abc.Stream, answer: Answer) -> None:
    """The answer, then the connection is done (`Connection: close`). h11 lets a server answer
    a request it could not parse (a 400); if it will not send on the connection at all, nothing
    is sent and the caller closes it."""
    headers = [("content-type", answer.content_type), ("content-length", str(len(answer.body))),
               ("connection", "close")]
    try:
        data = (conn.send(h11.Response(status_code=answer.status, headers=headers))
                + conn.send(h11.Data(data=answer.body)) + conn.send(h11.EndOfMessage()))
    except h11.LocalProtocolError:
        return
    await stream.send_all(data)
