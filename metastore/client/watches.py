"""Watch objects of the metastore client: what a caller holds to learn of znode events.

The design is trio's, not ZooKeeper's: no callbacks. A one-shot watch is a
`Watch` the caller creates and passes as `watch=` to get, exists or children;
`await watch.wait()` returns the event. A persistent watch (`add_watch`) is a
bounded async iterator of events. The client's reader task delivers to them
without ever blocking (a slow consumer must never stall the replies of
everyone else), so:

- a `Watch` holds at most one event (it is one-shot), so it needs no buffer;
- a `PersistentWatch` buffers up to `max_buffer` events; one more ends it
  with WatchOverflow (the consumer then knows it missed events and re-reads).

When the session is lost, every watch fails with the reason (SessionExpired,
AuthFailed): the events it waited for can no longer be delivered.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from metastore.client.core import WatchEvent, WatchKind
from metastore.errors import MetastoreError

if TYPE_CHECKING:
    from metastore.client import MetaClient


class WatchOverflow(MetastoreError):
    """A persistent watch's consumer fell more than max_buffer events behind; the watch
    was removed and events after the buffered ones were dropped. Re-read and re-watch."""


class _Arming(enum.Enum):
    IDLE = "idle"        # not registered: may be passed to a read
    PENDING = "pending"  # a read carrying it is in flight
    ARMED = "armed"      # registered: waiting for its event
    DONE = "done"        # fired or failed


class Watch:
    """A one-shot watch: `w = Watch(); data, stat = await c.get(path, watch=w); event = await w.wait()`.

    It is armed by the first read that succeeds with it (a `get` or `children` on a
    missing node does not arm it, an `exists` does) and fires once. Each Watch
    serves one read: create a new one per read. It survives reconnects (the client
    re-registers it with SetWatches2) and fails only when the session is lost.
    """

    def __init__(self) -> None:
        self._arming = _Arming.IDLE
        self._done = trio.Event()
        self._event: WatchEvent | None = None
        self._error: BaseException | None = None
        self.path: str | None = None
        self.kind: WatchKind | None = None

    @property
    def armed(self) -> bool:
        return self._arming is _Arming.ARMED

    @property
    def fired(self) -> bool:
        return self._event is not None

    async def wait(self) -> WatchEvent:
        """The event, once it happens; raises the session's end (SessionExpired, ...) instead
        if the session is lost first."""
        await self._done.wait()
        if self._event is None:
            assert self._error is not None
            raise self._error
        return self._event

    # -- the client's side -----------------------------------------------------------
    def _reserve(self) -> None:
        if self._arming is not _Arming.IDLE:
            raise ValueError(f"this Watch is {self._arming.value}; a Watch serves one read: create another")
        self._arming = _Arming.PENDING

    def _unreserve(self) -> None:
        if self._arming is _Arming.PENDING:
            self._arming = _Arming.IDLE

    def _arm(self, kind: WatchKind, path: str) -> None:
        assert self._arming is _Arming.PENDING, self._arming
        self._arming, self.kind, self.path = _Arming.ARMED, kind, path

    def _deliver(self, event: WatchEvent) -> None:
        if self._arming is _Arming.ARMED:
            self._arming, self._event = _Arming.DONE, event
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if self._arming in (_Arming.ARMED, _Arming.PENDING):
            self._arming, self._error = _Arming.DONE, error
            self._done.set()

    def __repr__(self) -> str:
        return f"<Watch {self._arming.value} {self.kind and self.kind.value} {self.path!r} event={self._event}>"


class PersistentWatch:
    """Every event on a path (recursive: on the path and below), until closed:

        watch = await c.add_watch("/services", recursive=True)
        async with watch:
            async for event in watch:
                ...

    Events arrive in zxid order. While the client is SUSPENDED the server cannot
    tell it of changes, and ZooKeeper does not replay them to persistent watches
    after a reconnect: after CONNECTED, re-read what you watch.
    """

    def __init__(self, client: MetaClient, path: str, recursive: bool, max_buffer: int) -> None:
        self.path, self.recursive = path, recursive
        self.kind = WatchKind.PERSISTENT_RECURSIVE if recursive else WatchKind.PERSISTENT
        self._client = client
        self._send, self._recv = trio.open_memory_channel[WatchEvent](max_buffer)
        self._error: BaseException | None = None
        self._armed = False

    def __aiter__(self) -> PersistentWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """Stop watching (removes the server's watch if no other PersistentWatch of this
        client needs it); the iterator ends after the events already buffered."""
        await self._client._remove_persistent(self)

    async def __aenter__(self) -> PersistentWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.aclose()

    # -- the client's side -----------------------------------------------------------
    def _reserve(self) -> None:
        pass

    def _unreserve(self) -> None:
        pass

    def _arm(self, kind: WatchKind, path: str) -> None:
        self._armed = True

    def _deliver(self, event: WatchEvent) -> None:
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self._client._overflowed(self)
            self._fail(WatchOverflow(f"persistent watch on {self.path!r} fell behind by more than "
                                     f"{self._send.statistics().max_buffer_size} events"))
        except trio.ClosedResourceError:
            pass

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._end()

    def _end(self) -> None:
        self._armed = False
        self._send.close()

    def __repr__(self) -> str:
        return f"<PersistentWatch {self.kind.value} {self.path!r}>"


Sink = Watch | PersistentWatch


@dataclass(frozen=True, slots=True)
class WatchArm:
    """Register `sink` for `path` if the reply's error code is a key of `kinds`."""

    path: str
    sink: Sink
    kinds: dict[int, WatchKind]
