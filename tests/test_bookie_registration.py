"""Bookie registration against a real metastore, and clusterd running bookies.

A 4-node cluster (3 voters that are also bookies, 1 bookie-only node) is
started once for the module with `clusterctl up`: every bookie must register
under /quire/bookies/available, answer on its port, refuse a wiped data
directory, and re-register when its registration is lost.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from bookie.client import BookiePool
from bookie.entry import Digester, DigestType, master_key
from bookie.registration import (AVAILABLE, COOKIES, READONLY, BookieInfo, BookieRegistrar, list_bookies, move,
                                 read_cookie, record_cookie, register)
from bookie.errors import CookieMismatch
from bookie_fixtures import trio_test
from clusterd import config as cfg
from clusterd import localcluster
from clusterd.daemon.bookie_node import BookieNode
from clusterd.daemon.main import EXIT_BOOKIE_STORAGE
from edge.sockets import PortUnavailable
from clusterd.daemon.identity import load_or_create
from metastore.client import MetaClient
from metastore.errors import SessionExpired
from cluster_fixtures import ENV, Cluster, copy_config, four_node_config

pytestmark = pytest.mark.multiprocess

KEY = master_key(b"pw")
DIGESTER = Digester(DigestType.CRC32C, b"pw")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(four_node_config(tmp_path_factory.mktemp("bookies")))
    up = c.ctl("up", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield c
    c.ctl("down", "--timeout", "5")


def hosts(cluster: Cluster) -> list[tuple[str, int]]:
    return cluster.config.client_addresses()


def daemon(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    """The daemons' metastore identity: only it may register bookies (clusterd/daemon/identity.py)."""
    return load_or_create(cluster.path).auth


# --- registration functions against the real metastore ------------------------------------

@trio_test
async def test_every_bookie_registers_including_the_bookie_only_node(cluster):
    with trio.fail_after(20):
        async with MetaClient(hosts(cluster)) as meta:
            bookies = await list_bookies(meta)
            assert [b.id for b in bookies] == [1, 2, 3, 4]
            for b in bookies:
                assert (b.host, b.port, b.read_only) == ("127.0.0.1", cluster.config.node(b.id).bookie_port, False)
                assert len(await read_cookie(meta, b.id)) >= 16
    statuses = await localcluster.fetch_statuses(cluster.config)
    assert statuses[4]["role"] == "bookie" and statuses[4]["pid"] and "epoch" not in statuses[4]
    for node_id, status in statuses.items():
        bookie = status["bookie"]
        assert (bookie["registered"], bookie["phase"], bookie["read_only"]) == (True, "serving", False)
        assert "fsyncs" in bookie["service"]["storage"]


def test_clusterctl_bookie_ls_lists_every_registered_bookie(cluster):
    listed = cluster.ctl("bookie", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["id"], r["port"], r["state"]) for r in rows] == \
        [(i, cluster.config.node(i).bookie_port, "available") for i in (1, 2, 3, 4)]
    text = cluster.ctl("bookie", "ls")
    assert text.returncode == 0 and text.stdout.splitlines()[0].split() == ["bookie", "address", "state"]


@trio_test
async def test_the_registered_bookies_store_and_serve_entries(cluster):
    with trio.fail_after(20):
        async with MetaClient(hosts(cluster)) as meta:
            bookies = await list_bookies(meta)
        async with BookiePool() as pool:
            pool.update(bookies)
            for entry_id in range(5):
                data = DIGESTER.package(901, entry_id, entry_id - 1, entry_id + 1, b"x")
                for p in pool.start_add([1, 2, 3, 4], 901, entry_id, KEY, data):
                    await p.result()
            for b in (1, 2, 3, 4):
                assert await pool.client(b).read_lac(901) == 3
                assert DIGESTER.verify(await pool.client(b).read(901, 4)).entry_id == 4


@trio_test
async def test_registrations_move_between_available_and_readonly_and_cookies_are_checked(cluster):
    with trio.fail_after(30):
        async with MetaClient(hosts(cluster), auth=daemon(cluster)) as meta:
            info = BookieInfo(77, "127.0.0.1", 1)
            await register(meta, info)
            assert 77 in [b.id for b in await list_bookies(meta)]
            info = await move(meta, info, read_only=True)
            assert await meta.exists(f"{AVAILABLE}/77") is None and await meta.exists(f"{READONLY}/77")
            listed = {b.id: b for b in await list_bookies(meta)}
            assert listed[77].read_only and 77 not in [b.id for b in await list_bookies(meta,
                                                                                          include_read_only=False)]
            await record_cookie(meta, 77, "abc")
            await record_cookie(meta, 77, "abc")  # idempotent
            with pytest.raises(CookieMismatch, match="restore the data directory"):
                await record_cookie(meta, 77, "other")
            await meta.delete(f"{COOKIES}/77")
        async with MetaClient(hosts(cluster)) as meta:  # the first session closed: its ephemeral is gone
            assert 77 not in [b.id for b in await list_bookies(meta)]


@trio_test
async def test_the_registrar_follows_read_only_and_re_registers_after_a_deletion_or_a_lost_session(cluster):
    read_only = False
    registrar = BookieRegistrar(hosts(cluster), BookieInfo(88, "127.0.0.1", 2), lambda: read_only, poll_s=0.1,
                                auth=daemon(cluster))

    async def wait_for(path: str, present: bool = True) -> None:
        while (await meta.exists(path) is not None) != present:
            await trio.sleep(0.05)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, MetaClient(hosts(cluster), auth=daemon(cluster)) as meta:
            await nursery.start(registrar.run)
            assert await meta.exists(f"{AVAILABLE}/88") is not None
            read_only = True  # the disk passed its threshold
            await wait_for(f"{READONLY}/88")
            await wait_for(f"{AVAILABLE}/88", present=False)
            await meta.delete(f"{READONLY}/88")  # an operator's mistake: the registrar puts it back
            await wait_for(f"{READONLY}/88")
            assert registrar.registrations == 2
            # The session expires (as after a long pause): its ephemeral lingers on the server until
            # the session timeout, and a new session must replace it rather than give up.
            old = await meta.exists(f"{READONLY}/88")
            registrar.meta._lose(SessionExpired, "test: the session expired")
            while registrar.registrations < 3:
                await trio.sleep(0.05)
            new = await meta.exists(f"{READONLY}/88")
            assert new is not None and new.ephemeral_owner != old.ephemeral_owner
            nursery.cancel_scope.cancel()


# --- clusterd -------------------------------------------------------------------------------

def test_a_wiped_bookie_directory_is_refused_at_start(cluster):
    node = cluster.config.node(4)
    pid = localcluster.running_pid(node)
    assert pid is not None
    localcluster.stop({4: pid}, timeout_s=5)
    localcluster.remove_pid_file(node, pid)
    shutil.rmtree(node.data_dir / "bookie")  # the disk was replaced
    done = subprocess.run([sys.executable, "-m", "clusterd.daemon.main", "--config", str(cluster.path), "--id", "4"],
                          env=ENV, cwd=cluster.path.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BOOKIE_STORAGE, done.stderr
    assert "clusterd: bookie 4:" in done.stderr and "wiped" in done.stderr


def test_a_bookie_port_in_use_is_a_startup_error(tmp_path):
    config = cfg.load(copy_config(tmp_path))
    node = config.node(1)
    with socket.socket() as squatter:
        squatter.bind((node.host, node.bookie_port))
        squatter.listen()
        with pytest.raises(PortUnavailable, match=f"cannot listen for bookie clients on 127.0.0.1:{node.bookie_port}"):
            trio.run(BookieNode(config, node).run)
