"""A node's background services survive every metastore and bookie error, bare or in a group.

Issue 17, "a fault of one node ends another": a ConnectionLoss raised inside a
nursery of the auditor reached its loop wrapped in an ExceptionGroup, was not
caught, and ended the whole clusterd; a setACL on a /quire znode made the GC,
the registrar, the auditor and the replication worker hit NoAuth, which ended
every bookie node. Each service here (the auditor, the replication worker, the
bookie garbage collector, the bookie registrar) runs in this process against a
real 3-voter metastore and goes through two stories:

1. every third metastore call it makes raises the next error of a matrix: each
   ZooKeeper error class, the recipes' and ledger's errors, bookie client
   errors, each bare and then wrapped in an ExceptionGroup (as a nursery raises
   it); the service must keep running and, once the matrix is spent, do its work;
2. a real NoAuth: a digest-only ACL is set on the znode it reads or creates
   under; it must keep running and do its work again once the ACL is removed.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar

import pytest
import trio

from bookie.entry import Digester, DigestType, master_key
from bookie.errors import BookieUnavailable, Overloaded
from bookie.registration import AVAILABLE, COOKIES, BookieInfo, BookieRegistrar, record_cookie
from bookie.storage import AddRequest
from bookie_fixtures import open_storage, trio_test
from ledger.autorecovery.auditor import Auditor
from ledger.autorecovery.tasks import ROOT, TASKS, AutoRecoveryConfig, task_path, wall_ms
from clusterd.daemon.bookie_gc import BookieGarbageCollector
from ledger.autorecovery.worker import ReplicationWorker
from ledger.service_loop import ServiceLoop
from ledger.errors import MetadataConflict, NotEnoughBookies
from ledger.manager import LedgerManager
from ledger.metadata import Fragment, LedgerMetadata, LedgerMetadataError
from ledger.autorecovery.planning import ReplicationTask
from metastore import errors as E
from metastore.client import MetaClient
from metastore.client.ops import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, digest_acl
from metastore.wire.jute_defs import OpCode
from metastore.client.recipes import LeadershipLost, LockLost
from cluster_fixtures import Cluster, copy_config

pytestmark = pytest.mark.multiprocess

KEY = master_key(b"pw")
DIGESTER = Digester(DigestType.CRC32C, b"pw")
LOST_BOOKIE = 91  # has a cookie, never registers: the auditor's lost bookie
ADMIN = ("fault-test", "secret")  # the test's own digest identity: the ACLs it sets leave it every right
CONFIG = AutoRecoveryConfig(grace_ms=200, open_ledger_grace_ms=200, audit_interval_ms=500, check_reads_per_s=1000,
                            session_timeout_ms=4000, poll_ms=50)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """Three voters and no bookie role: the services under test are the only ones of their kind."""
    path = copy_config(tmp_path_factory.mktemp("service_faults"))
    text = re.sub(r"(?m)^bookie_port = .*\n", "", path.read_text())
    path.write_text(text.replace('roles = ["voter", "bookie"]', 'roles = ["voter"]'))
    c = Cluster(path)
    up = c.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield c
    c.ctl("down", "--timeout", "5")


# --- fault injection: the errors a service's metastore calls raise ------------------------------

FAULTS: ContextVar[Faults | None] = ContextVar("faults", default=None)


def error_matrix() -> list[BaseException]:
    """Every error class a service's calls can raise, bare, then each wrapped in an ExceptionGroup."""
    def concrete(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in [sub, *concrete(sub)]]
    bare: list[Callable[[], BaseException]] = [
        lambda: E.NoAuth("/quire/injected", "injected"),
        lambda: E.ConnectionLoss("/quire/injected", "injected: nothing heard for 6.67 s")]
    bare += [lambda c=c: c("/quire/injected", "injected") for c in concrete(E.ZooKeeperError)]
    bare += [lambda: LockLost("injected"), lambda: LeadershipLost("injected"),
             lambda: BookieUnavailable("injected"), lambda: Overloaded("injected"),
             lambda: NotEnoughBookies("injected"), lambda: MetadataConflict("injected"),
             lambda: LedgerMetadataError("injected")]
    grouped = [lambda make=make: ExceptionGroup("injected in a nursery", [make()]) for make in bare]
    return [make() for make in [*bare, *grouped]]


