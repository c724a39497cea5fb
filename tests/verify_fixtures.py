"""The Spark verifiers' shared input, and the tools to damage it: the data directories of a real
3-node metastore run that lived through a leader SIGKILL (three clusterd processes speaking the ZooKeeper protocol and
snapshotting every 100 txns; kazoo writes through them; a third of the way in the leader is
SIGKILLed, later restarted; once every node has committed the same zxid the cluster stops);
a bookie's entry logs rewritten with its own codec, its journal dropped."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from clusterd import config as cfg
from clusterd import localcluster
from bookie.storage_codec import (ENTRY_LOG_MAGIC, FILE_HEADER_BYTES, decode_entry_record, encode_entry_record,
                                  encode_file_header, scan_entry_log)
from cluster_fixtures import Cluster, copy_config

WRITES = 300
NODES = (1, 2, 3)


def _write(zk: KazooClient, i: int) -> None:
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=60)
    if i % 3 == 0:
        retry(lambda: zk.exists(f"/v/n{i}") or zk.create(f"/v/n{i}", f"{i}".encode()))
    else:
        retry(zk.set, "/v/counter", f"{i}".encode())


def _wait_converged(cluster: Cluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = cluster.status()
        if len({(r["last_zxid"], r["last_committed_zxid"]) for r in rows}) == 1 and all(r["role"] != "down" for r in rows):
            return
        time.sleep(0.2)
    raise AssertionError(f"nodes did not converge: {cluster.status()}")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Iterator[Path]:
    """Data directories node1..node3 of a stopped cluster that lived through a leader SIGKILL."""
    folder = tmp_path_factory.mktemp("verify-run")
    path = copy_config(folder)
    path.write_text(path.read_text().replace("snapshot_every_txns = 50000", "snapshot_every_txns = 100"))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        nodes = cfg.load(path).nodes
        zk = KazooClient(hosts=",".join(f"{n.host}:{n.client_port}" for n in nodes), timeout=5,
                         connection_retry={"max_tries": -1, "max_delay": 0.2})
        zk.start(timeout=15)
        zk.create("/v", b"")
        zk.create("/v/counter", b"0")
        for i in range(WRITES):
            if i == WRITES // 3:
                leader = next(r["id"] for r in cluster.status() if r["role"] == "leader")
                os.kill(localcluster.running_pid(next(n for n in nodes if n.id == leader)), signal.SIGKILL)
            if i == 2 * WRITES // 3:
                restarted = cluster.ctl("up")
                assert restarted.returncode == 0, restarted.stdout + restarted.stderr
            _write(zk, i)
        zk.stop()
        zk.close()
        _wait_converged(cluster)
    finally:
        cluster.ctl("down", "--timeout", "5")
    yield folder / "data"


def rewrite_entry_logs(node_dir: Path, keep) -> None:  # noqa: ANN001 - (ledger, entry, data) -> data | None
    """Rewrite every entry log of a bookie with the bookie's own codec: `keep` may drop or change entries."""
    for path in sorted((node_dir / "bookie" / "entrylogs").glob("entrylog.*")):
        buf = path.read_bytes()
        found, _, _ = scan_entry_log(buf, FILE_HEADER_BYTES)
        records = []
        for ledger, entry, offset, _ in found:
            _, _, data, _ = decode_entry_record(buf, offset)
            data = keep(ledger, entry, data)
            if data is not None:
                records.append(encode_entry_record(ledger, entry, data))
        path.write_bytes(encode_file_header(ENTRY_LOG_MAGIC, int(path.name.split(".")[1], 16)) + b"".join(records))


def drop_journals(node_dir: Path) -> None:
    """Entries live in the journal too until a checkpoint trims it: remove its ADDs' copies."""
    for path in (node_dir / "bookie" / "journal").glob("journal.*"):
        path.unlink()
