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

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from metastore.wire import jute_records as J
from metastore.client import MetaClient
from metastore.client.core import ANY_VERSION, State, Version, WatchEvent
from metastore.client.ops import Op
from metastore.client.watches import Watch
from metastore.core.stat import Stat
from edge.trio_thread import BlockingFacade


class SyncMetaClient(BlockingFacade[MetaClient]):
    """`with SyncMetaClient(hosts, **MetaClient options) as c:` or start()/close().
    Methods mirror MetaClient's and raise the same errors; start() raises what MetaClient.start
    would (ConnectionLoss, AuthFailed...)."""

    def __init__(self, hosts: Sequence[tuple[str, int]], **options: Any) -> None:
        super().__init__("SyncMetaClient")
        self._hosts, self._options = list(hosts), options

    async def _open(self, stack: AsyncExitStack) -> MetaClient:
        return await stack.enter_async_context(MetaClient(self._hosts, **self._options))

    def close(self) -> None:
        """Close the session and stop the thread. Idempotent."""
        if not self._loop.running:
            return
        try:
            self.run(self.client.close)
        except trio.RunFinishedError:
            pass
        super().close()

    # -- state ----------------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.client.state

    @property
    def session_id(self) -> int:
        return self.client.session_id

    def wait(self, watch: Watch, timeout_s: float | None = None) -> WatchEvent:
        """Block until the watch fires; TimeoutError after timeout_s."""
        return self.run(_with_timeout, watch.wait, timeout_s)

    # -- operations (see MetaClient) ------------------------------------------------------
    def create(self, path: str, data: bytes | None = b"", *, acl: Sequence[J.ACL] | None = None,
               ephemeral: bool = False, sequential: bool = False) -> str:
        return self.run(self.client.create, path, data, acl=acl, ephemeral=ephemeral, sequential=sequential)

    def get(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> tuple[bytes | None, Stat]:
        return self.run(self.client.get, path, watch=watch, linearizable=linearizable)

    def exists(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> Stat | None:
        return self.run(self.client.exists, path, watch=watch, linearizable=linearizable)

    def children(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> list[str]:
        return self.run(self.client.children, path, watch=watch, linearizable=linearizable)

    def set(self, path: str, data: bytes | None, version: Version = ANY_VERSION) -> Stat:
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

    def reconfig(self, joining: str | None = None, leaving: str | None = None, new_members: str | None = None,
                 from_config: int = -1) -> tuple[bytes, Stat]:
        return self.run(self.client.reconfig, joining, leaving, new_members, from_config)

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
