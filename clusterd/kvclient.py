"""Client of the temporary key-value protocol (clusterd.kvwire): trio, plus a blocking facade.

Retry rules. A node that cannot be reached, or answers NoLeader, did not take
the request: the client moves to the next node and retries after a bounded,
jittered backoff, until `retry_for_s` runs out (Unavailable). A write whose
connection breaks or times out after it was sent may or may not have
committed: that is OutcomeUnknown, surfaced to the caller, never retried
blindly (a retried compare-and-set could fail against its own first attempt).
Reads are always safe to retry.

Like a ZooKeeper client, a KVClient never goes back in time: it remembers the
highest zxid it has seen (in any answer) and retries a read that a lagging
node answers from older state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from clusterd import kvwire

RECEIVE_BYTES = 64 << 10


class KVError(Exception):
    """Base of every error a KVClient raises."""


class Rejected(KVError):
    """The cluster answered, and refused the request; `code` is the protocol's error name."""

    code = ""


class BadVersion(Rejected):
    code = kvwire.BAD_VERSION


class NoKey(Rejected):
    code = kvwire.NO_KEY


class BadRequest(Rejected):
    code = kvwire.BAD_REQUEST


class OutcomeUnknown(KVError):
    """The write may or may not have committed; read back before deciding what to do."""


class Unavailable(KVError):
    """No node took the request before the retry budget ran out."""


_REJECTIONS = {cls.code: cls for cls in (BadVersion, NoKey, BadRequest)}


@dataclass(frozen=True, slots=True)
class Written:
    version: int  # the key's version after the write (0 after a delete)
    zxid: int


@dataclass(frozen=True, slots=True)
class Item:
    value: str
    version: int
    zxid: int  # the state the read saw: the serving node's last applied transaction


class _Retry(Exception):
    """This attempt failed before the request could have taken effect."""


