"""The admin port: a deliberately tiny HTTP/1.1 server, and the client clusterctl uses.

    GET /status   -> the node's status as JSON
    GET /metrics  -> Prometheus text format (edge/metrics.py, clusterd/daemon/status_metrics.py)
    GET /commands/<name> -> ZooKeeper's AdminServer commands, read-only (metastore/edge/admin_commands.py)

With [tls] admin = true (the default of a [tls] table) the port speaks HTTPS and
requires a client certificate of the cluster CA (curl --cacert ca.pem --cert
client-NAME.pem --key client-NAME.key https://host:port/status).

One request per connection (the response says `Connection: close`). The request
head is bounded in size and must arrive within a timeout, so a stuck or hostile
client costs one small task for a few seconds; anything else gets 400, 404 or
405 and the connection closes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from clusterd.daemon.status_metrics import StatusCollector
from clusterd.daemon.tls_streams import ClientTls, ServerTls
from edge import metrics

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD_BYTES = 8 << 10
READ_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 4 << 20
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout"}


class HttpError(Exception):
    """The request cannot be served; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AdminUnavailable(Exception):
    """A node's admin port did not give a usable answer."""


class AdminServer:
    """Answers /status and /metrics from `status`, a function returning the node's status."""

    def __init__(self, status: Callable[[], dict[str, Any]], *, tls: ServerTls | None = None,
                 commands: Callable[[str], dict | None] | None = None) -> None:
        self._status = status
        self._tls = tls
        self._commands = commands  # ZooKeeper's AdminServer commands: only where a client port runs

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        if self._tls is not None:
            stream = await self._tls.accept(stream)  # None: refused, closed and logged by the TLS layer
            if stream is None:
                return
        try:
            async with stream:
                await stream.send_all(await self._respond(stream))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left before the answer; nothing to clean up

    async def _respond(self, stream: trio.abc.Stream) -> bytes:
        try:
            with trio.fail_after(READ_TIMEOUT_S):
                head = await _read_head(stream)
            return self._route(*parse_request_head(head))
        except trio.TooSlowError:
            return _response(408, "text/plain", b"request head not received in time\n")
        except HttpError as e:
            return _response(e.status, "text/plain", f"{e}\n".encode())

    def _route(self, method: str, target: str) -> bytes:
        path = target.split("?", 1)[0]
        if path not in ("/status", "/metrics", "/commands") and not path.startswith("/commands/"):
            raise HttpError(404, f"no such path {path!r}: try /status, /metrics or /commands")
        if method != "GET":
            raise HttpError(405, f"method {method} not allowed: use GET")
        if path.startswith("/commands"):
            return self._command(path)
        if path == "/status":
            return _response(200, "application/json", json.dumps(self._status(), default=str).encode() + b"\n")
        return _response(200, CONTENT_TYPE_LATEST, render_metrics(self._status))


    def _command(self, path: str) -> bytes:
        if self._commands is None:
            raise HttpError(404, "this node has no client port: ZooKeeper's admin commands are served by voters "
                                 "and observers")
        name = path[len("/commands"):].strip("/")
        answer = self._commands(name or "")
        if answer is None:
            raise HttpError(404, f"no command {name!r}: GET /commands lists them")
        return _response(200, "application/json", json.dumps(answer, default=str).encode() + b"\n")


async def _read_head(stream: trio.abc.Stream) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_REQUEST_HEAD_BYTES:
            raise HttpError(400, f"request head larger than {MAX_REQUEST_HEAD_BYTES} bytes")
        data = await stream.receive_some(MAX_REQUEST_HEAD_BYTES)
        if not data:
            raise HttpError(400, "connection closed inside the request head")
        head += data
    return head.split(b"\r\n\r\n", 1)[0]


def parse_request_head(head: bytes) -> tuple[str, str]:
    """(method, target) of an HTTP/1.x request head; HttpError(400) if malformed."""
    request_line = head.split(b"\r\n", 1)[0]
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        raise HttpError(400, "malformed request line")
    try:
        return parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "request line is not ASCII") from None


def _response(status: int, content_type: str, body: bytes) -> bytes:
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def render_metrics(status: Callable[[], dict[str, Any]]) -> bytes:
    """Prometheus text: this process's histograms and counters (edge/metrics.py), then the gauges
    read from the node's status now (clusterd/daemon/status_metrics.py)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    return generate_latest(metrics.REGISTRY) + generate_latest(registry)


async def fetch_status(host: str, port: int, *, timeout_s: float = 2.0,
                       tls: ClientTls | None = None) -> dict[str, Any]:
    """GET /status from a node's admin port (over HTTPS with `tls`); AdminUnavailable if it does
    not answer well."""
    try:
        with trio.fail_after(timeout_s):
            raw = await _http_get(host, port, "/status", tls)
    except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
        raise AdminUnavailable(f"{host}:{port}: {e or type(e).__name__}") from None
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise AdminUnavailable(f"{host}:{port}: unexpected answer {head[:80]!r}")
    try:
        status = json.loads(body)
    except ValueError as e:
        raise AdminUnavailable(f"{host}:{port}: status is not JSON: {e}") from None
    if not isinstance(status, dict):
        raise AdminUnavailable(f"{host}:{port}: status is not a JSON object")
    return status


async def _http_get(host: str, port: int, path: str, tls: ClientTls | None) -> bytes:
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if tls is not None:
        stream = await tls.wrap(stream, host)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks, size = [], 0
        while data := await stream.receive_some(64 << 10):
            size += len(data)
            if size > MAX_RESPONSE_BYTES:
                raise AdminUnavailable(f"{host}:{port}: response larger than {MAX_RESPONSE_BYTES} bytes")
            chunks.append(data)
    return b"".join(chunks)
