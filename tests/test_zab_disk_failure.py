"""A disk that fails under a running node's Zab state or bookie journal stops that node
(fail-stop) with one line saying what failed and what to do, exit status 8 (docs/operations.md,
"Exit status"), and costs no acknowledged write: the others go on, and once the disk has room
again the node recovers from its own log or journal.

Real processes on loopback; the node's data directory (or its bookie's journal) is on a small
tmpfs of its own that the test fills, so the next preallocation fails with ENOSPC. Needs root
(mount); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from bookie.client import BookiePool
from clusterd import localcluster
from ledger.client import LedgerClient
from metastore.client import MetaClient
from clusterd.daemon.main import EXIT_DISK_FAILED
from cluster_fixtures import Cluster, copy_config, four_node_config, kazoo_session, start_cluster, wait_for

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                                 reason="mounts a tmpfs: needs root and mount(8)")]

DISK_BYTES = 32 << 20
ZNODE_BYTES = 900 << 10  # under jute's 1 MiB: eight of them outgrow a 4 MiB log preallocation


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """A file taking all of the disk's free space but `leave_bytes`."""
    stat = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, stat.f_bavail * stat.f_frsize - leave_bytes))
    return filler


def create_surely(zk: KazooClient, path: str, data: bytes) -> None:
    """Create `path`, across the connection loss of a leader change (node 3 may have led): an
    outcome unknown is retried, and NodeExists then means the first attempt was committed."""
    try:
        zk.retry(zk.create, path, data)
    except NodeExistsError:
        assert zk.get(path)[0] == data


def test_a_full_disk_stops_the_node_with_one_line_and_loses_no_acknowledged_write(tmp_path: Path,
                                                                                  small_disk: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace('data_dir = "data/node3"', f'data_dir = "{small_disk}/node3"'))
    cluster = start_cluster(Cluster(path))
    node3 = cluster.config.node(3)
    try:
        with kazoo_session(cluster, only=1) as zk:  # not node 3, which will stop
            zk.create("/before", b"x")
            with kazoo_session(cluster, only=3) as on3:
                assert wait_for(lambda: on3.exists("/before") is not None)
            pid = localcluster.read_pid_file(node3)
            filler = fill(small_disk, leave_bytes=256 << 10)
            acknowledged = []
            for i in range(8):  # node 3 cannot take these; nodes 1 and 2 are a quorum
                create_surely(zk, f"/big-{i}", bytes([i]) * ZNODE_BYTES)
                acknowledged.append(f"/big-{i}")
            assert_stopped_with_one_line(cluster, 3, pid, "writing the txn log", "No space left on device",
                                         "Fix the disk")

            filler.unlink()  # the operator frees space and starts the node again
            start_cluster(cluster)
            with kazoo_session(cluster, only=3) as on3:
                on3.sync("/")
                assert on3.get("/before")[0] == b"x"
                for i, name in enumerate(acknowledged):
                    assert on3.get(name)[0] == bytes([i]) * ZNODE_BYTES, name
    finally:
        cluster.down()


def assert_stopped_with_one_line(cluster: Cluster, node_id: int, pid: int | None, *phrases: str) -> None:
    node = cluster.config.node(node_id)
    assert wait_for(lambda: not localcluster.is_clusterd(pid), timeout_s=30), f"node {node_id} did not stop"
    lines = localcluster.log_path(node).read_text().splitlines()
    said = [l for l in lines if l.startswith("clusterd: ")]
    assert len(said) == 1, "\n".join(lines[-40:])
    assert said[0].endswith(f"(exit {EXIT_DISK_FAILED})"), said[0]
    for phrase in phrases:
        assert phrase in said[0], said[0]
    assert "Traceback" not in "\n".join(lines)


def test_a_full_journal_disk_stops_the_bookie_with_one_line_and_loses_no_acknowledged_entry(
        tmp_path: Path, small_disk: Path) -> None:
    """Node 4 is a bookie only, its journal on the small disk. A ledger with node 4 in its ensemble
    (E=3, Qw=3, Qa=2) is written until node 4 stops; the writer replaces it and goes on."""
    path = four_node_config(tmp_path)
    path.write_text(path.read_text() + f'bookie_journal_dir = "{small_disk}/journal4"\n')
    cluster = start_cluster(Cluster(path), timeout=120)
    pid = localcluster.read_pid_file(cluster.config.node(4))
    entry = b"e" * (64 << 10)

    async def scenario() -> None:
        with trio.fail_after(120):
            async with MetaClient(cluster.config.client_addresses()) as meta, \
                    BookiePool(timeout_s=3.0) as pool, LedgerClient(meta, pool) as client:
                w = await client.create(3, 3, 2, password=b"pw")
                while 4 not in w.metadata.last_fragment.ensemble:
                    await w.close()
                    w = await client.create(3, 3, 2, password=b"pw")
                await w.append(b"first")
                fill(small_disk, leave_bytes=256 << 10)
                acked = 1
                while localcluster.is_clusterd(pid) or acked < 100:
                    await w.append(entry)
                    acked += 1
                closed = await w.close()
                assert closed.last_entry == acked - 1 and 4 not in closed.last_fragment.ensemble
                r = await client.open(w.ledger_id, b"pw")
                got = [e.payload for e in await r.read(0, r.last_entry)]  # digests verified
                assert got == [b"first"] + [entry] * (acked - 1)

    try:
        trio.run(scenario)
        assert_stopped_with_one_line(cluster, 4, pid, "writing the journal", "No space left on device")
        (small_disk / "filler").unlink()
        start_cluster(cluster, timeout=120)  # the bookie replays its journal: no refusal
        assert wait_for(lambda: localcluster.is_clusterd(localcluster.read_pid_file(cluster.config.node(4))))
    finally:
        cluster.down()
