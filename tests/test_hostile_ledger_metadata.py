"""A ledger belongs to the client that created it (issue 17, "any client can ... delete ledger metadata").

A 3-node cluster as `clusterctl up` runs it (every node a voter and a bookie;
the daemons own /quire, tests/test_hostile_quire_metadata.py). An application
authenticates its ledger SDK session (digest `app:...`) and creates ledgers:
as with BookKeeper's `zkEnableSecurity`, their metadata and key znodes are
then its own and the daemons', not everyone's (ledger/manager.py, "Who owns a
ledger"). A kazoo client that did not authenticate tries to delete or rewrite
them, or to recover them; every attempt fails, every node keeps running, and
the ledger reads back. The owner can still delete its ledger; the daemons
(AutoRecovery) can still read its key and recover it. `clusterctl bookie
decommission`, run with the daemon secret, creates tasks only the daemons can
change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NotEmptyError
from kazoo.security import OPEN_ACL_UNSAFE

from bookie.client import BookiePool
from bookie.entry import DigestType
from clusterd.daemon import identity as daemon_identity
from ledger.autorecovery.tasks import DECOMMISSIONED, task_path
from ledger.client import LedgerClient
from ledger.errors import NoSuchLedger, NotLedgerOwner
from ledger.manager import DEFAULT_KEYS, DEFAULT_ROOT, LedgerManager
from ledger.metadata import ledger_path
from metastore.client import MetaClient
from cluster_fixtures import Cluster, copy_config, start_cluster
from cluster_fixtures import kazoo_session

pytestmark = pytest.mark.multiprocess

PASSWORD = b"ledger password"
APP = (("digest", "app:app-secret"),)
PAYLOADS = [b"entry %d" % i for i in range(5)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(copy_config(tmp_path_factory.mktemp("ledger_metadata")))
    yield start_cluster(c, timeout=120)
    c.down()


def in_sdk(cluster: Cluster, body: Callable[[LedgerClient], object], auth=APP) -> object:
    """Run `await body(client)` with a ledger SDK client authenticated with `auth` (() for none)."""
    async def run() -> object:
        with trio.fail_after(60):
            async with MetaClient(cluster.config.client_addresses(), auth=auth) as meta, BookiePool() as pool, \
                    LedgerClient(meta, pool) as client:
                client.pool.update(cluster.config.bookie_addresses())
                return await body(client)
    return trio.run(run)


def write_ledger(cluster: Cluster, close: bool = True, auth=APP) -> int:
    async def body(client: LedgerClient) -> int:
        writer = await client.create(3, 2, 2, DigestType.CRC32C, password=PASSWORD)
        await writer.append_many(PAYLOADS)
        if close:
            await writer.close()
        return writer.ledger_id
    return in_sdk(cluster, body, auth)


def read_back(cluster: Cluster, ledger_id: int) -> list[bytes]:
    async def body(client: LedgerClient) -> list[bytes]:
        reader = await client.open(ledger_id, PASSWORD)
        return [e.payload for e in await reader.read(0, len(PAYLOADS) - 1)]
    return in_sdk(cluster, body, auth=())


@pytest.fixture
def intruder(cluster: Cluster) -> Iterator[KazooClient]:
    with kazoo_session(cluster, timeout=10.0, start_timeout_s=30) as zk:
        yield zk


@pytest.fixture
def daemons(cluster: Cluster) -> Iterator[KazooClient]:
    """A kazoo client with the daemons' identity: sees what a stranger cannot (the key znodes)."""
    with kazoo_session(cluster, timeout=10.0, start_timeout_s=30,
                       auth_data=[("digest", daemon_identity.load_or_create(cluster.path).credential)]) as zk:
        yield zk


def fails(cluster: Cluster, attempt: Callable[[], object], *errors: type[Exception]) -> None:
    """The attempt fails with one of `errors`, and every node keeps running and serving."""
    pids = cluster.pids()
    with pytest.raises(errors or (NoAuthError,)):
        attempt()
    cluster.assert_running(pids)


def test_a_stranger_cannot_delete_or_rewrite_an_owned_ledgers_metadata(cluster, intruder):
    ledger_id = write_ledger(cluster)
    path = ledger_path(DEFAULT_ROOT, ledger_id)
    fails(cluster, lambda: intruder.delete(path), NoAuthError, NotEmptyError)
    fails(cluster, lambda: intruder.delete(path, recursive=True), NoAuthError, NotEmptyError)
    fails(cluster, lambda: intruder.set(path, b"{}"))
    fails(cluster, lambda: intruder.set_acls(path, OPEN_ACL_UNSAFE))
    for child in intruder.get_children(path):
        fails(cluster, lambda: intruder.delete(f"{path}/{child}"))
    fails(cluster, lambda: intruder.create(f"{path}/intruder", b""))
    assert intruder.exists(path) is not None
    assert read_back(cluster, ledger_id) == PAYLOADS


