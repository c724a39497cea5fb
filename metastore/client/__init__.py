"""An async (trio) client of the metastore, speaking ZooKeeper's client protocol.

    async with MetaClient([("127.0.0.1", 21811), ("127.0.0.1", 21812)]) as c:
        await c.create("/app", b"hello")
        w = Watch()
        data, stat = await c.get("/app", watch=w)
        stat = await c.set("/app", b"bye", version=stat.version)
        event = await w.wait()                   # WatchEvent(NODE_DATA_CHANGED, "/app")

docs/metastore_client.md describes the API, the states and the guarantees.
The session machinery (connections, reconnects, states, pipelining) is
metastore/client/session.py; this module adds the operations and the helpers
built on them (cas, ensure_path, delete_recursive). The blocking facade is
SyncMetaClient (metastore/client/sync.py, also importable from here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from metastore.wire import jute_records as J
from metastore.client.core import ANY_VERSION, State, Version, WatchEvent, WatchKind, wire_version
from metastore.client.ops import Op, create_request, multi_request, multi_results, wire_data
from metastore.client.session import SessionDriver, credential_bytes
from metastore.client.watches import PersistentWatch, Watch, WatchArm
from metastore.errors import AuthFailed, BadArguments, BadVersion, NodeExists, NoNode, ZooKeeperError, error_for_code
from metastore.wire.jute_defs import AddWatchMode, Err, OpCode, WatcherType, Xid
from metastore.core.stat import Stat

__all__ = ["MetaClient", "State", "Watch", "PersistentWatch", "WatchEvent", "ANY_VERSION"]


class MetaClient(SessionDriver):
    """A session with the metastore, kept across servers until it is closed or expires.

    Use `async with MetaClient(hosts) as c:`, or `await c.start(nursery)` and
    `await c.close()`. Requests from any number of tasks are pipelined on one
    connection. See docs/metastore_client.md.
    """

    def _check_data(self, path: str, data: bytes | None) -> None:
        if data is None:
            return  # null data, as kazoo's create(path, None)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"znode data is bytes or None, got {type(data).__name__}")
        if len(data) > self._max_data_bytes:
            raise BadArguments(path, f"{len(data)} bytes of data exceed the limit of {self._max_data_bytes}")

    @staticmethod
    def _arm(watch: Watch | None, path: str, kinds: dict[int, WatchKind]) -> WatchArm | None:
        if watch is None:
            return None
        if not isinstance(watch, Watch):
            raise TypeError(f"watch= takes a Watch, got {watch!r}")
        return WatchArm(path, watch, kinds)

    async def _simple(self, opcode: OpCode, body: object, path: str, arm: WatchArm | None = None,
                      synced: bool = False) -> object:
        header, reply = await self._call(opcode, body, path, arm, synced=synced)
        if header.err != Err.OK:
            raise error_for_code(header.err, path)
        return reply

    # -- operations ----------------------------------------------------------------------
    async def create(self, path: str, data: bytes | None = b"", *, acl: Sequence[J.ACL] | None = None,
                     ephemeral: bool = False, sequential: bool = False) -> str:
        """Create a znode; returns its path (with the 10-digit suffix if sequential).
        acl None: world-readable and writable (OPEN_ACL_UNSAFE). data None: null data, which
        get() returns as None, apart from b"" (ZooKeeper's and kazoo's null payload)."""
        return (await self.create_with_stat(path, data, acl=acl, ephemeral=ephemeral, sequential=sequential))[0]

    async def create_with_stat(self, path: str, data: bytes | None = b"", *, acl: Sequence[J.ACL] | None = None,
                               ephemeral: bool = False, sequential: bool = False) -> tuple[str, Stat]:
        """create, returning the new znode's path and Stat (ZooKeeper's create2)."""
        self._check_data(path, data)
        reply = await self._simple(OpCode.CREATE2, create_request(path, data, acl, ephemeral, sequential), path)
        assert isinstance(reply, J.Create2Response)
        return reply.path, reply.stat

    async def get(self, path: str, *, watch: Watch | None = None,
                  linearizable: bool = False) -> tuple[bytes | None, Stat]:
        """The znode's data (None for null data, as kazoo reads it; its Stat's data_length is 0)
        and Stat. linearizable=True sends a sync right before the read, in one round trip: the
        read reflects every write committed before it began (the server confirms its leader's
        leadership for the sync)."""
        reply = await self._simple(OpCode.GET_DATA, J.GetDataRequest(path, watch is not None), path,
                                   self._arm(watch, path, {Err.OK: WatchKind.DATA}), linearizable)
        assert isinstance(reply, J.GetDataResponse)
        return reply.data, reply.stat

    async def exists(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> Stat | None:
        """The znode's Stat, or None. A watch is armed either way: it fires on creation,
        change or deletion."""
        arm = self._arm(watch, path, {Err.OK: WatchKind.DATA, Err.NO_NODE: WatchKind.EXIST})
        header, reply = await self._call(OpCode.EXISTS, J.ExistsRequest(path, watch is not None), path, arm,
                                         synced=linearizable)
        if header.err == Err.NO_NODE:
            return None
        if header.err != Err.OK:
            raise error_for_code(header.err, path)
        assert isinstance(reply, J.ExistsResponse)
        return reply.stat

    async def children(self, path: str, *, watch: Watch | None = None, linearizable: bool = False) -> list[str]:
        """Child names (sorted by this server; ZooKeeper promises no order). The watch fires
        when a child is created or deleted, or the node is deleted."""
        reply = await self._simple(OpCode.GET_CHILDREN, J.GetChildrenRequest(path, watch is not None), path,
                                   self._arm(watch, path, {Err.OK: WatchKind.CHILD}), linearizable)
        assert isinstance(reply, J.GetChildrenResponse)
        return list(reply.children)

    async def set(self, path: str, data: bytes | None, version: Version = ANY_VERSION) -> Stat:
        """Replace the data (None: null data) if the znode is at `version` (else BadVersion);
        returns the new Stat."""
        self._check_data(path, data)
        reply = await self._simple(OpCode.SET_DATA, J.SetDataRequest(path, wire_data(data), wire_version(version)),
                                   path)
        assert isinstance(reply, J.SetDataResponse)
        return reply.stat

    async def delete(self, path: str, version: Version = ANY_VERSION) -> None:
        await self._simple(OpCode.DELETE, J.DeleteRequest(path, wire_version(version)), path)

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Run Create/Delete/SetData/Check ops as one transaction: all take effect or none
        (MultiFailed, naming the op that failed). Per-op results: the created path, the
        new Stat of a SetData, None for Delete and Check."""
        ops = list(ops)
        for op in ops:
            if hasattr(op, "data"):
                self._check_data(op.path, op.data)
        reply = await self._simple(OpCode.MULTI, multi_request(ops), ops[0].path if ops else "/")
        assert isinstance(reply, J.MultiResponse)
        return multi_results(ops, reply)

    async def sync(self, path: str = "/") -> None:
        """Wait until the connected server has applied every write committed (anywhere)
        before this call; reads sent after it return at least that state."""
        await self._simple(OpCode.SYNC, J.SyncRequest(path), path)

    async def get_acl(self, path: str) -> tuple[list[J.ACL], Stat]:
        reply = await self._simple(OpCode.GET_ACL, J.GetACLRequest(path), path)
        assert isinstance(reply, J.GetACLResponse)
        return list(reply.acl), reply.stat

    async def set_acl(self, path: str, acl: Sequence[J.ACL], version: Version = ANY_VERSION) -> Stat:
        """Replace the ACL if its aversion is `version`."""
        reply = await self._simple(OpCode.SET_ACL, J.SetACLRequest(path, tuple(acl), wire_version(version)), path)
        assert isinstance(reply, J.SetACLResponse)
        return reply.stat

    async def reconfig(self, joining: str | None = None, leaving: str | None = None, new_members: str | None = None,
                       from_config: int = -1) -> tuple[bytes, Stat]:
        """Change the ensemble (ZooKeeper 3.5+'s reconfig; super user only): add `joining`
        server lines and remove `leaving` ids, or replace every member with `new_members`;
        `from_config`, unless -1, must be the current version. Returns /zookeeper/config's
        new data and Stat. docs/operations.md "Changing the ensemble"."""
        reply = await self._simple(OpCode.RECONFIG, J.ReconfigRequest(joining, leaving, new_members, from_config),
                                   "/zookeeper/config")
        assert isinstance(reply, J.GetDataResponse)
        return reply.data or b"", reply.stat

    async def add_auth(self, scheme: str, credential: bytes | str) -> None:
        """Authenticate this session (ZooKeeper's addAuth; the server knows "digest",
        credential "user:password"). Replayed on every reconnect. A refusal ends the
        session: AuthFailed, and the client goes LOST."""
        cred = credential_bytes(credential)
        header, _ = await self._call(OpCode.AUTH, J.AuthPacket(0, scheme, cred), xid=Xid.AUTH)
        if header.err != Err.OK:
            self._lose(AuthFailed, f"the server refused {scheme!r} credentials")
            raise error_for_code(header.err)
        self._auth.append((scheme, cred))

    async def add_watch(self, path: str, *, recursive: bool = False, max_buffer: int = 1024) -> PersistentWatch:
        """A persistent watch on path (recursive: and every node below); see PersistentWatch."""
        watch = PersistentWatch(self, path, recursive, max_buffer)
        mode = AddWatchMode.PERSISTENT_RECURSIVE if recursive else AddWatchMode.PERSISTENT
        await self._simple(OpCode.ADD_WATCH, J.AddWatchRequest(path, int(mode)), path,
                           WatchArm(path, watch, {Err.OK: watch.kind}))
        return watch

    async def _remove_persistent(self, watch: PersistentWatch) -> None:
        last = self._watches.discard(watch.kind, watch.path, watch)
        watch._end()
        if last and self._state is State.CONNECTED:
            await self._remove_server_watch(watch.path, watch.kind)

    def _overflowed(self, watch: PersistentWatch) -> None:
        if self._watches.discard(watch.kind, watch.path, watch) and self._helpers is not None:
            self._helpers.start_soon(self._remove_server_watch, watch.path, watch.kind)

    async def _remove_server_watch(self, path: str, kind: WatchKind) -> None:
        kind_type = WatcherType.PERSISTENT_RECURSIVE if kind is WatchKind.PERSISTENT_RECURSIVE else \
            WatcherType.PERSISTENT
        try:
            await self._call(OpCode.REMOVE_WATCHES, J.RemoveWatchesRequest(path, int(kind_type)), path)
        except ZooKeeperError:
            pass  # gone with the connection or the session anyway

    # -- helpers built on the operations ------------------------------------------------------
    async def cas(self, path: str, update: Callable[[bytes | None], bytes], *, create: bool = True,
                  acl: Sequence[J.ACL] | None = None, max_retries: int = 100) -> tuple[bytes, Stat]:
        """Read, compute `update(data)` (None if the node is missing), write it with the
        version read (or create the node), retry on BadVersion/NodeExists/NoNode up to
        max_retries times. Returns the data written and its Stat. ConnectionLoss
        propagates: a write in flight may have been applied, so it is never retried."""
        conflict: ZooKeeperError | None = None
        for _ in range(max_retries + 1):
            try:
                data, stat = await self.get(path)
            except NoNode:
                if not create:
                    raise
                new = update(None)
                try:
                    return new, (await self.create_with_stat(path, new, acl=acl))[1]
                except NodeExists as e:
                    conflict = e
                    continue
            new = update(data)
            try:
                return new, await self.set(path, new, version=stat.version)
            except (BadVersion, NoNode) as e:
                conflict = e
        assert conflict is not None
        raise type(conflict)(path, f"cas gave up after {max_retries + 1} attempts under contention")

    async def ensure_path(self, path: str, *, acl: Sequence[J.ACL] | None = None) -> None:
        """Create path and its missing ancestors (empty, persistent). Ancestors that exist are
        left alone, as Curator's ZKPaths.mkdirs does: a create checks CREATE on the parent before
        it finds the node exists, so a client allowed to create only deeper down would be refused."""
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            ancestor = "/" + "/".join(parts[:i])
            if await self.exists(ancestor) is not None:
                continue
            try:
                await self.create(ancestor, b"", acl=acl)
            except NodeExists:
                pass

    async def delete_recursive(self, path: str) -> None:
        """Delete path and everything below it (not atomic: a concurrent create below
        makes it fail with NotEmpty). A missing path is not an error."""
        try:
            for child in await self.children(path):
                await self.delete_recursive(f"{path.rstrip('/')}/{child}")
            await self.delete(path)
        except NoNode:
            pass


def __getattr__(name: str) -> object:
    # `from metastore.client import SyncMetaClient` (it lives in client/sync.py, which imports this module).
    if name == "SyncMetaClient":
        from metastore.client.sync import SyncMetaClient
        return SyncMetaClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
