"""One trio loop in a background thread, holding async resources open for blocking callers.

The blocking facades (metastore/client/sync.py, ledger/client_sync.py) keep their
async clients alive between calls this way: sessions keep pinging, connections
stay open. Each call is handed to the loop with trio.from_thread.run and blocks
until it is done; errors come back in the caller's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from functools import partial
from contextlib import AsyncExitStack
from typing import Any, Generic, Self, TypeVar

import trio

T = TypeVar("T")


class TrioThread(Generic[T]):
    """`open_resources(stack)` runs in the loop, enters what it needs on `stack` and returns the
    object callers use; `start()` returns it (or re-raises what opening raised); `stop()` leaves
    the stack (closing everything) and ends the thread."""

    def __init__(self, name: str, open_resources: Callable[[AsyncExitStack], Awaitable[T]]) -> None:
        self._name = name
        self._open = open_resources
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._value: T | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None

    def start(self) -> T:
        if self._thread is not None:
            raise RuntimeError(f"a {self._name} starts once; create another")
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        assert self._value is not None
        return self._value

    async def _main(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                self._value = await self._open(stack)
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # handed to start(), which re-raises it in the caller's thread
            if self._ready.is_set():
                raise
            self._error = e
            self._ready.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._token is not None and self._thread.is_alive()

    def run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """`await fn()` in the loop; its result, or its exception raised here."""
        if self._token is None:
            raise RuntimeError(f"the {self._name} is not started")
        return trio.from_thread.run(fn, trio_token=self._token)

    def stop(self) -> None:
        """Close the resources and end the thread. Idempotent."""
        if not self.running:
            return
        try:
            trio.from_thread.run_sync(self._set_stop, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        assert self._thread is not None
        self._thread.join()

    def _set_stop(self) -> None:
        assert self._stop is not None
        self._stop.set()


class BlockingFacade(Generic[T]):
    """The frame of a blocking facade: one TrioThread holding the async object callers use.

    A subclass defines `_open(stack)`, which opens that object on `stack` in the loop; `with` (or
    start()/close()) opens and closes it; `run(async_fn, *args)` awaits a call there."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: TrioThread[T] = TrioThread(name, self._open)
        self._client: T | None = None

    async def _open(self, stack: AsyncExitStack) -> T:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Open the async object in its thread; raises what opening it raised."""
        self._client = self._loop.start()

    def close(self) -> None:
        """Leave the loop's stack (closing what it opened) and end the thread. Idempotent."""
        self._loop.stop()

    @property
    def client(self) -> T:
        """The async object (only to be used from its own thread, e.g. in functions given to run())."""
        if self._client is None:
            raise RuntimeError(f"the {self._name} is not started")
        return self._client

    def run(self, async_fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """Run `await async_fn(*args, **kwargs)` in the loop and return its result (or raise its error here)."""
        return self._loop.run(partial(async_fn, *args, **kwargs))
