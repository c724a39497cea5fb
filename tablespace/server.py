"""A tablespace replica's network API (edge): JSON over HTTP/1.1 (tablespace/http.py).

    POST /tx      {"ops": [{"op": "put"|"delete"|"check", "table": T, "key": K, "value": V, "expect": N}, ...]}
                  -> 200 {"results": [...], "position": "seg:entry:slot" | null}
    POST /txs     {"txs": [{"ops": [...]}, ...]}: independent transactions in one request (the
                  client's batching), run concurrently -> 200 {"results": [{"results": [...],
                  "position": ...} | {"error": NAME, "message": ...}, ...]}
    GET  /get?table=T&key=K                      -> 200 {"value": V, "version": N} | 404
    GET  /scan?table=T&start=K&end=K&limit=N     -> 200 {"items": [[K, V, N], ...]}
    GET  /status                                 -> 200 the replica's role, position, keys, digest

Keys and values are strings (UTF-8). Writes and reads go to the leader: another replica answers
421 {"error": "NotLeader", "leader": "host:port" | null}. A failed condition is 409 VersionMismatch,
a malformed request 400, a change whose outcome is unknown (the leader was deposed while writing
it) 503 OutcomeUnknown.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trio

from edge.sockets import ConnectionCounts, admitted
from tablespace.errors import BadRequest, NotLeader, OutcomeUnknown, TableError, VersionMismatch
from tablespace.http import serve_connection
from tablespace.leading import Op
from tablespace.replica import Replica

log = logging.getLogger("quire.tablespace.server")

MAX_OPS = 1000
MAX_SCAN = 10_000
MAX_CONNECTIONS = 1024  # open at once; each costs a task and its buffers
MAX_CONNECTIONS_PER_ADDRESS = 60  # from one client address, as the client and bookie ports' default
_STATUS = {NotLeader: 421, VersionMismatch: 409, OutcomeUnknown: 503, BadRequest: 400}


def _op(raw: Any) -> Op:
    if not isinstance(raw, dict):
        raise BadRequest("each op is a JSON object")
    kind, table, key = raw.get("op"), raw.get("table"), raw.get("key")
    value, expect = raw.get("value", ""), raw.get("expect")
    if not all(isinstance(x, str) for x in (kind, table, key, value)):
        raise BadRequest("op, table, key and value are strings")
    if expect is not None and (type(expect) is not int):
        raise BadRequest("expect is an integer (-1: the key must be absent)")
    op = Op(kind, table, key.encode(), value.encode(), expect)
    op.check()
    return op


class TableServer:
    """Routes requests to a Replica."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    async def serve(self, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS,
                    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve clients at host:port (0: any free port, given to task_status). Connections over
        either limit are closed at once, as the bookie and client ports do."""
        counts = ConnectionCounts(max_connections_per_address, max_connections,
                                  per_address_setting="--max-connections-per-address",
                                  total_setting="--max-connections")
        listeners = await trio.open_tcp_listeners(port, host=host)
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(partial(self._connection, counts), listeners)

    async def _connection(self, counts: ConnectionCounts, stream: trio.SocketStream) -> None:
        async with admitted(counts, stream) as refused:
            if refused is not None:
                log.info("event=connection_refused reason=%r", refused)
                return
            await serve_connection(stream, self.handle)

    async def handle(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if url.path == "/status" and method == "GET":
                return 200, self.replica.status()
            if url.path == "/tx" and method == "POST":
                return 200, await self._tx(body)
            if url.path == "/txs" and method == "POST":
                return 200, await self._txs(body)
            if url.path == "/get" and method == "GET":
                return self._get(query)
            if url.path == "/scan" and method == "GET":
                return 200, self._scan(query)
            return 404, {"error": "NotFound", "message": f"no {method} {url.path}: see tablespace/server.py"}
        except TableError as e:
            status = next((s for cls, s in _STATUS.items() if isinstance(e, cls)), 500)
            answer = {"error": type(e).__name__, "message": str(e)}
            if isinstance(e, NotLeader):
                answer["leader"] = e.leader
            return status, answer

    async def _tx(self, body: dict[str, Any] | None) -> dict[str, Any]:
        ops = (body or {}).get("ops")
        if not isinstance(ops, list) or not 0 < len(ops) <= MAX_OPS:
            raise BadRequest(f'the body is {{"ops": [...]}} with 1 to {MAX_OPS} ops')
        results, position = await self.replica.transact([_op(o) for o in ops])
        return {"results": results, "position": None if position is None else str(position)}

    async def _txs(self, body: dict[str, Any] | None) -> dict[str, Any]:
        txs = (body or {}).get("txs")
        if not isinstance(txs, list) or not 0 < len(txs) <= MAX_OPS:
            raise BadRequest(f'the body is {{"txs": [{{"ops": [...]}}, ...]}} with 1 to {MAX_OPS} transactions')
        self._leading()
        results: list[dict[str, Any]] = [{}] * len(txs)

        async def one(i: int, tx: Any) -> None:
            try:
                results[i] = await self._tx(tx if isinstance(tx, dict) else None)
            except TableError as e:
                results[i] = {"error": type(e).__name__, "message": str(e)}
        async with trio.open_nursery() as nursery:  # concurrent: their records share entries
            for i, tx in enumerate(txs):
                nursery.start_soon(one, i, tx)
        return {"results": results}

    def _leading(self) -> None:
        if self.replica.role != "leader":
            raise NotLeader(f"replica {self.replica.replica_id} does not lead: read at the leader",
                            self.replica.leader_address)

    def _get(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self._leading()
        table, key = query.get("table"), query.get("key")
        if table is None or key is None:
            raise BadRequest("get needs table= and key=")
        found = self.replica.state.get(table, key.encode())
        if found is None:
            return 404, {"error": "NoKey", "message": f"no key {key!r} in table {table!r}"}
        return 200, {"value": found[0].decode("utf-8", "replace"), "version": found[1]}

    def _scan(self, query: dict[str, str]) -> dict[str, Any]:
        self._leading()
        table = query.get("table")
        if table is None:
            raise BadRequest("scan needs table=")
        try:
            limit = min(int(query.get("limit", MAX_SCAN)), MAX_SCAN)
        except ValueError:
            raise BadRequest("limit is an integer") from None
        end = query.get("end")
        items = self.replica.state.scan(table, query.get("start", "").encode(), None if end is None else end.encode(),
                                        limit)
        return {"items": [[k.decode("utf-8", "replace"), v.decode("utf-8", "replace"), n] for k, v, n in items]}
