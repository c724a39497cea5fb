"""BookKeeper's HTTP API (/api/v1/...) on a real cluster's admin ports (issue 20): what its tools
read, and the mutations, which a loopback admin port allows."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest

from cluster_fixtures import Cluster, copy_config, start_cluster, wait_for
from clusterd.daemon import tls_node
from ledger.client_sync import SyncLedgerClient

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(copy_config(tmp_path_factory.mktemp("bkapi")))
    start_cluster(c)
    yield c
    c.down()


def call(cluster: Cluster, node_id: int, path: str, method: str = "GET", body: bytes = b"") -> tuple[int, object]:
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    with socket.create_connection((node.host, node.admin_port), timeout=30) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    code = int(head.split(b" ")[1])
    return code, json.loads(payload) if code == 200 else payload.decode()


def test_reads(cluster: Cluster) -> None:
    ids = [n.id for n in cluster.config.nodes]
    addresses = {f"{n.host}:{n.bookie_port}" for n in cluster.config.nodes if n.is_bookie}
    assert wait_for(lambda: set(call(cluster, ids[0], "/api/v1/bookie/list_bookies?type=rw")[1]) == addresses, 30)
    assert call(cluster, ids[0], "/api/v1/bookie/list_bookies?type=ro") == (200, {})
    code, hosts = call(cluster, ids[0], "/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert set(hosts.values()) == {"127.0.0.1"}
    code, info = call(cluster, ids[1], "/api/v1/bookie/info")
    assert code == 200 and 0 < info["freeSpace"] <= info["totalSpace"]
    assert call(cluster, ids[1], "/api/v1/bookie/state")[1]["running"] is True
    hosts_ = [(n.host, n.client_port) for n in cluster.config.nodes]
    with SyncLedgerClient(hosts_) as ledgers:
        w = ledgers.create(3, 3, 2, password=b"pw")
        w.append(b"x")
        w.close()
    listing = call(cluster, ids[2], "/api/v1/ledger/list/?print_metadata=true")[1]
    meta = listing[str(w.ledger_id)]
    assert meta["state"] == "CLOSED" and meta["last_entry"] == 0
    assert "master_key" not in meta and "password_digest" not in meta  # never over HTTP
    code, one = call(cluster, ids[2], f"/api/v1/ledger/metadata/?ledger_id={w.ledger_id}")
    assert code == 200 and one == meta
    assert call(cluster, ids[2], "/api/v1/ledger/metadata/?ledger_id=999999")[0] == 404
    assert call(cluster, ids[2], "/api/v1/ledger/metadata/?ledger_id=x")[0] == 400
    assert call(cluster, ids[0], "/api/v1/autorecovery/list_under_replicated_ledger/") == (200, [])
    code, auditor = call(cluster, ids[0], "/api/v1/autorecovery/who_is_auditor")
    assert code == 200 and auditor["Auditor"] in addresses
    assert call(cluster, ids[0], "/api/v1/bookie/info", method="PUT")[0] == 405
    assert call(cluster, ids[0], "/api/v1/bookie/nope")[0] == 404


def test_mutations_gc_audit_and_decommission(cluster: Cluster) -> None:
    ids = [n.id for n in cluster.config.nodes]
    code, answer = call(cluster, ids[0], "/api/v1/bookie/gc", method="PUT")
    assert code == 200 and "Triggered GC" in answer["message"]
    auditor = call(cluster, ids[0], "/api/v1/autorecovery/who_is_auditor")[1]["Auditor"]
    auditor_id = next(n.id for n in cluster.config.nodes if f"{n.host}:{n.bookie_port}" == auditor)
    assert call(cluster, auditor_id, "/api/v1/autorecovery/trigger_audit", method="PUT")[0] == 200
    other = next(i for i in ids if i != auditor_id)
    assert call(cluster, other, "/api/v1/autorecovery/trigger_audit", method="PUT")[0] == 409
    hosts_ = [(n.host, n.client_port) for n in cluster.config.nodes]
    with SyncLedgerClient(hosts_) as ledgers:
        w = ledgers.create(3, 3, 2, password=b"pw")
        w.append(b"y")
        w.close()
    victim = next(n for n in cluster.config.nodes if n.id == other)
    assert call(cluster, ids[0], "/api/v1/autorecovery/decommission", method="PUT", body=b"{}")[0] == 400
    code, answer = call(cluster, ids[0], "/api/v1/autorecovery/decommission", method="PUT",
                        body=json.dumps({"bookie_src": f"{victim.host}:{victim.bookie_port}"}).encode())
    assert code == 200 and f"bookie {victim.id}" in answer["message"]
    # Its ledgers are marked (and re-replicated away: with three bookies and E=3 there is nowhere to go).
    assert wait_for(lambda: w.ledger_id in call(cluster, ids[0], "/api/v1/autorecovery/list_under_replicated_ledger/")[1], 30)
    assert wait_for(lambda: f"{victim.host}:{victim.bookie_port}" in call(
        cluster, ids[0], "/api/v1/bookie/list_bookies?type=ro")[1], 30)  # it registers read-only
    assert cluster.ctl("bookie", "recommission", str(victim.id)).returncode == 0


def test_mutations_need_tls_or_loopback(cluster: Cluster) -> None:
    node = cluster.config.nodes[0]
    assert tls_node.admin_mutations_allowed(cluster.config, node)  # 127.0.0.1, plain
    assert not tls_node.admin_mutations_allowed(cluster.config, replace(node, bind_host="0.0.0.0"))
