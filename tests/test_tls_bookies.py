"""TLS on every port of the shipped layout (3 nodes, each a voter and a bookie), real clusterd
processes: the nodes' own clients (bookie registration, GC, AutoRecovery) dial with the node
certificate; a ledger is written and read through TLS; a bookie client without a certificate
is refused. And the one warning a node listening in plain text beyond loopback logs at start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bookie.client import BookieClient, BookiePool
from bookie.errors import BookieUnavailable
from clusterd import config as cfg
from clusterd import localcluster
from clusterd.tls_context import client_context
from clusterd.daemon.tls_node import plaintext_ports
from clusterd.daemon.tls_streams import ClientTls
from ledger.client import LedgerClient
from metastore.client import MetaClient
from cluster_fixtures import Cluster, copy_config, start_cluster

pytestmark = pytest.mark.multiprocess

TLS_TABLE = "\n[tls]\n"  # every switch at its default: peer, client and bookie ports all TLS


@pytest.fixture(scope="module")
def tls_everywhere(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("tls-all")
    cluster = Cluster(copy_config(folder, TLS_TABLE))
    for args in (("tls", "init"), ("tls", "client", "app")):
        done = cluster.ctl(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    yield start_cluster(cluster)
    cluster.down()


def app_tls(cluster: Cluster, *, certificate: bool = True) -> ClientTls:
    tls = cluster.path.parent / "tls"
    if not certificate:
        return ClientTls(client_context(tls / "ca.pem"))
    return ClientTls(client_context(tls / "ca.pem", tls / "client-app.pem", tls / "client-app.key"))


def test_bookies_register_through_tls_and_a_ledger_is_written_and_read_over_tls(tls_everywhere: Cluster):
    config = tls_everywhere.config

    async def story() -> tuple[list[str], list[bytes]]:
        tls = app_tls(tls_everywhere)
        async with MetaClient(config.client_addresses(), tls=tls) as meta:
            with trio.fail_after(60):
                while len(available := await meta.children("/quire/bookies/available")) < 3:
                    await trio.sleep(0.2)
            async with BookiePool(config.bookie_addresses(), tls=tls) as pool, LedgerClient(meta, pool) as ledgers:
                writer = await ledgers.create(3, 3, 3, password=b"pw")
                for i in range(20):
                    await writer.append(b"entry %d" % i)
                await writer.close()
                reader = await ledgers.open(writer.ledger_id, b"pw")
                entries = [e.payload for e in await reader.read(0, reader.last_entry)]
        return available, entries

    available, entries = trio.run(story)
    assert sorted(available) == ["1", "2", "3"]
    assert entries == [b"entry %d" % i for i in range(20)]


def test_a_bookie_client_without_a_certificate_is_refused(tls_everywhere: Cluster):
    node = tls_everywhere.config.nodes[0]

    async def add(tls: ClientTls | None) -> None:
        async with BookieClient(node.host, node.bookie_port, tls=tls, timeout_s=5) as client:
            await client.read_lac(1)

    for tls in (app_tls(tls_everywhere, certificate=False), None):  # None: plain TCP
        with pytest.raises(BookieUnavailable):
            trio.run(add, tls)
    trio.run(add, app_tls(tls_everywhere))  # with one, the same bookie answers
    assert all(localcluster.running_pid(n) is not None for n in tls_everywhere.config.nodes)
    log = localcluster.log_path(node).read_text()
    assert "event=tls_refused port=bookie" in log


def test_clusterctl_ledger_and_bookie_commands_over_tls(tls_everywhere: Cluster):
    done = tls_everywhere.ctl("ledger", "append", "alpha", "beta", "--password", "pw", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    ledger = str(json.loads(done.stdout)["ledger_id"])
    done = tls_everywhere.ctl("ledger", "read", ledger, "--password", "pw", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [json.loads(line)["data"] for line in done.stdout.splitlines()] == ["alpha", "beta"]


# -- plain text beyond loopback -------------------------------------------------------------

def test_plaintext_ports_are_the_ones_without_tls_on_a_non_loopback_host(tmp_path: Path):
    path = copy_config(tmp_path, "\n[tls]\nclient = false\n")
    config = cfg.load(path)
    assert plaintext_ports(config, config.nodes[0]) == []  # loopback: nobody else can reach it
    exposed = cfg.parse(path.read_text().replace('host = "127.0.0.1"', 'host = "10.1.2.3"'), path)
    assert plaintext_ports(exposed, exposed.nodes[0]) == [f"client_port {exposed.nodes[0].client_port}"]
    plain = cfg.parse(path.read_text().replace("[tls]\nclient = false\n", "")
                      .replace('host = "127.0.0.1"', 'host = "db1.example.net"'), path)
    assert len(plaintext_ports(plain, plain.nodes[0])) == 4  # peer, client, bookie and admin


def test_a_node_in_plain_text_on_a_non_loopback_address_warns_once_at_start(tmp_path: Path):
    """One voter on 0.0.0.0 (every address of the machine), no [tls]: one warning, then it serves."""
    path = copy_config(tmp_path)
    text = path.read_text().split("[[node]]")[0] + "[[node]]" + path.read_text().split("[[node]]")[1]
    text = text.replace('host = "127.0.0.1"', 'host = "0.0.0.0"').replace('roles = ["voter", "bookie"]',
                                                                           'roles = ["voter"]')
    text = "\n".join(line for line in text.splitlines() if not line.startswith("bookie_port"))
    path.write_text(text + "\n")
    cluster = Cluster(path)
    try:
        up = cluster.ctl("up")
        assert up.returncode == 0, up.stdout + up.stderr
        log = localcluster.log_path(cluster.config.nodes[0]).read_text()
    finally:
        cluster.ctl("down", "--timeout", "5")
    warnings = [line for line in log.splitlines() if "plain text on a non-loopback address" in line]
    assert len(warnings) == 1, log
    assert "peer_port" in warnings[0] and "client_port" in warnings[0]