def test_a_stranger_cannot_delete_an_owned_ledgers_key(cluster, intruder, daemons):
    ledger_id = write_ledger(cluster)
    key = ledger_path(DEFAULT_KEYS, ledger_id)
    assert daemons.exists(key) is not None
    fails(cluster, lambda: intruder.delete(key), NoAuthError, NotEmptyError)
    fails(cluster, lambda: intruder.delete(key, recursive=True), NoAuthError, NotEmptyError)
    for child in daemons.get_children(key):
        fails(cluster, lambda: intruder.delete(f"{key}/{child}"))
    assert daemons.exists(key) is not None, "a stranger deleted the ledger's key: AutoRecovery cannot repair it"


def test_a_stranger_cannot_recover_an_owned_ledger_but_the_daemons_can(cluster):
    ledger_id = write_ledger(cluster, close=False)

    async def stranger(client: LedgerClient) -> None:
        await client.recover(ledger_id, PASSWORD)  # knows the password, not the identity
    with pytest.raises(NotLedgerOwner):
        in_sdk(cluster, stranger, auth=())

    async def auto_recovery(client: LedgerClient) -> int:
        key = await LedgerManager(client.meta).read_key(ledger_id)
        assert key is not None
        return (await client.recover_with_master_key(ledger_id, key)).last_entry
    daemon_auth = daemon_identity.load_or_create(cluster.path).auth
    assert in_sdk(cluster, auto_recovery, auth=daemon_auth) == len(PAYLOADS) - 1
    assert read_back(cluster, ledger_id) == PAYLOADS


def test_the_owner_deletes_its_ledger(cluster, daemons):
    ledger_id = write_ledger(cluster)

    async def delete(client: LedgerClient) -> None:
        await client.delete(ledger_id)
        with pytest.raises(NoSuchLedger):
            await client.manager.read(ledger_id)
    in_sdk(cluster, delete)
    assert daemons.exists(ledger_path(DEFAULT_ROOT, ledger_id)) is None
    assert daemons.exists(ledger_path(DEFAULT_KEYS, ledger_id)) is None


def test_a_ledger_created_without_credentials_stays_open(cluster, intruder):
    """Documented (docs/ledger.md): without credentials a ledger is everyone's, as before."""
    ledger_id = write_ledger(cluster, auth=())
    path = ledger_path(DEFAULT_ROOT, ledger_id)
    intruder.set(path, intruder.get(path)[0])
    intruder.delete(path)


def test_clusterctl_decommission_creates_tasks_only_the_daemons_can_change(cluster, intruder):
    ledger_id = write_ledger(cluster)
    done = cluster.ctl("bookie", "decommission", "3", "--no-wait")
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        fails(cluster, lambda: intruder.set(task_path(ledger_id), b"{}"))
        fails(cluster, lambda: intruder.set_acls(task_path(ledger_id), OPEN_ACL_UNSAFE))
        fails(cluster, lambda: intruder.delete(f"{DECOMMISSIONED}/3"))
        fails(cluster, lambda: intruder.set_acls(f"{DECOMMISSIONED}/3", OPEN_ACL_UNSAFE))
    finally:
        assert cluster.ctl("bookie", "recommission", "3").returncode == 0
    pause = cluster.ctl("recovery", "pause")
    assert pause.returncode == 0, pause.stdout + pause.stderr
    try:
        fails(cluster, lambda: intruder.delete("/quire/autorecovery/paused"))
    finally:
        assert cluster.ctl("recovery", "resume").returncode == 0


def test_the_verifiers_still_find_an_owned_ledger_under_its_guard():
    """replay's ledgers_in skipped znodes with children: an owned ledger (with its `owned` child)
    went missing from the Spark checks."""
    from ledger.metadata import Fragment, LedgerMetadata, encode
    from metastore.core.acl import OPEN_ACL_UNSAFE as OPEN
    from metastore.core.tree import DataTree
    from replay.verify_ledger_decode import ledgers_in

    tree, zxid = DataTree(), 0
    metadata = LedgerMetadata(7, 3, 2, 2, (Fragment(0, (1, 2, 3)),), DigestType.CRC32C, b"r", 1)
    path = ledger_path(DEFAULT_ROOT, 7)
    parts = path.split("/")[1:]
    for i in range(1, len(parts) + 1):
        zxid += 1
        tree.create("/" + "/".join(parts[:i]), encode(metadata) if i == len(parts) else b"", OPEN, 0,
                    1, zxid, 0)
    tree.create(f"{path}/owned", b"", OPEN, 0, 1, zxid + 1, 0)
    found, broken = ledgers_in(tree, DEFAULT_ROOT)
    assert [m.ledger_id for m in found] == [7] and broken == []
