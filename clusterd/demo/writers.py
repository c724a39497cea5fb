"""The clients of `clusterctl demo`: metastore sessions that write through a crash and
keep an exact record of what the cluster promised them.

Every logical write has a name of its own, chosen by the client, so that its outcome
can always be found out by reading:

    /demo/w-<client>-<op>                 a znode created with data "value-<op>"
    /demo/counter                         one decimal counter shared by every client, and
    /demo/counter-log/<client>-<op>       for each increment, in the same multi: the new value
    /demo/seq/<client>-<op>-<10 digits>   a persistent sequential znode (one write in 50)
    /demo/clients/c<client>               each client session's ephemeral node

A write whose connection is lost in flight (ConnectionLoss, or SessionExpired) has an
unknown outcome: it may or may not have been committed. The client does not guess and
does not repeat it blindly: it reads back (sync, then read) whether the write's own
znode exists. If it does, the write landed; if not, the same write (same name) is
sent again, so it can land at most once (a late landing makes the retry fail with
NodeExists, and the next read-back finds it). A counter increment is a multi of a
version-checked setData of the counter and the create of its log znode, so the
counter always equals the number of log znodes, and an increment whose outcome was
unknown is resolved exactly by its log znode.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Self, TypeVar

import trio

from metastore.client import MetaClient, State
from metastore.client.ops import Create, MultiFailed, SetData
from metastore.errors import BadVersion, ConnectionLoss, NodeExists, NoNode, SessionExpired

ROOT = "/demo"
COUNTER = "/demo/counter"
COUNTER_LOG = "/demo/counter-log"
SEQUENTIAL = "/demo/seq"
MEMBERS = "/demo/clients"
PARENTS = (ROOT, COUNTER_LOG, SEQUENTIAL, MEMBERS)
COUNTER_EVERY = 5  # one write in five is a counter increment
SEQUENTIAL_EVERY = 50  # and one in fifty a sequential create
SESSION_TIMEOUT_MS = 10_000
START_TIMEOUT_S = 30.0
GIVE_UP_S = 60.0  # a write whose outcome is still not known after this fails the demo
RETRY_PAUSE_S = 0.02

T = TypeVar("T")


class Kind(enum.Enum):
    CREATE = "creates"
    INCREMENT = "counter increments"
    SEQUENTIAL = "sequential creates"


def kind_of(op: int) -> Kind:
    if op % COUNTER_EVERY == 0:
        return Kind.INCREMENT
    if op % SEQUENTIAL_EVERY == 1:
        return Kind.SEQUENTIAL
    return Kind.CREATE


class GaveUp(Exception):
    """A client could not learn the outcome of a write in time."""


class _Unknown(Exception):
    """A write lost its connection (or its session) in flight: it may or may not have landed."""


@dataclass
class Record:
    """What the clients know. `znodes` holds every write known to be committed (acknowledged,
    or read back after an unknown outcome): each must be on every node at the end."""

    znodes: dict[str, bytes] = field(default_factory=dict)
    acked_paths: set[str] = field(default_factory=set)
    acked: Counter[Kind] = field(default_factory=Counter)
    landed: Counter[Kind] = field(default_factory=Counter)  # outcome unknown, then read back present
    unknown: int = 0  # writes that lost their connection in flight at least once
    redone: int = 0  # ... then read back absent, sent again and acknowledged
    cas_conflicts: int = 0
    sessions_lost: int = 0
    done: int = 0
    _milestones: list[tuple[int, trio.Event]] = field(default_factory=list)

    def add(self, kind: Kind, path: str, data: bytes, *, landed: bool, uncertain: bool) -> None:
        self.znodes[path] = data
        if landed:
            self.landed[kind] += 1
        else:
            self.acked[kind] += 1
            self.acked_paths.add(path)
        self.unknown += uncertain
        self.redone += uncertain and not landed
        self.done += 1
        for threshold, event in self._milestones:
            if self.done >= threshold:
                event.set()

    async def wait_done(self, threshold: int) -> None:
        """Wait until `threshold` writes have a known outcome."""
        event = trio.Event()
        self._milestones.append((threshold, event))
        if self.done >= threshold:
            event.set()
        await event.wait()


class _InOrder(random.Random):
    """A MetaClient normally shuffles its servers; the demo wants client i to start on
    node i (then try the next ones in turn), so that clients write through different nodes."""

    def shuffle(self, x: list, random: object = None) -> None:  # type: ignore[override]
        pass


class DemoClient:
    """One demo client: a MetaClient session (reopened if it is ever lost), its ephemeral
    member node, and the writes it was given."""

    def __init__(self, index: int, hosts: Sequence[tuple[str, int]], record: Record, nursery: trio.Nursery,
                 say: Callable[[str], None]) -> None:
        start = (index - 1) % len(hosts)
        self.index = index
        self.hosts = list(hosts[start:]) + list(hosts[:start])
        self.record = record
        self.member = f"{MEMBERS}/c{index}"
        self._nursery = nursery
        self._say = say
        self.meta: MetaClient | None = None
        self._joined = False

    # -- the session ----------------------------------------------------------------------
    async def open(self) -> None:
        await self._ready()

    async def close(self) -> None:
        if self.meta is not None:
            await self.meta.close()

    async def _ready(self) -> MetaClient:
        """The live session, opened again if it was lost, with its ephemeral member node."""
        if self.meta is None or self.meta.state is State.LOST:
            if self.meta is not None and self.meta.session_id:
                self.record.sessions_lost += 1
                self._say(f"client {self.index}: session {self.meta.session_id:#x} lost "
                          f"({self.meta.lost_reason}); opening a new one")
            self.meta = MetaClient(self.hosts, session_timeout_ms=SESSION_TIMEOUT_MS, rng=_InOrder(),
                                   start_timeout_s=START_TIMEOUT_S)
            self._joined = False
            await self.meta.start(self._nursery)
        if not self._joined:
            try:
                await self.meta.create(self.member, f"client {self.index}".encode(), ephemeral=True)
            except NodeExists:  # created by an attempt of ours whose reply was lost?
                stat = await self.meta.exists(self.member, linearizable=True)
                if stat is None or stat.ephemeral_owner != self.meta.session_id:
                    raise
            self._joined = True
        return self.meta

    @property
    def session_id(self) -> int:
        return self.meta.session_id if self.meta is not None else 0

    # -- the writes --------------------------------------------------------------------------
    async def run(self, ops: range) -> None:
        for op in ops:
            kind = kind_of(op)
            if kind is Kind.INCREMENT:
                await self._until_known(kind, self._increment, f"{COUNTER_LOG}/{self.index}-{op:05d}", b"")
            elif kind is Kind.SEQUENTIAL:
                await self._until_known(kind, self._sequential, f"{SEQUENTIAL}/{self.index}-{op:05d}-",
                                        f"seq-{op}".encode())
            else:
                await self._until_known(kind, self._create, f"{ROOT}/w-{self.index}-{op:05d}",
                                        f"value-{op}".encode())

    async def _until_known(self, kind: Kind, attempt: Callable[[MetaClient, str, bytes, bool],
                                                                 Awaitable[tuple[bool, str, bytes]]],
                           path: str, data: bytes) -> None:
        """Run `attempt` until the write's outcome is known, then record it. An attempt
        returns (landed, path, data): landed means found by reading back after an unknown
        outcome; otherwise the write was acknowledged."""
        uncertain = False
        deadline = trio.current_time() + GIVE_UP_S
        while True:
            try:
                landed, path_written, data_written = await attempt(await self._ready(), path, data, uncertain)
                break
            except _Unknown:
                uncertain = True
            except (ConnectionLoss, SessionExpired):
                pass  # a read, or the session's (re)opening: safe to repeat
            if trio.current_time() > deadline:
                raise GaveUp(f"client {self.index}: the outcome of the write of {path} is still unknown "
                             f"after {GIVE_UP_S:g} s")
            await trio.sleep(RETRY_PAUSE_S)
        self.record.add(kind, path_written, data_written, landed=landed, uncertain=uncertain)

    @staticmethod
    async def _write(call: Awaitable[T]) -> T:
        try:
            return await call
        except (ConnectionLoss, SessionExpired) as e:
            raise _Unknown(str(e)) from e

    @staticmethod
    async def _read_back(meta: MetaClient, path: str) -> bytes | None:
        """The znode's data after a sync (so every write committed before is seen), or None."""
        try:
            data, _ = await meta.get(path, linearizable=True)
        except NoNode:
            return None
        return data

    async def _create(self, meta: MetaClient, path: str, data: bytes, uncertain: bool) -> tuple[bool, str, bytes]:
        if uncertain and await self._read_back(meta, path) is not None:
            return True, path, data
        try:
            await self._write(meta.create(path, data))
        except NodeExists:
            if not uncertain:
                raise
            return True, path, data  # our earlier attempt landed after all
        return False, path, data

    async def _increment(self, meta: MetaClient, log: str, _: bytes, uncertain: bool) -> tuple[bool, str, bytes]:
        """Compare-and-set: read the counter, write value+1 at the version read together with
        the log znode (holding the new value) in one multi; retry on a version conflict."""
        while True:
            if uncertain and (found := await self._read_back(meta, log)) is not None:
                return True, log, found
            data, stat = await meta.get(COUNTER)
            new = str(int(data) + 1).encode()
            try:
                await self._write(meta.multi([SetData(COUNTER, new, stat.version), Create(log, new)]))
            except MultiFailed as e:
                if isinstance(e.error, BadVersion):
                    self.record.cas_conflicts += 1
                    continue
                if uncertain and isinstance(e.error, NodeExists):
                    continue  # our earlier attempt landed: the read-back finds it
                raise
            return False, log, new

    async def _sequential(self, meta: MetaClient, prefix: str, data: bytes,
                          uncertain: bool) -> tuple[bool, str, bytes]:
        if uncertain:
            parent, _, name = prefix.rpartition("/")
            children = await meta.children(parent, linearizable=True)
            mine = sorted(c for c in children if c.startswith(name) and len(c) == len(name) + 10)
            if mine:
                return True, f"{parent}/{mine[0]}", data
        path = await self._write(meta.create(prefix, data, sequential=True))
        return False, path, data


