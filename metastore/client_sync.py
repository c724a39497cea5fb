"""A blocking facade over MetaClient, for the CLI and synchronous programs.

One background thread runs a trio loop holding one MetaClient; each method
hands its call to that loop (trio.from_thread.run) and blocks until it is done,
so the session, its pings and its reconnects keep going between calls. The
async client's semantics hold unchanged (docs/metastore_client.md).

    with SyncMetaClient(hosts) as c:
        c.create("/x", b"1")
        w = Watch()
        c.get("/x", watch=w)
        event = c.wait(w, timeout_s=5)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import trio

from metastore import jute_records as J
from metastore.client import MetaClient
from metastore.client_core import ANY_VERSION, State, Version, WatchEvent
from metastore.client_ops import Op
from metastore.client_watches import Watch
from metastore.stat import Stat


class SyncMetaClient:
    """`with SyncMetaClient(hosts, **MetaClient options) as c:` or start()/close().
    Methods mirror MetaClient's and raise the same errors."""

    def __init__(self, hosts: Sequence[tuple[str, int]], **options: Any) -> None:
        self._hosts, self._options = list(hosts), options
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: MetaClient | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None

    def __enter__(self) -> SyncMetaClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Open the session; raises what MetaClient.start would (ConnectionLoss, AuthFailed...)."""
        if self._thread is not None:
            raise RuntimeError("a SyncMetaClient starts once; create another")
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="metaclient", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self) -> None:
        try:
            async with MetaClient(self._hosts, **self._options) as client:
                self._client, self._stop = client, trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # handed to start(), which re-raises it in the caller's thread
            if self._ready.is_set():
                raise
            self._error = e
            self._ready.set()

    def close(self) -> None:
        """Close the session and stop the thread. Idempotent."""
        if self._thread is None or self._token is None or not self._thread.is_alive():
            return
        try:
            self._run(self.client.close)
            trio.from_thread.run_sync(self._stop_loop, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join()

    def _stop_loop(self) -> None:
        assert self._stop is not None
        self._stop.set()

    @property
    def client(self) -> MetaClient:
        """The async client (only to be used from its own thread, e.g. in functions given to run())."""
        if self._client is None:
            raise RuntimeError("the SyncMetaClient is not started")
        return self._client

    def run(self, async_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `await async_fn(*args, **kwargs)` in the client's loop and return its result."""
        return self._run(partial(async_fn, *args, **kwargs))

    def _run(self, fn: Callable[[], Any]) -> Any:
        if self._token is None:
            raise RuntimeError("the SyncMetaClient is not started")
        return trio.from_thread.run(fn, trio_token=self._token)

    # -- state ----------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.client.state

    @property
    def session_id(self) -> int:
        return self.client.session_id

    def wait(self, watch: Watch, timeout_s: float | None = None) -> WatchEvent:
        """Block until the watch fires; TimeoutError after timeout_s."""
        return self._run(partial(_with_timeout, watch.wait, timeout_s))

    # -- operations (see MetaClient) ------------------------------------------------------
    def create(self, path: str, data: bytes = b"", *, acl: Sequence[J.ACL] | None = None, ephemeral: bool = False,
               sequential: bool = False) -> str:
        return self.run(self.client.create, path, data, acl=acl, ephemeral=ephemeral, sequential=sequential)

    def get(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> tuple[bytes, Stat]:
        return self.run(self.client.get, path, watch=watch, linearizable=linearizable)

    def exists(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> Stat | None:
        return self.run(self.client.exists, path, watch=watch, linearizable=linearizable)

    def children(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> list[str]:
        return self.run(self.client.children, path, watch=watch, linearizable=linearizable)

    def set(self, path: str, data: bytes, version: Version = ANY_VERSION) -> Stat:
        return self.run(self.client.set, path, data, version)

    def delete(self, path: str, version: Version = ANY_VERSION) -> None:
        return self.run(self.client.delete, path, version)

    def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        return self.run(self.client.multi, ops)

    def sync(self, path: str = "/") -> None:
        return self.run(self.client.sync, path)

    def get_acl(self, path: str) -> tuple[list[J.ACL], Stat]:
        return self.run(self.client.get_acl, path)

    def set_acl(self, path: str, acl: Sequence[J.ACL], version: Version = ANY_VERSION) -> Stat:
        return self.run(self.client.set_acl, path, acl, version)

    def add_auth(self, scheme: str, credential: bytes | str) -> None:
        return self.run(self.client.add_auth, scheme, credential)

    def cas(self, path: str, update: Callable[[bytes | None], bytes], **options: Any) -> tuple[bytes, Stat]:
        """MetaClient.cas; `update` runs in the client's thread."""
        return self.run(self.client.cas, path, update, **options)

    def ensure_path(self, path: str) -> None:
        return self.run(self.client.ensure_path, path)

    def delete_recursive(self, path: str) -> None:
        return self.run(self.client.delete_recursive, path)


async def _with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    if timeout_s is None:
        return await fn()
    try:
        with trio.fail_after(timeout_s):
            return await fn()
    except trio.TooSlowError:
        raise TimeoutError(f"no event within {timeout_s:g} s") from None
