"""The ledger manager: ledger metadata kept in the metastore, every change a versioned CAS.

Seed 000's hierarchical ledger manager: ledger `n` lives at
`{root}/{2 digits}/{4 digits}/L{4 digits}` of its 10-digit id, so no znode has
more than 10,000 children. Ids come from a metastore id generator (a counter
znode changed by CAS), so they are unique across every client of the cluster
and never reused. This is the SDK's only path to the metastore for ledgers
(ARCHITECTURE.md: `ledger` reaches the metastore only through its client).

Who owns a ledger (issue 17; BookKeeper's `zkEnableSecurity`, whose ledger
managers create metadata with ZooKeeper's CREATOR_ALL_ACL). A session that holds
an authenticated identity (digest through MetaClient's `auth=`, x509 through a
TLS client certificate, sasl) creates its ledgers' znodes with the "auth"
scheme, so they belong to that identity:

    metadata  L<n>          owner RWCD, daemons RWCD, world READ (readers need it;
                            they prove the password, not an identity)
    metadata  L<n>/owned    the same ACL
    key       L<n>          daemons ALL, owner CREATE|DELETE (nobody else reads it)
    key       L<n>/owned    the same ACL

Nobody gets ADMIN, so nobody can lock the daemons (auditor, workers) out of a
ledger. ZooKeeper checks DELETE on the parent, and the folders hold up to
10,000 ledgers of many clients, so they stay open to all; what stops a
stranger is the `owned` child: a znode with a child cannot be deleted
(NotEmpty), and only the owner and the daemons may delete that child (DELETE on
the ledger znode). The owner's delete removes both in one multi. The same multi
that creates the ledger creates its guards, so no owned ledger is ever
unguarded. A session without an authenticated identity gets InvalidACL for
"auth" and creates its ledgers as before: open to every client (LEDGER_ACL).
"""

from __future__ import annotations

import json
from dataclasses import replace

from metastore.wire import jute_records as J
from metastore.client import MetaClient
from metastore.client.core import ANY_VERSION, Version
from metastore.client.ops import ANYONE, Create, Delete, MultiFailed, Op
from metastore.errors import BadVersion, InvalidACL, NoAuth, NodeExists, NoNode, NotEmpty
from metastore.wire.jute_defs import Perms
from metastore.client.recipes import IdGenerator

from ledger.errors import MetadataConflict, NoSuchLedger, NotLedgerOwner
from ledger.metadata import MAX_LEDGER_ID, LedgerMetadata, decode, encode, ledger_id_from_path, ledger_path

