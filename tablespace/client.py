"""The table service's Python client (edge): finds a tablespace's leader through the metastore,
sends it requests over a small pool of HTTP connections, and follows the leader when it changes.
Transactions started concurrently (by many tasks) go out together: whatever is queued when a
request can leave is one POST /txs, up to MAX_BATCH of them, with MAX_IN_FLIGHT such requests
outstanding, so the HTTP cost is shared and the leader's records share ledger entries.

    async with MetaClient(hosts) as meta, TableClient(meta, "shop") as t:
        version = await t.put("orders", "o1", "new")              # 0
        await t.put("orders", "o1", "paid", expect=version)       # compare-and-set: 1
        value, version = await t.get("orders", "o1")
        await t.transact([put(...), delete(...), check(...)])     # all or nothing, one change
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlencode

import trio

from metastore.client import MetaClient
from metastore.errors import NoNode
from tablespace.errors import BadRequest, NotLeader, OutcomeUnknown, TableError, VersionMismatch
from tablespace.http import HttpConnection, HttpFailure
from tablespace.paths import leader_path

RETRY_S = 0.1
MAX_BATCH = 64
MAX_IN_FLIGHT = 4
IDLE_S = 5.0  # an idle connection is not reused after this (the server closes them after REQUEST_TIMEOUT_S)
DEFAULT_TIMEOUT_S = 30.0
_ERRORS: dict[str, type[TableError]] = {"VersionMismatch": VersionMismatch, "OutcomeUnknown": OutcomeUnknown,
                                        "BadRequest": BadRequest, "NotLeader": NotLeader}


def put(table: str, key: str, value: str, expect: int | None = None) -> dict[str, Any]:
    return {"op": "put", "table": table, "key": key, "value": value, "expect": expect}


def delete(table: str, key: str, expect: int | None = None) -> dict[str, Any]:
    return {"op": "delete", "table": table, "key": key, "expect": expect}


def check(table: str, key: str, expect: int) -> dict[str, Any]:
    return {"op": "check", "table": table, "key": key, "expect": expect}


class _Queued:
    __slots__ = ("ops", "done", "results", "error", "deadline")

    def __init__(self, ops: list[dict[str, Any]], deadline: float) -> None:
        self.ops, self.deadline = ops, deadline
        self.done = trio.Event()
        self.results: list[int | None] = []
        self.error: Exception | None = None


class TableClient:
    """A client of one tablespace, used as `async with` (its sender runs in a nursery of its own).
    Requests that find no leader (none yet, a failover, a replica that is not the leader) are
    retried until `timeout_s`; a change whose outcome is unknown is not retried (OutcomeUnknown)."""

    def __init__(self, meta: MetaClient, tablespace: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.meta, self.tablespace, self.timeout_s = meta, tablespace, timeout_s
        self.leader: str | None = None
        self._idle: list[HttpConnection] = []
        self.redirects = 0
        self.requests = 0  # HTTP requests sent (batches count once)
        self._queue: list[_Queued] = []
        self._wake = trio.Event()
        self._in_flight = 0
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> TableClient:
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._nursery.start_soon(self._sender)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await self._stack.__aexit__(None, None, None)
        for c in self._idle:
            await c.aclose()
        self._idle.clear()

    # -- operations ---------------------------------------------------------------------------
    async def transact(self, ops: list[dict[str, Any]]) -> list[int | None]:
        """Each op's result (a put's new version, a check's version, None for a delete)."""
        assert self._nursery is not None, "use the client as `async with TableClient(...) as t`"
        queued = _Queued(ops, trio.current_time() + self.timeout_s)
        self._queue.append(queued)
        self._wake.set()
        await queued.done.wait()
        if queued.error is not None:
            raise queued.error
        return queued.results

    async def _sender(self) -> None:
        while True:
            if not self._queue or self._in_flight >= MAX_IN_FLIGHT:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self._in_flight += 1
            assert self._nursery is not None
            self._nursery.start_soon(self._send, batch)

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            answer = await self._call("POST", "/txs", {"txs": [{"ops": q.ops} for q in batch]})
            retry = []
            for q, item in zip(batch, answer["results"]):
                if item.get("error") == "NotLeader" and trio.current_time() < q.deadline:
                    retry.append(q)  # deposed before this one was written: safe to send again
                elif "error" in item:
                    q.error = _ERRORS.get(item["error"], TableError)(item.get("message", item["error"]))
                else:
                    q.results = item["results"]
            if retry:
                self.leader = None
                self._queue[:0] = retry
                batch = [q for q in batch if q not in retry]
        except TableError as e:
            for q in batch:
                q.error = e
        finally:
            for q in batch:
                q.done.set()
            self._in_flight -= 1
            self._wake.set()

    async def put(self, table: str, key: str, value: str, expect: int | None = None) -> int:
        """The key's new version (0 when created). With `expect` (a version, or -1: absent), a
        compare-and-set: VersionMismatch if the key is not at it."""
        return (await self.transact([put(table, key, value, expect)]))[0]  # type: ignore[return-value]

    async def delete(self, table: str, key: str, expect: int | None = None) -> None:
        await self.transact([delete(table, key, expect)])

    async def get(self, table: str, key: str) -> tuple[str, int] | None:
        answer = await self._call("GET", "/get?" + urlencode({"table": table, "key": key}), None, missing_ok=True)
        return None if answer is None else (answer["value"], answer["version"])

    async def scan(self, table: str, start: str = "", end: str | None = None, limit: int = 10_000
                   ) -> list[tuple[str, str, int]]:
        query = {"table": table, "start": start, "limit": limit} | ({} if end is None else {"end": end})
        return [tuple(i) for i in (await self._call("GET", "/scan?" + urlencode(query), None))["items"]]

    # -- the leader ---------------------------------------------------------------------------
    async def find_leader(self) -> str | None:
        try:
            data, _ = await self.meta.get(leader_path(self.tablespace))
            self.leader = json.loads(data)["address"]
        except (NoNode, ValueError, KeyError, TypeError):  # TypeError: null data or not an object
            self.leader = None
        return self.leader

    async def _call(self, method: str, target: str, body: dict[str, Any] | None, *, missing_ok: bool = False) -> Any:
        deadline = trio.current_time() + self.timeout_s
        last: Exception | None = None
        while trio.current_time() < deadline:
            if self.leader is None and await self.find_leader() is None:
                last = NotLeader(f"tablespace {self.tablespace!r} has no leader yet")
                await trio.sleep(RETRY_S)
                continue
            try:
                status, answer = await self._request(method, target, body)
            except (HttpFailure, OSError, trio.TooSlowError) as e:
                if method == "POST" and isinstance(e, HttpFailure) and e.sent:
                    raise OutcomeUnknown(f"the connection to the leader broke after the request was sent ({e}): "
                                         "read the keys before retrying") from None
                last, self.leader = e, None
                await trio.sleep(RETRY_S)
                continue
            if status == 200:
                return answer
            if status == 404 and missing_ok:
                return None
            if status == 421:
                self.redirects += 1
                asked, self.leader = self.leader, answer.get("leader") or None
                if self.leader in (None, asked):  # no news: ask the metastore again, after a pause
                    self.leader = None
                    await trio.sleep(RETRY_S)
                last = NotLeader(answer.get("message", "not the leader"), self.leader)
                continue
            error = _ERRORS.get(answer.get("error", ""), TableError)
            raise error(answer.get("message", f"HTTP {status}"))
        raise NotLeader(f"tablespace {self.tablespace!r}: no leader answered within {self.timeout_s} s "
                        f"(last: {last})")

    async def _request(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        address = self.leader
        assert address is not None
        now = trio.current_time()
        for stale in [c for c in self._idle if now - c.last_used > IDLE_S]:  # the server may close it any time
            self._idle.remove(stale)
            await stale.aclose()
        conn = next((c for c in self._idle if c.host == address), None)
        if conn is not None:
            self._idle.remove(conn)
        else:
            host, _, port = address.rpartition(":")
            with trio.fail_after(5):
                stream = await trio.open_tcp_stream(host, int(port))
            conn = HttpConnection(stream, address)
        self.requests += 1
        try:
            answer = await conn.request(method, target, body)
        except BaseException:
            await conn.aclose()
            raise
        if conn.usable and address == self.leader:
            self._idle.append(conn)
        else:
            await conn.aclose()
        return answer

