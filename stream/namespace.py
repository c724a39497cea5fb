"""The namespace of named logs in the metastore (edge): create, list, stat, delete, truncate,
subscriptions, and the segment list's reads and CAS changes that writers and readers share.

    async with MetaClient(hosts) as meta, BookiePool() as pool, LedgerClient(meta, pool) as ledgers:
        logs = Namespace(meta, ledgers)
        await logs.create("orders")
        async with logs.writer("orders") as w:       # ownership, then the last owner's segment recovered
            position = await w.write(1, b"first")
        async for record in logs.reader("orders"):   # from the head, then tailing
            ...

docs/streams.md has the layout, the protocol and the guarantees.
"""

from __future__ import annotations

import time
from ledger.client import LedgerClient
from ledger.errors import NoSuchLedger
from metastore.client import MetaClient
from metastore.client.ops import Check, Create, Delete, MultiFailed, SetData
from metastore.errors import BadVersion, NodeExists, NoNode
from stream.errors import LogExists, LogNotFound, StreamError
from stream.log_metadata import DEFAULT_ROOT, LogMetadata, LogPaths, LogSettings
from stream.position import Position
from stream.segment import Segment
from stream.segment_list import Change, SegmentList

READ_RETRIES = 20


class ListChanged(StreamError):
    """The segment list changed between its read and a change to it (a lost CAS): read it again."""


def now_ms() -> int:
    return int(time.time() * 1000)


def ledger_password(name: str) -> bytes:
    """The password of a log's segment ledgers. Not a secret (every reader of the log needs it):
    who may write a log is decided by the metastore's identities and ACLs, as for ledgers."""
    return f"quire-stream:{name}".encode()


