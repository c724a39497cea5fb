"""The ledger manager: ledger metadata kept in the metastore, every change a versioned CAS.

Seed 000's hierarchical ledger manager: ledger `n` lives at
`{root}/{2 digits}/{4 digits}/L{4 digits}` of its 10-digit id, so no znode has
more than 10,000 children. Ids come from a metastore id generator (a counter
znode changed by CAS), so they are unique across every client of the cluster
and never reused. This is the SDK's only path to the metastore for ledgers
(ARCHITECTURE.md: `ledger` reaches the metastore only through its client).
"""

from __future__ import annotations

from dataclasses import replace

from metastore.client import MetaClient
from metastore.errors import BadVersion, NodeExists, NoNode
from metastore.recipes import IdGenerator

from ledger.errors import MetadataConflict, NoSuchLedger
from ledger.metadata import MAX_LEDGER_ID, LedgerMetadata, decode, encode, ledger_id_from_path, ledger_path

DEFAULT_ROOT = "/quire/ledgers"
DEFAULT_IDGEN = "/quire/idgen/ledgers"


class LedgerManager:
    """Create, read, CAS-write, list and delete ledger metadata.

    Versions are the znode's data version: `read` returns one, `write` takes the
    one it expects and raises MetadataConflict if someone else wrote since
    (the caller re-reads and decides, as seed 001 prescribes for each operation).
    """

    def __init__(self, meta: MetaClient, root: str = DEFAULT_ROOT, idgen_path: str = DEFAULT_IDGEN) -> None:
        self.meta = meta
        self.root = root.rstrip("/")
        self._ids = IdGenerator(meta, idgen_path, start=1)
        self._parents: set[str] = set()

    async def create(self, metadata: LedgerMetadata) -> tuple[LedgerMetadata, int]:
        """Store `metadata` under a fresh ledger id (its own ledger_id is ignored); returns the
        stored metadata and its version."""
        while True:
            ledger_id = await self._ids.next()
            stored = _with_id(metadata, ledger_id)
            path = ledger_path(self.root, ledger_id)
            await self._ensure_parent(path)
            try:
                await self.meta.create(path, encode(stored))
            except NodeExists:
                continue  # only if the counter was reset under existing ledgers: take the next id
            return stored, 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The ledger's metadata and version; NoSuchLedger if it does not exist (or was deleted)."""
        path = ledger_path(self.root, ledger_id)
        try:
            data, stat = await self.meta.get(path)
        except NoNode:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist (never created, or deleted)") from None
        return decode(data), stat.version

    async def write(self, metadata: LedgerMetadata, expected_version: int) -> int:
        """CAS: replace the metadata if its version is still `expected_version`; returns the new version."""
        path = ledger_path(self.root, metadata.ledger_id)
        try:
            stat = await self.meta.set(path, encode(metadata), version=expected_version)
        except BadVersion:
            raise MetadataConflict(f"ledger {metadata.ledger_id}: metadata changed since version {expected_version}") from None
        except NoNode:
            raise NoSuchLedger(f"ledger {metadata.ledger_id} does not exist (deleted meanwhile)") from None
        return stat.version

    async def delete(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Remove the ledger's metadata; bookies reclaim its entries by garbage collection."""
        path = ledger_path(self.root, ledger_id)
        try:
            if expected_version is None:
                await self.meta.delete(path)
            else:
                await self.meta.delete(path, version=expected_version)
        except NoNode:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist (never created, or deleted)") from None
        except BadVersion:
            raise MetadataConflict(f"ledger {ledger_id}: metadata changed since version {expected_version}") from None

    async def exists(self, ledger_id: int) -> bool:
        """Whether the ledger's metadata exists now (sync, then read). An id outside the layout's
        range can have no metadata: False, not an error (a bookie may hold entries a client sent
        under such an id; its garbage collector asks)."""
        if not 0 <= ledger_id <= MAX_LEDGER_ID:
            return False
        return await self.meta.exists(ledger_path(self.root, ledger_id), linearizable=True) is not None

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending (walks the three levels; not a snapshot: concurrent
        creates and deletes may or may not show)."""
        ids: list[int] = []
        for top in sorted(await self._children(self.root)):
            for middle in sorted(await self._children(f"{self.root}/{top}")):
                for leaf in sorted(await self._children(f"{self.root}/{top}/{middle}")):
                    try:
                        ids.append(ledger_id_from_path(self.root, f"{self.root}/{top}/{middle}/{leaf}"))
                    except ValueError:
                        continue  # not a ledger znode (someone else's): ignore it
        return ids

    async def _children(self, path: str) -> list[str]:
        try:
            return await self.meta.children(path)
        except NoNode:
            return []

    async def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent not in self._parents:
            await self.meta.ensure_path(parent)
            self._parents.add(parent)


def _with_id(metadata: LedgerMetadata, ledger_id: int) -> LedgerMetadata:
    return replace(metadata, ledger_id=ledger_id)
