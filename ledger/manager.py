"""The ledger manager: ledger metadata kept in the metastore, every change a versioned CAS.

Seed 000's hierarchical ledger manager: ledger `n` lives at
`{root}/{2 digits}/{4 digits}/L{4 digits}` of its 10-digit id, so no znode has
more than 10,000 children. Ids come from a metastore id generator (a counter
znode changed by CAS), so they are unique across every client of the cluster
and never reused. This is the SDK's only path to the metastore for ledgers
(ARCHITECTURE.md: `ledger` reaches the metastore only through its client).
"""

from __future__ import annotations

import json
from dataclasses import replace

from metastore import jute_records as J
from metastore.client import MetaClient
from metastore.client_ops import ANYONE
from metastore.errors import BadVersion, NoAuth, NodeExists, NoNode
from metastore.jute_defs import Perms
from metastore.recipes import IdGenerator

from ledger.errors import MetadataConflict, NoSuchLedger
from ledger.metadata import MAX_LEDGER_ID, LedgerMetadata, decode, encode, ledger_id_from_path, ledger_path

QUIRE_ROOT = "/quire"
DEFAULT_ROOT = "/quire/ledgers"
DEFAULT_IDGEN = "/quire/idgen/ledgers"
DEFAULT_KEYS = "/quire/ledger-keys"
# Ledger znodes and their folders: anyone may use them as ledger clients do, nobody may change their
# ACL (no ADMIN), so no client can lock the daemons (auditor, GC, workers) out of a ledger.
LEDGER_ACL = (J.ACL(int(Perms.READ | Perms.WRITE | Perms.CREATE | Perms.DELETE), ANYONE),)


class LedgerManager:
    """Create, read, CAS-write, list and delete ledger metadata.

    Versions are the znode's data version: `read` returns one, `write` takes the
    one it expects and raises MetadataConflict if someone else wrote since
    (the caller re-reads and decides, as seed 001 prescribes for each operation).
    """

    def __init__(self, meta: MetaClient, root: str = DEFAULT_ROOT, idgen_path: str = DEFAULT_IDGEN,
                 keys_root: str = DEFAULT_KEYS) -> None:
        self.meta = meta
        self.root = root.rstrip("/")
        self.keys_root = keys_root.rstrip("/")
        self._ids = IdGenerator(meta, idgen_path, start=1)
        self._parents: set[str] = set()
        self._key_owner: J.Id | None = None

    async def create(self, metadata: LedgerMetadata) -> tuple[LedgerMetadata, int]:
        """Store `metadata` under a fresh ledger id (its own ledger_id is ignored); returns the
        stored metadata and its version. Where the daemons published their identity (/quire's
        data), the master key goes to a znode only they can read, not into the metadata."""
        owner = await self._daemons() if metadata.master_key is not None else None
        while True:
            ledger_id = await self._ids.next()
            stored = _with_id(metadata, ledger_id)
            if owner is not None:
                assert stored.master_key is not None
                if not await self._create(ledger_path(self.keys_root, ledger_id), stored.master_key,
                                          (J.ACL(int(Perms.ALL), owner),)):
                    continue
                stored = replace(stored, master_key=None)
            if not await self._create(ledger_path(self.root, ledger_id), encode(stored), LEDGER_ACL):
                continue  # only if the counter was reset under existing ledgers: take the next id
            return stored, 0

    async def _create(self, path: str, data: bytes, acl: tuple[J.ACL, ...]) -> bool:
        await self._ensure_parent(path)
        try:
            await self.meta.create(path, data, acl=acl)
        except NodeExists:
            return False
        return True

    async def _daemons(self) -> J.Id | None:
        """The daemons' ACL id from /quire's data; None if none is published (no daemon secured /quire)."""
        if self._key_owner is None:
            try:
                data, _ = await self.meta.get(QUIRE_ROOT)
                self._key_owner = J.Id("digest", str(json.loads(data)["daemon_acl_id"]))
            except (NoNode, ValueError, KeyError, TypeError):
                return None
        return self._key_owner

    async def read_key(self, ledger_id: int) -> bytes | None:
        """The ledger's master key (what AutoRecovery's adds carry) from its key znode, readable by the
        daemons only (NoAuth for anyone else); None if it has none (kept in its metadata, or neither)."""
        try:
            return (await self.meta.get(ledger_path(self.keys_root, ledger_id)))[0]
        except NoNode:
            return None

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
        try:
            await self.meta.delete(ledger_path(self.keys_root, ledger_id))
        except (NoNode, NoAuth):
            pass  # no key znode (kept in the metadata, or none); or its folder is not ours to change

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
            top = self.keys_root if parent.startswith(self.keys_root + "/") else self.root
            await self.meta.ensure_path(top)  # open until the daemons take it over (clusterd/daemon_identity.py)
            await self.meta.ensure_path(parent, acl=LEDGER_ACL)
            self._parents.add(parent)


def _with_id(metadata: LedgerMetadata, ledger_id: int) -> LedgerMetadata:
    return replace(metadata, ledger_id=ledger_id)
