"""`clusterctl tls init | client NAME` and the [tls] table: the material a TLS cluster runs on."""

from __future__ import annotations

import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from clusterd import config as cfg
from clusterd.tls_context import certificate_node_ids, client_context, server_context

REPO = Path(__file__).resolve().parent.parent
TOML = """[cluster]
name = "t"
[[node]]
id = 1
host = "127.0.0.1"
peer_port = 30001
client_port = 30002
admin_port = 30003
roles = ["voter"]
data_dir = "n1"
[[node]]
id = 7
host = "db7.example.net"
peer_port = 30011
client_port = 30012
admin_port = 30013
roles = ["observer"]
data_dir = "n7"
"""


def clusterctl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterd.ctl.main", "--config", str(folder / "cluster.toml"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "cluster.toml").write_text(TOML + "[tls]\nclient_auth = \"want\"\n")
    done = clusterctl(tmp_path, "tls", "init")
    assert done.returncode == 0, done.stderr
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_writes_a_ca_and_one_certificate_per_node_with_private_keys(folder: Path):
    tls = folder / "tls"
    assert mode(tls) == 0o700
    for key in ("ca.key", "node-1.key", "node-7.key"):
        assert mode(tls / key) == 0o600
    node7 = x509.load_pem_x509_certificate((tls / "node-7.pem").read_bytes())
    sans = node7.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["quire:node:7"]
    assert sans.get_values_for_type(x509.DNSName) == ["db7.example.net"]
    assert node7.subject.rfc4514_string() == "CN=quire-node-7"
    node1 = x509.load_pem_x509_certificate((tls / "node-1.pem").read_bytes())
    ips = node1.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in ips.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_init_again_keeps_everything(folder: Path):
    before = {p.name: p.read_bytes() for p in (folder / "tls").iterdir()}
    done = clusterctl(folder, "tls", "init")
    assert done.returncode == 0 and "kept the cluster CA" in done.stdout
    assert {p.name: p.read_bytes() for p in (folder / "tls").iterdir()} == before


def test_client_certificate_and_a_handshake_that_names_the_node(folder: Path):
    done = clusterctl(folder, "tls", "client", "alice")
    assert done.returncode == 0, done.stderr
    tls = folder / "tls"
    assert mode(tls / "client-alice.key") == 0o600
    assert mode(tls / "client-alice.keystore.pem") == 0o600  # key and certificate, for Java clients
    assert clusterctl(folder, "tls", "client", "alice").returncode == 1  # never overwritten
    assert clusterctl(folder, "tls", "client", "../evil").returncode == 2
    config = cfg.load(folder / "cluster.toml")
    assert config.tls is not None and config.tls.client_auth == "want"
    server = server_context(config.tls, 1)
    client = client_context(config.tls.ca, tls / "client-alice.pem", tls / "client-alice.key")
    # In memory: the client checks the server's name (127.0.0.1), the server sees node 1's peer id.
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    assert certificate_node_ids(c) == {1}
    assert certificate_node_ids(s) == set()  # a client certificate names no node


@pytest.mark.parametrize("table, problem", [
    ("[tls]\nclient_auth = \"maybe\"\n", "client_auth"),
    ("[tls]\ncert = \"node.pem\"\n", "{id}"),
    ("[tls]\npeer = 1\n", "'peer'"),
    ("[tls]\npeers = true\n", "unknown key 'peers'"),
])
def test_bad_tls_tables_are_refused(tmp_path: Path, table: str, problem: str):
    (tmp_path / "cluster.toml").write_text(TOML + table)
    with pytest.raises(cfg.ConfigError, match=r"\[tls\].*" + problem.replace("{", r"\{").replace("}", r"\}")):
        cfg.load(tmp_path / "cluster.toml")


def test_tls_table_round_trips_through_to_toml(folder: Path):
    config = cfg.load(folder / "cluster.toml")
    text = cfg.to_toml(config, folder)
    assert cfg.parse(text, folder / "cluster.toml") == config