QUIRE_ROOT = "/quire"
DEFAULT_ROOT = "/quire/ledgers"
DEFAULT_IDGEN = "/quire/idgen/ledgers"
DEFAULT_KEYS = "/quire/ledger-keys"
# Ledger znodes and their folders: anyone may use them as ledger clients do, nobody may change their
# ACL (no ADMIN), so no client can lock the daemons (auditor, GC, workers) out of a ledger.
LEDGER_ACL = (J.ACL(int(Perms.READ | Perms.WRITE | Perms.CREATE | Perms.DELETE), ANYONE),)
OWNED = "owned"  # the child that keeps strangers from deleting an owned ledger's znodes (module docstring)
_CREATOR = J.Id("auth", "")  # the creating session's authenticated ids (expanded by the metastore)
_RWCD = int(Perms.READ | Perms.WRITE | Perms.CREATE | Perms.DELETE)


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
        self._owned: bool | None = None  # whether the session's creates can be owned ("auth"); None: not tried

    async def create(self, metadata: LedgerMetadata) -> tuple[LedgerMetadata, int]:
        """Store `metadata` under a fresh ledger id (its own ledger_id is ignored); returns the
        stored metadata and its version. Where the daemons published their identity (/quire's
        data), the master key goes to a znode only they can read, not into the metadata. An
        authenticated session owns what it creates (module docstring)."""
        daemons = await self._daemons()
        while True:
            ledger_id = await self._ids.next()
            stored = _with_id(metadata, ledger_id)
            if daemons is not None and stored.master_key is not None:
                key, stored = stored.master_key, replace(stored, master_key=None)
            else:
                key = None
            await self._ensure_parent(ledger_path(self.root, ledger_id))
            if key is not None:
                await self._ensure_parent(ledger_path(self.keys_root, ledger_id))
            if await self._create_ledger(stored, key, daemons):
                return stored, 0
            # NodeExists: only if the counter was reset under existing ledgers: take the next id

    async def _create_ledger(self, stored: LedgerMetadata, key: bytes | None, daemons: J.Id | None) -> bool:
        """One multi: the key znode (if any) and the metadata, each with its OWNED guard when the
        session is authenticated. False if the id is taken. A session without an authenticated id
        gets InvalidACL for "auth": it is remembered, and the ledger created open, as before owners."""
        while True:
            owned = self._owned is not False
            try:
                await self._multi(_ledger_ops(self.root, self.keys_root, stored, key, daemons, owned))
            except NodeExists:
                return False
            except InvalidACL:
                if not owned:
                    raise
                self._owned = False
                continue
            self._owned = self._owned or owned
            return True

    async def _multi(self, ops: list[Op]) -> None:
        """A multi whose failure raises the failing op's own error (NoNode, NoAuth, BadVersion...)."""
        try:
            await self.meta.multi(ops)
        except MultiFailed as e:
            raise e.error from None

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
        except NoAuth:
            raise _not_owner(metadata.ledger_id, "write or recover") from None
        return stat.version

    async def delete(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Remove the ledger's metadata; bookies reclaim its entries by garbage collection. An owned
        ledger only by its owner or the daemons (NotLedgerOwner for anyone else)."""
        path = ledger_path(self.root, ledger_id)
        version = ANY_VERSION if expected_version is None else expected_version
        try:
            await self._delete_guarded(path, version)
        except NoNode:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist (never created, or deleted)") from None
        except BadVersion:
            raise MetadataConflict(f"ledger {ledger_id}: metadata changed since version {expected_version}") from None
        except NoAuth:
            raise _not_owner(ledger_id, "delete") from None
        key = ledger_path(self.keys_root, ledger_id)
        try:
            await self._delete_guarded(key, ANY_VERSION)
        except (NoNode, NoAuth, NotEmpty):
            pass  # no key znode (kept in the metadata, or none); or not ours to delete: a few bytes left

    async def _delete_guarded(self, path: str, version: Version) -> None:
        """Delete the znode with its OWNED child, or alone if it has none (an open ledger's). Not by
        listing the children first: the owner may not read its key znode."""
        try:
            await self._multi([Delete(f"{path}/{OWNED}"), Delete(path, version)])
        except NoNode:
            await self._multi([Delete(path, version)])

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
            await self.meta.ensure_path(top)  # open until the daemons take it over (clusterd/daemon/identity.py)
            await self.meta.ensure_path(parent, acl=LEDGER_ACL)
            self._parents.add(parent)


def _with_id(metadata: LedgerMetadata, ledger_id: int) -> LedgerMetadata:
    return replace(metadata, ledger_id=ledger_id)


def _not_owner(ledger_id: int, what: str) -> NotLedgerOwner:
    return NotLedgerOwner(f"ledger {ledger_id} belongs to the identity that created it: only it and the "
                          f"cluster's daemons may {what} it; authenticate the ledger client's MetaClient as "
                          "that identity (auth=..., or its TLS client certificate)")


def _ledger_ops(root: str, keys_root: str, stored: LedgerMetadata, key: bytes | None, daemons: J.Id | None,
                owned: bool) -> list[Op]:
    """The creates of a ledger's znodes: its key znode (if `key`) and its metadata, owned or open."""
    path, key_path = ledger_path(root, stored.ledger_id), ledger_path(keys_root, stored.ledger_id)
    ops: list[Op] = []
    if key is not None:
        assert daemons is not None
        key_acl = (J.ACL(int(Perms.ALL), daemons), *((J.ACL(int(Perms.CREATE | Perms.DELETE), _CREATOR),)
                                                    if owned else ()))
        ops.append(Create(key_path, key, key_acl))
        if owned:
            ops.append(Create(f"{key_path}/{OWNED}", b"", key_acl))
    if owned:
        acl = (J.ACL(_RWCD, _CREATOR), *((J.ACL(_RWCD, daemons),) if daemons is not None else ()),
               J.ACL(int(Perms.READ), ANYONE))
        ops += [Create(path, encode(stored), acl), Create(f"{path}/{OWNED}", b"", acl)]
    else:
        ops.append(Create(path, encode(stored), LEDGER_ACL))
    return ops
