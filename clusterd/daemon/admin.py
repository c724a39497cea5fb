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
within a timeout and its answer taken within another, so a stuck or hostile client costs
one small task for a few seconds; anything else gets 400, 404, 405 or 413 and the connection
closes. At most MAX_CONNECTIONS are open (MAX_CONNECTIONS_PER_ADDRESS from one address); more
are closed at once.
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
from edge.http11 import next_event, read_body
from edge.sockets import ConnectionCounts, admitted

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 4 << 20
# Open connections: a monitor, a status page or two and clusterctl need a few; more are closed
# at once, as the client and bookie ports do over their limits.
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_ADDRESS = 16
SEND_TIMEOUT_S = 5.0  # to take an answer (a /metrics or /commands/dump can be a few MB)

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
        self.connections = ConnectionCounts(MAX_CONNECTIONS_PER_ADDRESS, MAX_CONNECTIONS,
                                             per_address_setting="admin.MAX_CONNECTIONS_PER_ADDRESS",
                                             total_setting="admin.MAX_CONNECTIONS")

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection, or close it at once over the connection limits."""
        async with admitted(self.connections, stream) as refused:
            if refused is not None:
                log.info("event=admin_connection_refused reason=%r", refused)
                return
            await self.serve_stream(stream)

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one connection, admitted already (handle_connection admits a socket's)."""
        if self._tls is not None:
            stream = await self._tls.accept(stream)  # None: refused, closed and logged by the TLS layer
            if stream is None:
                return
        try:
            async with stream:
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
                answer = await self._respond(conn, stream)
                with trio.move_on_after(SEND_TIMEOUT_S) as stuck:  # a client that does not read is let go
                    await send_answer(conn, stream, answer)
                if stuck.cancelled_caught:  # without a TLS goodbye it would not read either
                    await trio.aclose_forcefully(stream)
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
    not answer well: no connection, no whole answer within `timeout_s`, an answer h11 refuses,
    a status other than 200, a body over MAX_RESPONSE_BYTES or not a JSON object."""
    where = f"{host}:{port}"
    try:
        with trio.fail_after(timeout_s):
            body = await _http_get(host, port, "/status", tls)
    except trio.TooSlowError:
        raise AdminUnavailable(f"{where}: no whole answer within {timeout_s} s") from None
    except (OSError, trio.BrokenResourceError) as e:
        raise AdminUnavailable(f"{where}: {e or type(e).__name__}") from None
    except h11.RemoteProtocolError as e:
        if e.error_status_hint == 413:  # edge/http11.read_body's bound
            raise AdminUnavailable(f"{where}: answer larger than {MAX_RESPONSE_BYTES} bytes") from None
        raise AdminUnavailable(f"{where}: malformed HTTP answer: {e}") from None
    try:
        status = json.loads(body)
    except ValueError as e:
        raise AdminUnavailable(f"{where}: status is not JSON: {e}") from None
    if not isinstance(status, dict):
        raise AdminUnavailable(f"{where}: status is not a JSON object")
    return status


async def _http_get(host: str, port: int, path: str, tls: ClientTls | None) -> bytes:
    """The body of a 200 answer to GET `path`, read by h11 (edge/http11.py, as the server reads
    requests); AdminUnavailable for another status, h11.RemoteProtocolError for what is not
    HTTP/1.1 or a body over MAX_RESPONSE_BYTES (error_status_hint 413). One request per connection."""
    where = f"{host}:{port}"
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if tls is not None:
        stream = await tls.wrap(stream, host)
    async with stream:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        request = h11.Request(method="GET", target=path, headers=[("host", host), ("connection", "close")])
        await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        response = await next_event(conn, stream)
        while isinstance(response, h11.InformationalResponse):  # a 1xx precedes the answer
            response = await next_event(conn, stream)
        if not isinstance(response, h11.Response):
            raise AdminUnavailable(f"{where}: connection closed before an answer")
        if response.status_code != 200:
            raise AdminUnavailable(f"{where}: HTTP {response.status_code} {response.reason.decode('ascii', 'replace')}")
        return await read_body(conn, stream, response, MAX_RESPONSE_BYTES)
