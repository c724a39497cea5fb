"""The admin port: a small HTTP/1.1 server, and the client clusterctl uses.

    GET /         -> the status page (clusterd/daemon/status_page.py), polling:
    GET /cluster  -> every node's status, as this node fetched it now
    GET /status   -> the node's status as JSON
    GET /metrics  -> Prometheus text format (edge/metrics.py, clusterd/daemon/status_metrics.py)
    GET /commands/<name> -> ZooKeeper's AdminServer commands, read-only (metastore/edge/admin_commands.py)
    GET|PUT /api/v1/... -> BookKeeper's HTTP API on bookie nodes (clusterd/daemon/bookkeeper_api.py)

With [tls] admin = true (the default of a [tls] table) the port speaks HTTPS and
requires a client certificate of the cluster CA (curl --cacert ca.pem --cert
client-NAME.pem --key client-NAME.key https://host:port/status).

One request per connection (the response says `Connection: close`), parsed by h11
(clusterd/daemon/admin_http.py): the request is bounded in size and must arrive
within a timeout, so a stuck or hostile client costs one small task for a few
seconds; anything else gets 400, 404, 405 or 413 and the connection closes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from clusterd.daemon.admin_http import (MAX_HEAD_BYTES, READ_TIMEOUT_S, Answer, HttpError, Request, read_request,
                                        send_answer)
from clusterd.daemon.status_metrics import StatusCollector
from clusterd.daemon.status_page import PAGE
from clusterd.daemon.tls_streams import ClientTls, ServerTls
from edge import metrics

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 4 << 20

Api = Callable[[Request], Awaitable[Answer | None]]


class AdminUnavailable(Exception):
    """A node's admin port did not give a usable answer."""


class AdminServer:
    """Answers the admin port's paths (module doc) from `status`, a function returning the node's
    status, and the optional parts a node has: ZooKeeper's commands (where a client port runs),
    the cluster view, and the BookKeeper API (`api`: None for a path it does not serve)."""

    def __init__(self, status: Callable[[], dict[str, Any]], *, tls: ServerTls | None = None,
                 commands: Callable[[str], dict | None] | None = None,
                 cluster: Callable[[], Awaitable[dict[str, Any]]] | None = None,
                 api: Api | None = None) -> None:
        self._status = status
        self._tls = tls
        self._cluster = cluster  # every node's status, for the status page
        self._commands = commands  # ZooKeeper's AdminServer commands: only where a client port runs
        self._api = api  # BookKeeper's /api/v1 (clusterd/daemon/bookkeeper_api.py): bookie nodes

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        if self._tls is not None:
            stream = await self._tls.accept(stream)  # None: refused, closed and logged by the TLS layer
            if stream is None:
                return
        try:
            async with stream:
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
                await send_answer(conn, stream, await self._respond(conn, stream))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left before the answer; nothing to clean up

    async def _respond(self, conn: h11.Connection, stream: trio.abc.Stream) -> Answer:
        try:
            with trio.fail_after(READ_TIMEOUT_S):
                request = await read_request(conn, stream)
            return await self._route(request)
        except trio.TooSlowError:
            return _text(408, "request not received in time")
        except HttpError as e:
            return _text(e.status, str(e))

    async def _route(self, request: Request) -> Answer:
        path = request.path
        if path.startswith("/api/v1/"):
            answer = None if self._api is None else await self._api(request)
            if answer is None:
                raise HttpError(404, f"no such path {path!r} (BookKeeper's /api/v1 is served by bookie nodes)")
            return answer
        if path not in ("/", "/cluster", "/status", "/metrics", "/commands") and not path.startswith("/commands/"):
            raise HttpError(404, f"no such path {path!r}: try /, /status, /metrics, /commands or /api/v1/...")
        if request.method != "GET":
            raise HttpError(405, f"method {request.method} not allowed: use GET")
        if path == "/":
            return Answer(200, "text/html; charset=utf-8", PAGE.encode())
        if path == "/cluster":
            view = {"nodes": [{"status": self._status()}]} if self._cluster is None else await self._cluster()
            return json_answer(view)
        if path.startswith("/commands"):
            return self._command(path)
        if path == "/status":
            return json_answer(self._status())
        return Answer(200, CONTENT_TYPE_LATEST, render_metrics(self._status))

    def _command(self, path: str) -> Answer:
        if self._commands is None:
            raise HttpError(404, "this node has no client port: ZooKeeper's admin commands are served by voters "
                                 "and observers")
        name = path[len("/commands"):].strip("/")
        answer = self._commands(name or "")
        if answer is None:
            raise HttpError(404, f"no command {name!r}: GET /commands lists them")
        return json_answer(answer)


def json_answer(value: Any, status: int = 200) -> Answer:
    return Answer(status, "application/json", json.dumps(value, default=str).encode() + b"\n")


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", f"{message}\n".encode())


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