class DemoClients:
    """The demo's client sessions, closed on exit (so their ephemeral nodes go at once).
    Exceptions of the body propagate unwrapped: the nursery holds only the sessions' tasks."""

    def __init__(self, hosts: Sequence[tuple[str, int]], count: int, record: Record,
                 say: Callable[[str], None]) -> None:
        self._hosts, self._count, self._record, self._say = list(hosts), count, record, say
        self._stack = AsyncExitStack()
        self.clients: list[DemoClient] = []

    async def __aenter__(self) -> Self:
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        try:
            await _create_tree(self._hosts, nursery)
            self.clients = [DemoClient(i, self._hosts, self._record, nursery, self._say)
                            for i in range(1, self._count + 1)]
            for client in self.clients:
                await client.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            for client in self.clients:
                await client.close()
        finally:
            await self._stack.aclose()


async def _create_tree(hosts: Sequence[tuple[str, int]], nursery: trio.Nursery) -> None:
    meta = MetaClient(hosts, session_timeout_ms=SESSION_TIMEOUT_MS, start_timeout_s=START_TIMEOUT_S)
    await meta.start(nursery)
    try:
        await meta.create(ROOT)
        await meta.create(COUNTER, b"0")
        for parent in (COUNTER_LOG, SEQUENTIAL, MEMBERS):
            await meta.create(parent)
    finally:
        await meta.close()
