"""The daemons' own metastore identity, and the ACLs that make /quire theirs (issue 17, Build 4).

Every clusterd process (and clusterctl, run by the operator) authenticates its
metastore sessions with one digest identity, `quire-daemon:<password>`, whose
password is an HMAC of a secret generated at the first start of any node of
the cluster: 32 random bytes in hex, in the file `quire-daemon.secret` next to
cluster.toml (mode 0600; created once, atomically, by whichever node starts
first; on several hosts, copy it beside each host's cluster.toml as you copy
cluster.toml itself). The metastore only ever sees the SHA-1 digest id of that
credential (ZooKeeper's digest scheme), which /quire's data publishes so that
ledger clients can grant the daemons a znode (a ledger's key).

`secure_layout` creates /quire and the folders under it with these ACLs (and
puts them back on folders that have others, e.g. made before this, while the
daemons may still change them):

    daemon: ALL; world: READ          /quire, bookies/{available,readonly,cookies},
                                      autorecovery/..., underreplicated(-locks)
    daemon: ALL; world: READ|CREATE   ledgers/ and idgen/ (ledger clients create ledgers)
    daemon: ALL; world: READ|WRITE    idgen/ledgers (the ledger id counter, a CAS)
    daemon: ALL; world: READ|CREATE   ledger-keys/ (a client stores its ledger's key: ALL for the daemons
                                      and nothing for anyone else, itself included)

So a client that is not the daemons cannot register a bookie, edit a cookie,
create or remove AutoRecovery tasks, read a ledger's master key, or change any
of these ACLs. What stays open, and why, is in docs/operations.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from bookie.registration import AVAILABLE, COOKIES, READONLY
from bookie.registration import ROOT as BOOKIES
from ledger.autorecovery.tasks import DECOMMISSIONED, ELECTION, LOCKS, TASKS
from ledger.autorecovery.tasks import ROOT as AUTORECOVERY
from ledger.manager import DEFAULT_IDGEN, DEFAULT_KEYS, DEFAULT_ROOT, QUIRE_ROOT
from metastore.wire import jute_records as J
from metastore.core.acl import generate_digest
from metastore.client import MetaClient
from metastore.client.ops import ANYONE
from metastore.errors import NodeExists, NoNode
from metastore.wire.jute_defs import Perms
from edge.files import FILE_MODE

log = logging.getLogger("clusterd.daemon.identity")

SECRET_FILE = "quire-daemon.secret"
SECRET_BYTES = 32
USER = "quire-daemon"


class DaemonSecretError(Exception):
    """The daemon secret file exists but cannot be used; the message says what to do."""


@dataclass(frozen=True, slots=True)
class DaemonIdentity:
    """The digest identity of the cluster's daemons, derived from the cluster's daemon secret."""

    secret: bytes

    @property
    def credential(self) -> str:
        """What add_auth("digest", ...) takes: "quire-daemon:<password>"."""
        return f"{USER}:{hmac.new(self.secret, b'quire daemon digest', hashlib.sha256).hexdigest()}"

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        """MetaClient(auth=...): authenticated on every connection of the session."""
        return (("digest", self.credential),)

    @property
    def acl_id(self) -> J.Id:
        return J.Id("digest", generate_digest(self.credential))

    def acl(self, world: int = Perms.READ) -> list[J.ACL]:
        """ALL for the daemons, `world` (a Perms mask, 0 for nothing) for everyone else."""
        return [J.ACL(int(Perms.ALL), self.acl_id), *([J.ACL(int(world), ANYONE)] if world else [])]


def secret_path(config_path: Path) -> Path:
    return config_path.parent / SECRET_FILE


def load_or_create(config_path: Path) -> DaemonIdentity:
    """The identity from the secret file beside cluster.toml, generating the file on the first start."""
    path = secret_path(config_path)
    if not path.exists():
        _create_secret(path)
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as e:
        raise DaemonSecretError(f"cannot read the daemon secret {path}: {e}; restore it from another node "
                                "(every node needs the same file)") from None
    if len(secret) < 16:
        raise DaemonSecretError(f"the daemon secret {path} holds {len(secret)} bytes, fewer than 16: restore it "
                                "from another node (every node needs the same file)")
    return DaemonIdentity(secret)


def operator_auth(config_path: Path) -> tuple[tuple[str, str], ...]:
    """clusterctl's metastore auth: the daemons' identity when the secret file is beside cluster.toml
    (the operator changes /quire: pause, decommission), else none. clusterctl never creates it."""
    if not secret_path(config_path).exists():
        return ()
    return load_or_create(config_path).auth


def _create_secret(path: Path) -> None:
    """Write a fresh secret; nodes starting together race, and exactly one file wins whole (a
    complete temporary file is linked into place, which fails if the name exists)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.write(fd, (secrets.token_bytes(SECRET_BYTES).hex() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def layout(identity: DaemonIdentity) -> list[tuple[str, list[J.ACL]]]:
    """Every folder of /quire the daemons own, parents first, with its ACL."""
    read, create, write = int(Perms.READ), int(Perms.CREATE), int(Perms.WRITE)
    folders = [(QUIRE_ROOT, read), (BOOKIES, read), (AVAILABLE, read), (READONLY, read), (COOKIES, read),
               (AUTORECOVERY, read), (ELECTION, read), (DECOMMISSIONED, read), (TASKS, read), (LOCKS, read),
               (DEFAULT_ROOT, read | create), (DEFAULT_IDGEN.rsplit("/", 1)[0], read | create),
               (DEFAULT_IDGEN, read | write), (DEFAULT_KEYS, read | create)]
    return [(path, identity.acl(world)) for path, world in folders]


async def secure_layout(meta: MetaClient, identity: DaemonIdentity) -> None:
    """Create /quire's folders with their ACLs, or put those ACLs back; `meta` is authenticated as
    the daemons. /quire's data names the daemons' ACL id (for ledger clients storing a key).
    NoAuth if a folder's ACL no longer lets the daemons change it (a superuser must fix it);
    DaemonSecretError if /quire names another daemon identity (this node's secret file is not
    the cluster's: retrying could never succeed)."""
    await _check_published_identity(meta, identity)
    doc = json.dumps({"daemon_acl_id": identity.acl_id.id}).encode()
    for path, acl in layout(identity):
        data = doc if path == QUIRE_ROOT else b""
        try:
            await meta.create(path, data, acl=acl)
            continue
        except NodeExists:
            pass
        current, _ = await meta.get_acl(path)
        if sorted(map(_key, current)) != sorted(map(_key, acl)):
            log.warning("event=quire_acl_restored path=%s was=%s", path, [_key(a) for a in current])
            await meta.set_acl(path, acl)
        if path == QUIRE_ROOT and (await meta.get(path))[0] != doc:
            await meta.set(path, doc)


async def _check_published_identity(meta: MetaClient, identity: DaemonIdentity) -> None:
    try:
        data, _ = await meta.get(QUIRE_ROOT)
    except NoNode:
        return
    try:
        published = json.loads(data).get("daemon_acl_id") if data else None
    except (ValueError, AttributeError):
        published = None  # unreadable: secure_layout writes it again
    if published and published != identity.acl_id.id:
        raise DaemonSecretError(
            f"this node's {SECRET_FILE} is not the cluster's: {QUIRE_ROOT} belongs to the daemon identity "
            f"digest:{published}, this node would be digest:{identity.acl_id.id}; copy {SECRET_FILE} from a node "
            "of this cluster beside this node's cluster.toml (every node needs the same file), then start it again")


def _key(acl: J.ACL) -> tuple[int, str, str]:
    return acl.perms, acl.id.scheme, acl.id.id

