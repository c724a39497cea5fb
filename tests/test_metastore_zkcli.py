"""Apache ZooKeeper's own CLI (zkCli.sh from Debian's zookeeper package) and the
four-letter words, against the metastore's client port."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from clusterd import config as cfg
from cluster_fixtures import ensemble  # noqa: F401 (a fixture)

pytestmark = pytest.mark.multiprocess
ZKCLI = Path("/usr/share/zookeeper/bin/zkCli.sh")


def zkcli(server: str, *command: str) -> str:
    done = subprocess.run([str(ZKCLI), "-server", server, *command], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


@pytest.mark.skipif(not ZKCLI.exists() or not shutil.which("java"),
                    reason="Debian's zookeeper package (zkCli.sh) is not installed; .ci/run installs it")
def test_zkcli_create_get_set_ls_delete(ensemble):  # noqa: F811
    node = cfg.load(ensemble.path).nodes[1]
    server = f"{node.host}:{node.client_port}"
    assert "Created /zkcli" in zkcli(server, "create", "/zkcli", "hello")
    out = zkcli(server, "get", "-s", "/zkcli")
    assert "hello" in out and "dataVersion = 0" in out
    zkcli(server, "set", "-v", "0", "/zkcli", "world")
    assert "version No is not valid" in zkcli(server, "set", "-v", "0", "/zkcli", "again")
    zkcli(server, "create", "/zkcli/kid", "x")
    assert "[kid]" in zkcli(server, "ls", "/zkcli")
    assert "Node not empty" in zkcli(server, "delete", "/zkcli")
    zkcli(server, "deleteall", "/zkcli")
    assert "Node does not exist" in zkcli(server, "get", "/zkcli")


def four(port: int, word: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def test_four_letter_words(ensemble):  # noqa: F811
    nodes = cfg.load(ensemble.path).nodes
    port = nodes[0].client_port
    assert four(port, b"ruok") == "imok"
    assert four(port, b"isro") == "rw"
    assert "zookeeper.version=" in four(port, b"envi")
    assert "Zxid: 0x" in four(port, b"srvr")
    modes = [four(n.client_port, b"srvr").split("Mode: ")[1].split()[0] for n in nodes]
    assert sorted(modes) == ["follower", "follower", "leader"]
    assert "zk_znode_count" in four(port, b"mntr")
    assert "Clients:" in four(port, b"stat")
    assert "clientPort=" in four(port, b"conf")
    assert four(port, b"wchc") == ""  # not allow-listed: the connection just closes
