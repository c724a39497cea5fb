"""The bookie port with [tls] bookie = true: TLS with a client certificate of the cluster CA, or
nothing. A real BookieService and BookieClients over loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from bookie.client import BookieClient
from bookie.errors import BookieUnavailable
from bookie.service import BookieService
from clusterd.tls_config import parse_tls
from clusterd.tls_context import client_context, server_context
from clusterd.ctl.tls_material import (issue, make_private_dir, new_authority, node_common_name, node_uri, write_cert,
                                   write_key, write_pair)
from clusterd.daemon.tls_streams import ClientTls, ServerTls

from bookie_fixtures import open_storage, trio_test
from bookie_fixtures import KEY, entry


@pytest.fixture
def material(tmp_path: Path) -> dict[str, Path]:
    tls = parse_tls({}, tmp_path / "cluster.toml")
    make_private_dir(tls.dir)
    ca = new_authority("test CA")
    write_key(tls.ca_key, ca.key)
    write_cert(tls.ca, ca.cert)
    key, cert = issue(ca, node_common_name(1), hosts=("127.0.0.1",), uris=(node_uri(1),))
    write_pair(tls.node_key(1), tls.node_cert(1), key, cert)
    stranger_ca = new_authority("another CA")
    key, cert = issue(stranger_ca, node_common_name(2), hosts=("127.0.0.1",), uris=(node_uri(2),))
    write_pair(tmp_path / "stranger.key", tmp_path / "stranger.pem", key, cert)
    return {"ca": tls.ca, "cert": tls.node_cert(1), "key": tls.node_key(1), "config": tls,
            "stranger_cert": tmp_path / "stranger.pem", "stranger_key": tmp_path / "stranger.key"}


async def add_through(service: BookieService, tls: ClientTls | None, entry_id: int) -> None:
    async with BookieClient("127.0.0.1", service.port, tls=tls, timeout_s=5) as client:
        await client.add(7, entry_id, KEY, entry(7, entry_id))
        assert await client.read(7, entry_id) is not None


@trio_test
async def test_the_bookie_port_serves_tls_clients_and_refuses_the_others(tmp_path: Path, material):
    server = ServerTls(server_context(material["config"], 1, client_cert="need"), "bookie", timeout_s=5)
    certified = ClientTls(client_context(material["ca"], material["cert"], material["key"]))
    no_certificate = ClientTls(client_context(material["ca"]))
    stranger = ClientTls(client_context(material["ca"], material["stranger_cert"], material["stranger_key"]))
    with trio.fail_after(60):
        async with open_storage(tmp_path) as storage, trio.open_nursery() as nursery:
            service = BookieService(storage, "127.0.0.1", 0, tls=server)
            await nursery.start(service.run)
            await add_through(service, certified, 0)
            for refused_tls in (no_certificate, stranger, None):  # None: plain TCP on the TLS port
                with pytest.raises(BookieUnavailable):
                    await add_through(service, refused_tls, 1)
            assert server.refused == 3
            await add_through(service, certified, 1)  # the bookie serves on, unaffected
            nursery.cancel_scope.cancel()
