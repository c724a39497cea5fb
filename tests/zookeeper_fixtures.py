"""A live reference: a standalone Apache ZooKeeper 3.8 (Debian's zookeeper package) with its
AdminServer on loopback, for the tests that hold Quire's operator surface against it. Skips,
saying which package to install, when the jars or java are absent (.ci/run installs them)."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench import zk as reference  # the benchmarks' class path of Debian's ZooKeeper
from cluster_fixtures import wait_for
from clusterd import localcluster

# The AdminServer's jars beside ZooKeeper's own: Jetty 9 (libjetty9-java), the servlet API
# (libservlet-api-java) and Jackson (libjackson2-databind-java, with core and annotations).
ADMIN_JARS = ["jetty9-server.jar", "jetty9-servlet.jar", "jetty9-http.jar", "jetty9-io.jar", "jetty9-util.jar",
              "jetty9-security.jar", "jetty9-util-ajax.jar", "servlet-api.jar", "jackson-core.jar",
              "jackson-databind.jar", "jackson-annotations.jar"]


@contextmanager
def live_zookeeper(folder: Path) -> Iterator[tuple[int, int]]:
    """A standalone ZooKeeper 3.8 in `folder`, every word whitelisted, client port and AdminServer
    on 127.0.0.1: (client port, admin port). pytest.skip when it cannot run here."""
    try:
        classpath = reference.classpath()
    except reference.ZkUnavailable as e:
        pytest.skip(str(e))
    missing = [jar for jar in ADMIN_JARS if not (reference.JAVA_DIR / jar).exists()]
    if missing:
        pytest.skip(f"ZooKeeper's AdminServer needs {', '.join(missing)} in {reference.JAVA_DIR} (Debian: "
                    "libjetty9-java, libservlet-api-java, libjackson2-databind-java; .ci/run installs them)")
    client_port, admin_port = localcluster.free_ports(2)
    (folder / "zoo.cfg").write_text(
        f"tickTime=2000\ndataDir={folder / 'data'}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n"
        f"4lw.commands.whitelist=*\nadmin.enableServer=true\nadmin.serverAddress=127.0.0.1\n"
        f"admin.serverPort={admin_port}\n")
    classpath += ":" + ":".join(str(reference.JAVA_DIR / jar) for jar in ADMIN_JARS)
    with (folder / "zookeeper.out").open("wb") as out:
        proc = subprocess.Popen(["java", "-Xmx256m", "-cp", classpath, f"-Dzookeeper.log.dir={folder}",
                                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(folder / "zoo.cfg")],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: http_get(admin_port, "/commands/ruok") is not None, timeout_s=60), \
            (folder / "zookeeper.out").read_text()[-3000:]
        yield client_port, admin_port
    finally:
        proc.kill()
        proc.wait()


def http_get(port: int, path: str) -> str | None:
    """The body of GET http://127.0.0.1:port/path; None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.read().decode()
    except OSError:
        return None


def four_letter(port: int, word: str) -> str:
    """A four-letter word's whole answer from the client port on 127.0.0.1."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(word.encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    return raw.decode()
