"""Coordination recipes on the metastore client: Lock, LeaderElection, IdGenerator.

They follow ZooKeeper's recipes (zookeeper.apache.org/doc/current/recipes.html):

- Lock: each contender creates an ephemeral sequential child of the lock node;
  the lowest sequence number holds the lock; every other contender watches
  only its predecessor (no herd effect when the lock is released). A child's
  name carries a random token ("protected" names, as Curator and kazoo do), so
  a contender whose create failed with ConnectionLoss finds out whether its
  node was created and does not leave an orphan that would hold the lock.
- LeaderElection: the same queue; the head leads. `async with election.lead():`
  waits for leadership and runs the body while leading; if leadership may be
  lost (the client is SUSPENDED or LOST, or the node is deleted) the body is
  cancelled and LeadershipLost raised (Curator's LeaderLatch rule: a suspended
  leader cannot know whether its session still lives, so it stops leading).
- IdGenerator: unique ids from a decimal counter in one znode, advanced with
  cas; a batch reserves many ids in one write. The ledger service takes its
  ledger ids from here.

Holding a Lock (or leading) is only as good as the session: when the client
goes LOST the ephemeral node is gone and another contender may take over.
Work done under a lock that must not be done twice needs fencing (e.g. a
version-checked write, or the lock node's czxid as a fencing token).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from metastore.wire import jute_records as J
from metastore.client import MetaClient
from metastore.client.core import State
from metastore.client.watches import Watch
from metastore.errors import ConnectionLoss, MetastoreError, NoNode, SessionExpired, ZooKeeperError
from metastore.wire.jute_defs import EventType

SEQUENCE_DIGITS = 10
RELEASE_TIMEOUT_S = 5.0


class LockLost(MetastoreError):
    """Our contender node vanished while waiting (its session ended, or someone deleted it)."""


class LeadershipLost(MetastoreError):
    """The body of `lead()` was cancelled because leadership may have been lost."""


def _sequence(name: str) -> int:
    return int(name[-SEQUENCE_DIGITS:])


class Lock:
    """A mutex over `path`: `async with Lock(client, "/locks/ledger-7"): ...`.

    Not reentrant. `identifier` is stored in the contender's node (contenders()
    lists them in queue order). Cancelling acquire() withdraws the contender.
    """

    def __init__(self, client: MetaClient, path: str, identifier: bytes = b"", *, prefix: str = "lock-",
                 acl: Sequence[J.ACL] | None = None) -> None:
        self.client, self.path, self.identifier = client, path.rstrip("/") or "/", identifier
        self._prefix = prefix
        self._acl = acl  # of the lock's folder and contender nodes (None: open)
        self._token = uuid.uuid4().hex
        self._node: str | None = None  # our contender's name while we hold the lock

    @property
    def node(self) -> str | None:
        """The full path of our contender node while held."""
        return f"{self.path}/{self._node}" if self._node else None

    @property
    def held(self) -> bool:
        return self._node is not None and self.client.state is State.CONNECTED

    async def acquire(self) -> None:
        if self._node is not None:
            raise RuntimeError(f"lock {self.path!r} is already held by this Lock (it is not reentrant)")
        await self.client.ensure_path(self.path, acl=self._acl)
        name = await self._enqueue()
        try:
            await self._wait_turn(name)
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_TIMEOUT_S):
                await self._delete(name)
            raise
        self._node = name

    async def release(self) -> None:
        name, self._node = self._node, None
        if name is not None:
            await self._delete(name)

    async def __aenter__(self) -> Lock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_TIMEOUT_S):
            await self.release()

    async def contenders(self) -> list[bytes]:
        """The identifiers of every contender, the holder first."""
        out = []
        for name in await self._queue():
            try:
                out.append((await self.client.get(f"{self.path}/{name}"))[0])
            except NoNode:
                pass
        return out

    async def _queue(self) -> list[str]:
        kids = [k for k in await self.client.children(self.path) if k.startswith(self._prefix)]
        return sorted(kids, key=_sequence)

    async def _enqueue(self) -> str:
        """Create our ephemeral sequential node; after a ConnectionLoss, find it if it was made."""
        base = f"{self.path}/{self._prefix}{self._token}-"
        while True:
            try:
                return (await self.client.create(base, self.identifier, acl=self._acl, ephemeral=True,
                                                 sequential=True)
                        ).rsplit("/", 1)[1]
            except ConnectionLoss:
                mine = [k for k in await self._queue() if self._token in k]
                if mine:
                    return mine[0]

    async def _wait_turn(self, name: str) -> None:
        while True:
            queue = await self._queue()
            if name not in queue:
                raise LockLost(f"contender {self.path}/{name} vanished (session lost or node deleted)")
            index = queue.index(name)
            if index == 0:
                return
            watch = Watch()
            if await self.client.exists(f"{self.path}/{queue[index - 1]}", watch=watch) is not None:
                await watch.wait()

    async def _delete(self, name: str) -> None:
        """Delete our node; a delete is idempotent, so ConnectionLoss is retried. The
        caller bounds the time (RELEASE_TIMEOUT_S); when the session is LOST the node is
        gone with it."""
        while self.client.state is not State.LOST:
            try:
                await self.client.delete(f"{self.path}/{name}")
                return
            except NoNode:
                return
            except (ConnectionLoss, SessionExpired):
                continue


class LeaderElection:
    """Contenders under `path`; the first leads.

        election = LeaderElection(client, "/election/ledger", b"node-1")
        while True:
            try:
                async with election.lead():
                    await serve_as_leader()
            except LeadershipLost:
                continue
    """

    def __init__(self, client: MetaClient, path: str, identifier: bytes = b"", *,
                 acl: Sequence[J.ACL] | None = None) -> None:
        self.client = client
        self._lock = Lock(client, path, identifier, prefix="n-", acl=acl)

    async def contenders(self) -> list[bytes]:
        """Identifiers of every contender, the leader first."""
        return await self._lock.contenders()

    async def leader(self) -> bytes | None:
        contenders = await self.contenders()
        return contenders[0] if contenders else None

    @asynccontextmanager
    async def lead(self) -> AsyncIterator[None]:
        """Wait to lead, run the body as leader, then step down. If leadership may be lost
        meanwhile, the body is cancelled and LeadershipLost raised."""
        await self._lock.acquire()
        lost: list[str] = []
        try:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guard_state, nursery.cancel_scope, lost)
                    nursery.start_soon(self._guard_node, nursery.cancel_scope, lost)
                    try:
                        yield
                    finally:
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                if len(group.exceptions) == 1:  # the body's own exception: hand it on unwrapped
                    raise group.exceptions[0] from None
                raise
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_TIMEOUT_S):
                await self._lock.release()
        if lost:
            raise LeadershipLost(lost[0])

    async def _guard_state(self, scope: trio.CancelScope, lost: list[str]) -> None:
        async for state in self.client.states():
            if state in (State.SUSPENDED, State.LOST):
                lost.append(f"the client is {state.name}")
                scope.cancel()
                return

    async def _guard_node(self, scope: trio.CancelScope, lost: list[str]) -> None:
        node = self._lock.node
        assert node is not None
        try:
            while True:
                watch = Watch()
                if await self.client.exists(node, watch=watch) is None:
                    break
                if (await watch.wait()).type == EventType.NODE_DELETED:
                    break
        except ZooKeeperError as e:
            lost.append(f"cannot watch {node}: {e}")
        else:
            lost.append(f"{node} was deleted")
        scope.cancel()


class IdGenerator:
    """Unique ids (ints >= start) from a decimal counter in znode `path`.

    Each call returns an id greater than every id this generator returned before.
    Ids from all generators on the same path are distinct. With batch=1 every
    id is one committed cas, so ids also increase in the order they were handed
    out across all generators; with batch=n a generator reserves n ids per cas
    (fewer writes; ids it has not handed out yet are lost if it goes away).
    """

    def __init__(self, client: MetaClient, path: str, *, batch: int = 1, start: int = 1) -> None:
        if batch < 1 or start < 0:
            raise ValueError(f"IdGenerator needs batch >= 1 and start >= 0, got {batch}, {start}")
        self.client, self.path, self.batch, self.start = client, path, batch, start
        self._reserved = range(0)
        self._lock = trio.Lock()
        self._parent_exists = False

    async def next(self) -> int:
        async with self._lock:
            if not self._reserved:
                self._reserved = await self._reserve(self.batch)
            value, self._reserved = self._reserved[0], self._reserved[1:]
            return value

    async def next_batch(self, count: int) -> range:
        """`count` consecutive ids, reserved with one write."""
        if count < 1:
            raise ValueError(f"next_batch needs count >= 1, got {count}")
        async with self._lock:
            return await self._reserve(count)

    async def _reserve(self, count: int) -> range:
        first: list[int] = []

        def advance(data: bytes | None) -> bytes:
            current = self.start if not data else int(data)
            first[:] = [current]
            return str(current + count).encode()

        if not self._parent_exists:
            await self.client.ensure_path(self.path.rsplit("/", 1)[0] or "/")
            self._parent_exists = True
        await self.client.cas(self.path, advance)
        return range(first[0], first[0] + count)
