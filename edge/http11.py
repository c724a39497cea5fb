"""Reading HTTP/1.1 messages with h11 (the sans-I/O HTTP library) from trio streams, bounded in
size, for Quire's HTTP servers and clients: the admin port and its client (clusterd/daemon/) and
the table service (tablespace/http.py). Each of them keeps its own time bounds.

What h11 or a bound refuses raises h11.RemoteProtocolError, whose `error_status_hint` is the
status a server answers with (400, or 413 for a body over the limit).
"""

from __future__ import annotations

from typing import Any

import h11
import trio

READ_BYTES = 64 << 10


async def next_event(conn: h11.Connection, stream: trio.abc.Stream) -> Any:
    """The connection's next h11 event, receiving as much as that needs."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(READ_BYTES))  # b"": the end, which h11 reports


def content_length(message: h11.Request | h11.Response) -> int | None:
    """The message's Content-Length (h11 has checked it is a number), or None without one."""
    for name, value in message.headers:
        if name == b"content-length":  # h11 gives header names lower-cased
            return int(value)
    return None


async def read_body(conn: h11.Connection, stream: trio.abc.Stream, message: h11.Request | h11.Response,
                    max_bytes: int) -> bytes:
    """The body of `message` (the event just read), whole; refused as soon as it is known to be
    over `max_bytes`: from its Content-Length before reading, else as its chunks arrive."""
    length = content_length(message)
    if length is not None and length > max_bytes:
        raise h11.RemoteProtocolError(f"body of {length} bytes is over {max_bytes}", 413)
    parts, size = [], 0
    while True:
        event = await next_event(conn, stream)
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > max_bytes:
                raise h11.RemoteProtocolError(f"body over {max_bytes} bytes", 413)
            parts.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        else:  # ConnectionClosed: h11 reports a message cut short by the end of the stream this way
            raise h11.RemoteProtocolError("the connection closed inside a message", 400)
