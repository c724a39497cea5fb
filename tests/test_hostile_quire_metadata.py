"""/quire belongs to Quire (issue 17, "Quire's own metadata is world-writable"), on real processes.

A 3-node cluster as `clusterctl up` runs it (every node a voter and a bookie).
Its daemons authenticate with the digest identity of the cluster's daemon
secret and own /quire (clusterd/daemon/identity.py). A kazoo client that did
not authenticate tries what the review found it could do: read a ledger's
master key or a usable password digest, change /quire, its folders, a cookie
or their ACLs, lock the daemons out with a setACL, register a fake bookie or
rewrite a real one's registration, create AutoRecovery tasks. Every attempt is
refused with NoAuth, and after each one every node is still running, still
serving, every bookie still registered; the ledger still reads back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from bookie.client import BookiePool
from bookie.entry import DigestType
from clusterd.daemon import identity as daemon_identity
from clusterd import localcluster
from ledger.client import LedgerClient
from ledger.manager import DEFAULT_KEYS
from ledger.metadata import ledger_path
from metastore.client import MetaClient
from cluster_fixtures import Cluster, copy_config, start_cluster
from cluster_fixtures import kazoo_session

pytestmark = pytest.mark.multiprocess

PASSWORD = b"ledger password"
INTRUDER = make_digest_acl("intruder", "intruder", all=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(copy_config(tmp_path_factory.mktemp("quire_metadata")))
    yield start_cluster(c, timeout=120)
    c.down()


@pytest.fixture(scope="module")
def ledgers(cluster: Cluster) -> list[tuple[int, list[bytes]]]:
    """Two closed ledgers with the same password, written by an unauthenticated SDK client."""
    async def write() -> list[tuple[int, list[bytes]]]:
        out = []
        with trio.fail_after(60):
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool() as pool, \
                    LedgerClient(meta, pool) as client:
                client.pool.update(cluster.config.bookie_addresses())
                for n in range(2):
                    writer = await client.create(3, 2, 2, DigestType.CRC32C, password=PASSWORD)
                    payloads = [b"entry %d of %d" % (i, n) for i in range(5)]
                    await writer.append_many(payloads)
                    await writer.close()
                    out.append((writer.ledger_id, payloads))
        return out
    return trio.run(write)


@pytest.fixture
def intruder(cluster: Cluster) -> Iterator[KazooClient]:
    with kazoo_session(cluster, timeout=10.0, start_timeout_s=30) as zk:
        yield zk


def every_node_serves(cluster: Cluster, pids: dict[int, int]) -> None:
    cluster.assert_running(pids)

    async def settled() -> None:
        await localcluster.wait_settled(cluster.config, list(cluster.config.nodes), timeout_s=30)
    trio.run(settled)


def refused(cluster: Cluster, attempt: Callable[[], object]) -> None:
    """The attempt fails with NoAuth, and every node keeps running and serving."""
    pids = cluster.pids()
    with pytest.raises(NoAuthError):
        attempt()
    every_node_serves(cluster, pids)


def test_an_unauthenticated_client_cannot_read_a_ledgers_key_material(cluster, ledgers, intruder):
    (first, _), (second, _) = ledgers
    docs = [json.loads(intruder.get(ledger_path("/quire/ledgers", i))[0]) for i in (first, second)]
    assert all("master_key" not in doc for doc in docs), "the master key is in the world-readable metadata"
    records = [bytes.fromhex(doc["password_digest"]) for doc in docs]
    assert records[0] != records[1], "the same password gives the same record: unsalted"
    assert all(r.startswith(b"scrypt-1:") for r in records)
    for ledger_id in (first, second):
        refused(cluster, lambda: intruder.get(ledger_path(DEFAULT_KEYS, ledger_id)))
        refused(cluster, lambda: intruder.set_acls(ledger_path(DEFAULT_KEYS, ledger_id), OPEN_ACL_UNSAFE))


@pytest.mark.parametrize("path", ["/quire", "/quire/bookies", "/quire/bookies/available", "/quire/bookies/cookies",
                                  "/quire/bookies/cookies/1", "/quire/autorecovery", "/quire/underreplicated",
                                  "/quire/ledgers", "/quire/idgen/ledgers", DEFAULT_KEYS])
def test_an_unauthenticated_client_cannot_change_quire_or_its_acls(cluster, intruder, path):
    refused(cluster, lambda: intruder.set_acls(path, [INTRUDER]))  # would lock the daemons out
    refused(cluster, lambda: intruder.set_acls(path, OPEN_ACL_UNSAFE))
    if path not in ("/quire/idgen/ledgers",):  # the ledger id counter: ledger clients CAS it
        refused(cluster, lambda: intruder.set(path, b"tampered"))
    if path not in ("/quire/ledgers", DEFAULT_KEYS):  # ledger clients create ledgers and keys there
        refused(cluster, lambda: intruder.create(f"{path}/intruder", b"x"))
    assert intruder.get_acls(path)[0] != [INTRUDER]


def test_an_unauthenticated_client_cannot_register_a_bookie_or_edit_one(cluster, intruder):
    fake = json.dumps({"id": 9, "host": "203.0.113.9", "port": 3181, "read_only": False}).encode()
    refused(cluster, lambda: intruder.create("/quire/bookies/available/9", fake, ephemeral=True))
    refused(cluster, lambda: intruder.create("/quire/bookies/readonly/9", fake, ephemeral=True))
    refused(cluster, lambda: intruder.set("/quire/bookies/available/1", fake.replace(b'"id": 9', b'"id": 1')))
    refused(cluster, lambda: intruder.delete("/quire/bookies/available/1"))
    refused(cluster, lambda: intruder.set_acls("/quire/bookies/available/1", [INTRUDER]))
    refused(cluster, lambda: intruder.set("/quire/bookies/cookies/2", b"another instance"))
    refused(cluster, lambda: intruder.delete("/quire/bookies/cookies/2"))
    assert sorted(intruder.get_children("/quire/bookies/available")) == ["1", "2", "3"]


def test_an_unauthenticated_client_cannot_lock_the_daemons_out_of_a_ledger(cluster, ledgers, intruder):
    ledger_id, payloads = ledgers[0]
    refused(cluster, lambda: intruder.set_acls(ledger_path("/quire/ledgers", ledger_id), [INTRUDER]))
    refused(cluster, lambda: intruder.set_acls(ledger_path("/quire/ledgers", ledger_id).rsplit("/", 1)[0],
                                               [INTRUDER]))
    refused(cluster, lambda: intruder.create("/quire/underreplicated/%d" % ledger_id, b"{}"))

    async def read_back() -> list[bytes]:
        with trio.fail_after(30):
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool() as pool, \
                    LedgerClient(meta, pool) as client:
                client.pool.update(cluster.config.bookie_addresses())
                reader = await client.open(ledger_id, PASSWORD)
                return [e.payload for e in await reader.read(0, len(payloads) - 1)]
    assert trio.run(read_back) == payloads


def test_a_node_with_another_daemon_secret_is_told_to_copy_the_clusters(cluster):
    """A host whose quire-daemon.secret was not copied from the others would be a stranger to
    /quire: NoAuth on every call, retried forever. It is told what to do instead."""
    stranger = daemon_identity.DaemonIdentity(b"\x01" * 32)

    async def lay_out() -> None:
        async with MetaClient(cluster.config.client_addresses(), auth=stranger.auth) as meta:
            await daemon_identity.secure_layout(meta, stranger)

    with pytest.raises(daemon_identity.DaemonSecretError, match="copy quire-daemon.secret from a node"):
        trio.run(lay_out)
    every_node_serves(cluster, cluster.pids())