class Namespace:
    """Named logs under `root` in the metastore, their segments on `ledgers`."""

    def __init__(self, meta: MetaClient, ledgers: LedgerClient, root: str = DEFAULT_ROOT) -> None:
        self.meta, self.ledgers, self.root = meta, ledgers, root.rstrip("/") or "/"

    def paths(self, name: str) -> LogPaths:
        return LogPaths(self.root, name)

    # -- logs --------------------------------------------------------------------------------
    async def create(self, name: str, settings: LogSettings | None = None) -> None:
        """A new, empty log; LogExists if the name is taken."""
        p = self.paths(name)
        metadata = LogMetadata(created_ms=now_ms(), settings=(settings or LogSettings()).check())
        await self.meta.ensure_path(self.root)
        try:
            await self.meta.multi([Create(p.log, metadata.encode()), Create(p.segments), Create(p.owner),
                                   Create(p.subscribers)])
        except MultiFailed as e:
            if isinstance(e.error, NodeExists):
                raise LogExists(f"log {name!r} exists already; open it, or delete it first") from None
            raise

    async def list(self) -> list[str]:
        try:
            return sorted(await self.meta.children(self.root))
        except NoNode:
            return []

    async def exists(self, name: str) -> bool:
        return await self.meta.exists(self.paths(name).log) is not None

    async def read(self, name: str) -> SegmentList:
        """The log's metadata and segments, consistent: read between two reads of the log znode at
        the same version (every change to the list sets it)."""
        p = self.paths(name)
        for _ in range(READ_RETRIES):
            try:
                data, stat = await self.meta.get(p.log)
                segments, versions = [], {}
                for child in sorted(await self.meta.children(p.segments)):
                    seq = p.seq_of(child)
                    if seq is None:
                        continue  # not ours: ignored, as ZooKeeper tools may leave things around
                    raw, seg_stat = await self.meta.get(p.segment(seq))
                    segment = Segment.decode(raw, f"log {name!r} segment {seq}")
                    segments.append(segment)
                    versions[seq] = seg_stat.version
                if (await self.meta.get(p.log))[1].version != stat.version:
                    continue
            except NoNode:
                if await self.meta.exists(p.log) is None:
                    raise LogNotFound(f"no log {name!r} under {self.root}; create it first") from None
                continue  # a segment deleted between the listing and its read
            return SegmentList(LogMetadata.decode(data, f"log {name!r}"), stat.version, tuple(segments), versions)
        raise StreamError(f"log {name!r} changed {READ_RETRIES} times while being read; try again")

    async def apply(self, name: str, before: SegmentList, after: SegmentList) -> SegmentList:
        """Change the list read as `before` into `after` in one multi; ListChanged if it changed
        meanwhile (nothing applied). Returns the list as it now is."""
        change = before.change_to(after)
        p = self.paths(name)
        try:
            await self.meta.multi(self._ops(p, change))
        except MultiFailed as e:
            if isinstance(e.error, (BadVersion, NoNode, NodeExists)):
                raise ListChanged(f"log {name!r} changed under this change ({e.error})") from None
            raise
        return before.applied(change)

    @staticmethod
    def _ops(p: LogPaths, change: Change) -> list[Create | Delete | SetData | Check]:
        ops: list[Create | Delete | SetData | Check] = [SetData(p.log, change.log.encode(), change.log_version)]
        for segment, version in change.put:
            if version is None:
                ops.append(Create(p.segment(segment.seq), segment.encode()))
            else:
                ops.append(SetData(p.segment(segment.seq), segment.encode(), version))
        ops += [Delete(p.segment(segment.seq), version) for segment, version in change.delete]
        return ops

    async def delete(self, name: str) -> None:
        """The log, its subscriptions and its segments' ledgers (the bookies reclaim their space)."""
        p = self.paths(name)
        listing = await self.read(name)
        for segment in listing.segments:
            await self.delete_ledger(segment.ledger_id)
        await self.meta.delete_recursive(p.log)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a segment's ledger (gone already is fine): truncation, deletion, a lost takeover."""
        try:
            await self.ledgers.delete(ledger_id)
        except (NoSuchLedger, NoNode):
            pass

    async def truncate(self, name: str, before: Position) -> SegmentList:
        """Hide every record before `before` from readers and delete the segments wholly before it
        with their ledgers. Never moves the truncation point back."""
        for _ in range(READ_RETRIES):
            listing = await self.read(name)
            after = listing.truncated(before)
            if after == listing:
                return listing
            try:
                done = await self.apply(name, listing, after)
            except ListChanged:
                continue
            kept = {s.seq for s in after.segments}
            for segment in listing.segments:
                if segment.seq not in kept:
                    await self.delete_ledger(segment.ledger_id)
            return done
        raise StreamError(f"log {name!r} kept changing while being truncated; try again")

    async def apply_retention(self, name: str) -> Position | None:
        """Truncate by the log's retention settings, if they ask for it; the new truncation point."""
        point = (await self.read(name)).retention_point(now_ms())
        if point is not None:
            await self.truncate(name, point)
        return point

    # -- subscriptions -----------------------------------------------------------------------
    async def commit(self, name: str, subscription: str, position: Position) -> None:
        """Store a subscription's position (the next record it wants is after this one)."""
        path = self.paths(name).subscriber(subscription)
        data = str(position).encode()
        try:
            await self.meta.set(path, data)
        except NoNode:
            try:
                await self.meta.create(path, data)
            except NodeExists:
                await self.meta.set(path, data)

    async def subscription(self, name: str, subscription: str) -> Position | None:
        try:
            data, _ = await self.meta.get(self.paths(name).subscriber(subscription))
        except NoNode:
            return None
        return Position.parse(data.decode("ascii", "replace"))

    async def subscriptions(self, name: str) -> dict[str, Position]:
        p = self.paths(name)
        out = {}
        for child in sorted(await self.meta.children(p.subscribers)):
            found = await self.subscription(name, child)
            if found is not None:
                out[child] = found
        return out

    # -- writers and readers ---------------------------------------------------------------------
    def writer(self, name: str, *, identity: bytes = b"", wait: bool = False):  # -> LogWriter
        from stream.writer import LogWriter  # it builds on this module
        return LogWriter(self, name, identity=identity, wait=wait)

    def reader(self, name: str, start: Position | None = None, *, txid: int | None = None,
               subscription: str | None = None, tail: bool = False, follow: bool = True):  # -> LogReader
        """Records from `start` (default: the head), or from `txid`, after `subscription`'s position,
        or from the tail; `follow=False` ends at the last acknowledged record (stream/reader.py)."""
        from stream.reader import LogReader
        return LogReader(self, name, start, txid=txid, subscription=subscription, tail=tail, follow=follow)