class Faults:
    """Raises the next error of `errors` from every third metastore call of the tasks it runs."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.pending = list(errors)
        self.calls = 0

    def take(self) -> BaseException | None:
        self.calls += 1
        if self.pending and self.calls % 3 == 0:
            return self.pending.pop(0)
        return None

    async def run(self, service: Callable[[], Awaitable[object]]) -> None:
        FAULTS.set(self)  # this task's context: the service's tasks (and only they) inherit it
        await service()


@pytest.fixture
def injected(monkeypatch) -> None:
    """MetaClient calls made under Faults.run raise its errors; every other call is untouched."""
    real = MetaClient._call

    async def call(self, opcode, *args, **kwargs):
        faults = FAULTS.get()
        if faults is not None and opcode != OpCode.CLOSE_SESSION:
            error = faults.take()
            if error is not None:
                raise error
        return await real(self, opcode, *args, **kwargs)
    monkeypatch.setattr(MetaClient, "_call", call)


def fast(loop: ServiceLoop) -> None:
    loop.min_s, loop.max_s = 0.001, 0.02  # the matrix has ~80 errors: keep retries short


async def wait_until(check: Callable[[], Awaitable[bool]]) -> None:
    while not await check():
        await trio.sleep(0.05)


async def spent(faults: Faults) -> bool:
    return not faults.pending


async def denied(meta: MetaClient, path: str, loop: ServiceLoop) -> None:
    """Set a digest-only ACL on `path` (a real NoAuth for everyone else); wait until `loop` failed
    on it twice."""
    await meta.ensure_path(path)
    await meta.set_acl(path, [digest_acl(*ADMIN)])
    before = loop.failures
    await wait_until(lambda: _more(loop, before + 2))


async def _more(loop: ServiceLoop, count: int) -> bool:
    return loop.failures >= count


# --- the four services ----------------------------------------------------------------------------

@trio_test
async def test_the_bookie_gc_survives_every_metastore_error_and_collects_afterwards(cluster, tmp_path, injected):
    hosts = cluster.config.client_addresses()
    with trio.fail_after(90):
        async with open_storage(tmp_path) as storage, MetaClient(hosts) as meta, trio.open_nursery() as nursery:
            await meta.add_auth("digest", ":".join(ADMIN))
            gc = BookieGarbageCollector(hosts, storage, interval_ms=50)
            fast(gc.loop)
            faults = Faults(error_matrix())
            nursery.start_soon(faults.run, gc.run)
            await wait_until(lambda: spent(faults))
            await orphan_collected(storage, 700)
            await denied(meta, "/quire/ledgers", gc.loop)
            await meta.set_acl("/quire/ledgers", OPEN_ACL_UNSAFE)
            await orphan_collected(storage, 701)
            assert gc.statistics()["errors"] >= 2
            nursery.cancel_scope.cancel()


async def orphan_collected(storage, ledger_id: int) -> None:
    """Entries of a ledger that has no metadata are deleted by the collector."""
    await storage.add(AddRequest(ledger_id, 0, KEY, DIGESTER.package(ledger_id, 0, -1, 1, b"x")))
    assert ledger_id in storage.ledgers()
    await wait_until(lambda: _gone(storage, ledger_id))


async def _gone(storage, ledger_id: int) -> bool:
    return ledger_id not in storage.ledgers()


@trio_test
async def test_the_registrar_survives_every_metastore_error_and_registers_again(cluster, injected):
    hosts = cluster.config.client_addresses()
    path = f"{AVAILABLE}/77"
    with trio.fail_after(90):
        async with MetaClient(hosts) as meta, trio.open_nursery() as nursery:
            await meta.add_auth("digest", ":".join(ADMIN))
            registrar = BookieRegistrar(hosts, BookieInfo(77, "127.0.0.1", 1), lambda: False, poll_s=0.05)
            fast(registrar.loop)
            faults = Faults(error_matrix())
            nursery.start_soon(faults.run, registrar.run)
            await wait_until(lambda: spent(faults))
            await wait_until(lambda: _exists(meta, path))
            # A real NoAuth: nobody but the test may create under available/, and the test takes it away.
            await meta.set_acl(AVAILABLE, [digest_acl(*ADMIN), *READ_ACL_UNSAFE])
            before = registrar.loop.failures
            await meta.delete(path)
            await wait_until(lambda: _more(registrar.loop, before + 2))
            assert not await _exists(meta, path)
            await meta.set_acl(AVAILABLE, OPEN_ACL_UNSAFE)
            await wait_until(lambda: _exists(meta, path))
            assert registrar.registered
            nursery.cancel_scope.cancel()


async def _exists(meta: MetaClient, path: str) -> bool:
    return await meta.exists(path) is not None


@trio_test
async def test_the_auditor_survives_every_metastore_error_and_marks_a_lost_bookie_afterwards(cluster, injected):
    hosts = cluster.config.client_addresses()
    with trio.fail_after(90):
        async with MetaClient(hosts) as meta, trio.open_nursery() as nursery:
            await meta.add_auth("digest", ":".join(ADMIN))
            await record_cookie(meta, LOST_BOOKIE, "lost-instance")
            auditor = Auditor(hosts, 1, CONFIG)
            fast(auditor.loop)
            faults = Faults(error_matrix())
            nursery.start_soon(faults.run, auditor.run)
            await wait_until(lambda: spent(faults))
            ledger = await ledger_on_lost_bookie(meta)
            await wait_until(lambda: _marked(meta, ledger))
            await denied(meta, AVAILABLE, auditor.loop)
            await meta.set_acl(AVAILABLE, OPEN_ACL_UNSAFE)
            ledger = await ledger_on_lost_bookie(meta)
            await wait_until(lambda: _marked(meta, ledger))
            nursery.cancel_scope.cancel()
        await meta_cleanup(hosts)


async def ledger_on_lost_bookie(meta: MetaClient) -> int:
    draft = LedgerMetadata(0, 2, 2, 2, (Fragment(0, (1, LOST_BOOKIE)),), DigestType.CRC32C, b"d" * 20, wall_ms(),
                           master_key=KEY)
    stored, _ = await LedgerManager(meta).create(draft)
    return stored.ledger_id


async def _marked(meta: MetaClient, ledger_id: int) -> bool:
    return await meta.exists(task_path(ledger_id)) is not None


async def meta_cleanup(hosts) -> None:
    async with MetaClient(hosts) as meta:
        await meta.add_auth("digest", ":".join(ADMIN))  # the ledgers it made are owned by it (ledger/manager.py)
        for path in (TASKS, "/quire/ledgers", f"{COOKIES}/{LOST_BOOKIE}", ROOT):
            try:
                await meta.delete_recursive(path)
            except E.NoNode:
                pass


@trio_test
async def test_the_replication_worker_survives_every_metastore_error_and_finishes_a_task_afterwards(
        cluster, injected):
    hosts = cluster.config.client_addresses()
    with trio.fail_after(90):
        async with MetaClient(hosts) as meta, trio.open_nursery() as nursery:
            await meta.add_auth("digest", ":".join(ADMIN))
            worker = ReplicationWorker(hosts, 1, CONFIG, rng=random.Random(3))
            fast(worker.loop)
            faults = Faults(error_matrix())
            nursery.start_soon(faults.run, worker.run)
            await wait_until(lambda: spent(faults))
            await task_finished(meta, 880_001)
            await denied(meta, TASKS, worker.loop)
            await meta.set_acl(TASKS, OPEN_ACL_UNSAFE)
            await task_finished(meta, 880_002)
            nursery.cancel_scope.cancel()
        await meta_cleanup(hosts)


async def task_finished(meta: MetaClient, ledger_id: int) -> None:
    """A task for a ledger whose metadata is gone: the worker takes it and deletes it."""
    await meta.ensure_path(TASKS)
    await meta.create(task_path(ledger_id), ReplicationTask(ledger_id, frozenset({LOST_BOOKIE}), wall_ms()).to_json())
    await wait_until(lambda: _absent(meta, task_path(ledger_id)))


async def _absent(meta: MetaClient, path: str) -> bool:
    return await meta.exists(path) is None


@trio_test
async def test_a_bug_in_a_service_still_ends_it():
    """Only metastore and bookie errors are retried: a TypeError beside one is a bug, and crashes."""
    loop = ServiceLoop("buggy", logging.getLogger("tests.buggy"))
    fast(loop)
    rounds: list[int] = []

    async def round_() -> None:
        rounds.append(1)
        if len(rounds) < 3:
            raise ExceptionGroup("nursery", [E.ConnectionLoss("/quire"), E.NoAuth("/quire")])
        raise ExceptionGroup("nursery", [E.ConnectionLoss("/quire"), TypeError("a bug of ours")])
    with pytest.raises(ExceptionGroup) as raised:
        await loop.run(round_)
    assert (len(rounds), loop.failures) == (3, 2)
    assert raised.group_contains(TypeError)