class KVClient:
    """One connection at a time to one of `addresses`, trying them in turn from `start`.

    Requests are sent one at a time; use several clients for concurrency. Use as
    `async with KVClient(...) as client:` or call `aclose()`.
    """

    def __init__(self, addresses: Sequence[tuple[str, int]], *, start: int = 0, retry_for_s: float = 30.0,
                 request_timeout_s: float = 10.0, connect_timeout_s: float = 2.0,
                 backoff_s: tuple[float, float] = (0.02, 1.0), rng: random.Random | None = None) -> None:
        if not addresses:
            raise ValueError("KVClient needs at least one address")
        self._addresses = list(addresses)
        self._index = start % len(self._addresses)
        self._retry_for_s = retry_for_s
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._backoff_min_s, self._backoff_max_s = backoff_s
        self._rng = rng or random.Random()
        self._stream: trio.SocketStream | None = None
        self._decoder = kvwire.FrameDecoder()
        self._retries = 0
        self._no_leader = 0
        self._last_zxid_seen = 0

    async def __aenter__(self) -> KVClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    @property
    def address(self) -> tuple[str, int]:
        """The node this client talks to now (or will try next)."""
        return self._addresses[self._index]

    def statistics(self) -> dict[str, int]:
        return {"retries": self._retries, "no_leader": self._no_leader}

    async def put(self, key: str, value: str, version: int | None = None) -> Written:
        """Set `key` to `value` if its version is `version` (None: any, 0: must not exist)."""
        response = await self._call(kvwire.Put(key, value, version))
        return Written(response["version"], response["zxid"])

    async def delete(self, key: str, version: int | None = None) -> Written:
        response = await self._call(kvwire.Delete(key, version))
        return Written(response["version"], response["zxid"])

    async def get(self, key: str) -> Item | None:
        """The key's value as the serving node sees it, or None if it does not exist."""
        try:
            response = await self._call(kvwire.Get(key))
        except NoKey:
            return None
        return Item(response["value"], response["version"], response["zxid"])

    async def _call(self, request: kvwire.Request) -> dict[str, Any]:
        deadline = trio.current_time() + self._retry_for_s
        backoff = self._backoff_min_s
        while True:
            try:
                return self._outcome(await self._attempt(request))
            except _Retry as e:
                if trio.current_time() + backoff > deadline:
                    raise Unavailable(f"no node took the request within {self._retry_for_s:g} s; last: {e}") from None
            # Whatever failed, another node may do better: NoLeader, a lagging node, a dead one.
            await self.aclose()
            self._retries += 1
            self._index = (self._index + 1) % len(self._addresses)
            await trio.sleep(backoff * self._rng.uniform(0.5, 1.0))
            backoff = min(backoff * 2, self._backoff_max_s)

    async def _attempt(self, request: kvwire.Request) -> dict[str, Any]:
        """One exchange with the current node. _Retry if it certainly did not take effect."""
        response = await self._exchange(await self._connect(), request)
        error = response.get("error")
        if error == kvwire.BAD_REQUEST:
            await self.aclose()  # the node may have closed its end: it does after a protocol error
        if error == kvwire.NO_LEADER:
            self._no_leader += 1
            raise _Retry(f"{_fmt(self.address)}: NoLeader: {response['message']}")
        self._check_not_older(request, response.get("zxid"))
        return response

    async def _exchange(self, stream: trio.SocketStream, request: kvwire.Request) -> dict[str, Any]:
        try:
            with trio.fail_after(self._request_timeout_s):
                await stream.send_all(kvwire.encode_frame(kvwire.request_message(request)))
                return await self._receive(stream)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                kvwire.WireError) as e:
            await self.aclose()
            problem = f"{_fmt(self.address)}: {e or type(e).__name__}"
            if isinstance(request, kvwire.Get):
                raise _Retry(problem) from None
            raise OutcomeUnknown(f"connection lost with a write in flight ({problem})") from None

    def _check_not_older(self, request: kvwire.Request, zxid: int | None) -> None:
        if zxid is None:
            return
        if isinstance(request, kvwire.Get) and zxid < self._last_zxid_seen:
            # Not a protocol error: this node lags. Another one (or this one, later) will do.
            raise _Retry(f"{_fmt(self.address)} answered from zxid {zxid:#x}, older than {self._last_zxid_seen:#x}")
        self._last_zxid_seen = max(self._last_zxid_seen, zxid)

    async def _connect(self) -> trio.SocketStream:
        if self._stream is None:
            host, port = self.address
            try:
                with trio.fail_after(self._connect_timeout_s):
                    self._stream = await trio.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError) as e:
                raise _Retry(f"{_fmt(self.address)}: cannot connect: {e or type(e).__name__}") from None
            self._decoder = kvwire.FrameDecoder()
        return self._stream

    async def _receive(self, stream: trio.SocketStream) -> dict[str, Any]:
        while (message := self._decoder.next_message()) is None:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise trio.BrokenResourceError("the node closed the connection")
            self._decoder.feed(data)
        return kvwire.check_response(message)

    @staticmethod
    def _outcome(response: dict[str, Any]) -> dict[str, Any]:
        if response["ok"]:
            return response
        if response["error"] == kvwire.OUTCOME_UNKNOWN:
            raise OutcomeUnknown(response["message"])
        raise _REJECTIONS[response["error"]](response["message"])


def _fmt(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class SyncKVClient:
    """Blocking facade for scripts and the CLI: every call runs its own trio loop and connection."""

    def __init__(self, addresses: Sequence[tuple[str, int]], **options: Any) -> None:
        self._addresses = list(addresses)
        self._options = options

    def put(self, key: str, value: str, version: int | None = None) -> Written:
        return trio.run(self._run, "put", key, value, version)

    def delete(self, key: str, version: int | None = None) -> Written:
        return trio.run(self._run, "delete", key, version)

    def get(self, key: str) -> Item | None:
        return trio.run(self._run, "get", key)

    async def _run(self, method: str, *args: Any) -> Any:
        async with KVClient(self._addresses, **self._options) as client:
            return await getattr(client, method)(*args)
