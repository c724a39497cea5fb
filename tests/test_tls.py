"""Mutual TLS on real clusterd processes: a 3-node ensemble whose peer links and client ports
speak only TLS ([tls] in cluster.toml, material from `clusterctl tls init`).

The stories: the ensemble forms and commits; kazoo connects unchanged (use_ssl, ca, certfile,
keyfile) and keeps working through a leader SIGKILL; its certificate is its ACL identity
(x509:CN=<name>); four-letter words answer over TLS; and strangers on the peer port (a
certificate of another node, none at all, or one from another CA) are refused while the
ensemble keeps committing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.security import make_acl

from clusterd import localcluster
from clusterd.ctl.tls_material import issue, load_authority, new_authority, node_uri, write_pair
from clusterd.daemon.tls_streams import ClientTls
from clusterd.tls_context import client_context
from metastore.wire import jute
from metastore.core.acl import Id, is_valid_id
from metastore.wire.jute_defs import OpCode
from metastore.client import MetaClient
from cluster_fixtures import Cluster, copy_config, stop_kazoo, wait_for
from zab.wire.codec import encode_hello

pytestmark = pytest.mark.multiprocess

TLS_TABLE = '\n[tls]\npeer = true\nclient = true\nbookie = true\nclient_auth = "need"\n'


def voters_only(text: str) -> str:
    """Voters without the bookie role: these tests are about the peer and client ports."""
    text = text.replace('roles = ["voter", "bookie"]', 'roles = ["voter"]')
    return re.sub(r"(?m)^bookie_port = \d+\n", "", text)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("tls")
    path = copy_config(folder, TLS_TABLE)
    path.write_text(voters_only(path.read_text()).replace("[cluster]\n", "[cluster]\nmin_session_timeout_ms = 1000\n", 1))
    cluster = Cluster(path)
    for args in (("tls", "init"), ("tls", "client", "alice"), ("tls", "client", "bob")):
        done = cluster.ctl(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def tls_dir(cluster: Cluster) -> Path:
    return cluster.path.parent / "tls"


def kazoo(cluster: Cluster, name: str = "alice", *, node: int | None = None, **options) -> KazooClient:
    tls = tls_dir(cluster)
    hosts = ",".join(f"{n.host}:{n.client_port}" for n in cluster.config.nodes if node is None or n.id == node)
    client = KazooClient(hosts=hosts, timeout=5, use_ssl=True, ca=str(tls / "ca.pem"),
                         certfile=str(tls / f"client-{name}.pem"), keyfile=str(tls / f"client-{name}.key"),
                         verify_certs=True, **options)
    client.start(timeout=15)
    return client


def commits_through_every_node(cluster: Cluster, path: str) -> None:
    """A write through each node, read back through each node."""
    for node in cluster.config.nodes:
        zk = kazoo(cluster, node=node.id)
        try:
            zk.ensure_path(path)
            zk.create(f"{path}/n", str(node.id).encode(), sequence=True)
            zk.sync(path)
            assert len(zk.get_children(path)) >= node.id
        finally:
            zk.stop()
            zk.close()


def test_a_tls_ensemble_forms_a_quorum_and_commits_writes(tls_cluster: Cluster):
    rows = tls_cluster.status()
    assert sorted(r["role"] for r in rows) == ["follower", "follower", "leader"]
    commits_through_every_node(tls_cluster, "/tls-commits")


# -- strangers on the peer port -------------------------------------------------------

def impostor_context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # it does not care who we are
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def refused(port: int, context: ssl.SSLContext, hello: bytes) -> bool:
    """Dial `port` with TLS, send `hello` and more: True when the node ends the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw) as s:
                s.sendall(hello)
                for _ in range(50):  # the node refuses after the handshake or after the HELLO
                    s.sendall(b"\0" * 16)
                    if s.recv(1) == b"":
                        return True
                    time.sleep(0.05)
        except (ssl.SSLError, ConnectionError, socket.timeout):
            return True
    return False


@pytest.fixture(scope="module")
def impostors(tls_cluster: Cluster, tmp_path_factory) -> dict[str, tuple[Path | None, Path | None]]:
    """Certificates of a stranger: node 2's identity claiming to be node 3, none, another CA's node 3."""
    folder = tmp_path_factory.mktemp("impostors")
    tls = tls_dir(tls_cluster)
    cluster_ca = load_authority(tls / "ca.pem", tls / "ca.key")
    other_ca = new_authority("someone else's CA")
    made = {}
    for name, authority, node_id in (("wrong-node-id", cluster_ca, 2), ("other-ca", other_ca, 3)):
        key, cert = issue(authority, f"quire-node-{node_id}", hosts=("127.0.0.1",), uris=(node_uri(node_id),))
        write_pair(folder / f"{name}.key", folder / f"{name}.pem", key, cert)
        made[name] = (folder / f"{name}.pem", folder / f"{name}.key")
    made["no-certificate"] = (None, None)
    return made


@pytest.mark.parametrize("kind", ["wrong-node-id", "no-certificate", "other-ca"])
def test_a_stranger_on_the_peer_port_is_refused_and_the_ensemble_keeps_committing(
        tls_cluster: Cluster, impostors, kind: str):
    cert, key = impostors[kind]
    hello = encode_hello(tls_cluster.config.name, 3)  # it claims to be node 3
    for node in tls_cluster.config.nodes:
        if node.id == 3:
            continue
        for _ in range(5):  # a HELLO loop would displace node 3's links, if it got in
            assert refused(node.peer_port, impostor_context(cert, key), hello), f"node {node.id} let {kind} in"
    commits_through_every_node(tls_cluster, f"/after-{kind}")
    assert all(localcluster.running_pid(n) is not None for n in tls_cluster.config.nodes)

    def read_logs() -> str:
        return "".join(localcluster.log_path(n).read_text() for n in tls_cluster.config.nodes)
    # The refusal is logged as the node drops the link; a busy machine may write it a little later.
    assert wait_for(lambda: "event=tls_refused port=peer" in read_logs(), 20), read_logs()[-3000:]
    logs = read_logs()
    if kind == "wrong-node-id":
        assert "HELLO claims node 3, the certificate names 2" in logs
        # logged once per cause and host, not once per attempt
        assert logs.count("HELLO claims node 3, the certificate names 2 (logged once") <= 2


def test_the_dialer_refuses_a_server_whose_certificate_names_another_node(tls_cluster: Cluster):
    """Node 1's peer port answers with node 1's certificate: a dialer that wants node 2 hangs up."""
    from clusterd.daemon.tls_node import peer_tls
    config = tls_cluster.config
    node1, node3 = config.node(1), config.node(3)

    async def dial_node1_as_if_node2() -> str:
        tls = peer_tls(config, node3)
        stream = await trio.open_tcp_stream(node1.host, node1.peer_port)
        with pytest.raises(OSError) as refusal:
            await tls.dial(stream, 2)
        return str(refusal.value)

    assert "dialed node 2, its certificate names 1" in trio.run(dial_node1_as_if_node2)


# -- the client port -------------------------------------------------------------------

@pytest.mark.skipif(not is_valid_id(Id("x509", "CN=alice")), reason="metastore/core/acl.py has no x509 scheme yet")
def test_kazoo_over_tls_writes_and_reads_and_its_certificate_is_its_acl_identity(tls_cluster: Cluster):
    alice, bob = kazoo(tls_cluster, "alice"), kazoo(tls_cluster, "bob")
    try:
        alice.create("/alice-only", b"secret", acl=[make_acl("x509", "CN=alice", all=True)])
        assert alice.get("/alice-only")[0] == b"secret"
        bob.sync("/alice-only")  # bob may be on another node: it must see the node to be refused it
        with pytest.raises(NoAuthError):
            bob.get("/alice-only")
        bob.create("/bobs", b"b")
        alice.sync("/bobs")
        assert alice.get("/bobs")[0] == b"b"
    finally:
        stop_kazoo(alice, bob)


def test_a_client_without_a_certificate_or_without_tls_is_refused(tls_cluster: Cluster):
    node = tls_cluster.config.nodes[0]
    ca = tls_dir(tls_cluster) / "ca.pem"
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((node.host, node.client_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with context.wrap_socket(raw, server_hostname=node.host) as s:
                s.sendall(b"ruok")  # TLS 1.3: the refusal arrives after the client's side of the handshake
                assert s.recv(4) == b""
                raise ConnectionError("closed")
    with socket.create_connection((node.host, node.client_port), timeout=10) as s:
        s.sendall(b"ruok")  # plain text on the TLS port: no answer, the connection ends
        try:
            assert s.recv(64) == b""
        except ConnectionResetError:
            pass


def test_four_letter_words_over_tls(tls_cluster: Cluster):
    node = tls_cluster.config.nodes[0]
    tls = tls_dir(tls_cluster)
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    context.load_cert_chain(tls / "client-alice.pem", tls / "client-alice.key")
    with context.wrap_socket(socket.create_connection((node.host, node.client_port), timeout=10),
                             server_hostname=node.host) as s:
        s.sendall(b"ruok")
        assert s.recv(64) == b"imok"


def test_our_metaclient_over_tls(tls_cluster: Cluster):
    tls = tls_dir(tls_cluster)
    context = client_context(tls / "ca.pem", tls / "client-alice.pem", tls / "client-alice.key")

    async def write_and_read() -> bytes:
        hosts = [(n.host, n.client_port) for n in tls_cluster.config.nodes]
        async with MetaClient(hosts, tls=ClientTls(context)) as meta:
            await meta.create("/metaclient-tls", b"over tls")
            data, _ = await meta.get("/metaclient-tls")
            return data

    assert trio.run(write_and_read) == b"over tls"


def test_kazoo_over_tls_keeps_working_through_a_leader_sigkill(tls_cluster: Cluster):
    zk = kazoo(tls_cluster)
    try:
        zk.ensure_path("/through-kill")
        for i in range(20):
            zk.create("/through-kill/before-", b"x", sequence=True)
        leader = next(r["id"] for r in tls_cluster.status() if r["role"] == "leader")
        node = tls_cluster.config.node(leader)
        os.kill(localcluster.running_pid(node), signal.SIGKILL)
        written = 0
        deadline = time.monotonic() + 60
        while written < 20 and time.monotonic() < deadline:
            try:
                zk.create("/through-kill/after-", b"y", sequence=True)
                written += 1
            except KazooException:  # ConnectionLoss while it moves to another node: retry
                time.sleep(0.2)
        assert written == 20
        children = zk.get_children("/through-kill")  # nothing acknowledged was lost
        assert sum(c.startswith("before-") for c in children) == 20
        assert sum(c.startswith("after-") for c in children) >= 20  # a retried create may have landed twice
    finally:
        zk.stop()
        zk.close()
        up = tls_cluster.ctl("up")  # the killed node back, for whatever runs next
        assert up.returncode == 0, up.stdout + up.stderr


ZKCLI = Path("/usr/share/zookeeper/bin/zkCli.sh")


@pytest.mark.skipif(not ZKCLI.exists() or not shutil.which("java"),
                    reason="Debian's zookeeper package (zkCli.sh) is not installed; .ci/run installs it")
def test_zkcli_over_tls(tls_cluster: Cluster):
    """ZooKeeper's own CLI with its Netty client socket and PEM key and trust stores (ZooKeeper 3.5.5+)."""
    tls = tls_dir(tls_cluster)
    node = tls_cluster.config.nodes[0]
    # Debian's zookeeper.jar (3.8) lists some of Netty's jars in its manifest but not netty-resolver and
    # netty-codec, which the Netty client socket needs: the last -cp wins over zkCli.sh's own.
    flags = ["-cp", ":".join(["/etc/zookeeper/conf", "/usr/share/java/zookeeper.jar",
                              "/usr/share/java/netty-resolver.jar", "/usr/share/java/netty-codec.jar"]),
             "-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty",
             "-Dzookeeper.client.secure=true",
             f"-Dzookeeper.ssl.keyStore.location={tls / 'client-alice.keystore.pem'}",
             "-Dzookeeper.ssl.keyStore.type=PEM",
             f"-Dzookeeper.ssl.trustStore.location={tls / 'ca.pem'}",
             "-Dzookeeper.ssl.trustStore.type=PEM"]
    env = {**os.environ, "CLIENT_JVMFLAGS": " ".join(flags)}

    def zkcli(*command: str) -> str:
        done = subprocess.run([str(ZKCLI), "-server", f"{node.host}:{node.client_port}", *command],
                              capture_output=True, text=True, timeout=60, env=env)
        return done.stdout + done.stderr

    assert "Created /zkcli-tls" in zkcli("create", "/zkcli-tls", "hello")
    assert "hello" in zkcli("get", "/zkcli-tls")


def test_clusterctl_znode_commands_on_a_tls_client_port(tls_cluster: Cluster):
    """`tls init` made clusterctl a certificate of its own; its znode commands use it."""
    done = tls_cluster.ctl("create", "/from-clusterctl", "over tls")
    assert done.returncode == 0, done.stdout + done.stderr
    done = tls_cluster.ctl("get", "/from-clusterctl")
    assert done.returncode == 0 and done.stdout.strip() == "over tls", done.stdout + done.stderr


# -- one reply per TLS record -----------------------------------------------------------

def tls_records(sock: socket.socket, pending: bytearray) -> Iterator[bytes]:
    """The raw TLS records arriving on `sock`, one at a time (5-byte header, then its length)."""
    while True:
        while len(pending) < 5 or len(pending) < 5 + int.from_bytes(pending[3:5], "big"):
            data = sock.recv(65536)
            if not data:
                return
            pending += data
        size = 5 + int.from_bytes(pending[3:5], "big")
        record = bytes(pending[:size])
        del pending[:size]
        yield record


def test_pipelined_replies_over_tls_leave_in_records_of_their_own(tls_cluster: Cluster):
    """kazoo waits on select() for the socket before each read, so plaintext already decrypted
    into its SSL buffer sits there until the next record arrives (the next ping, seconds later):
    a record must never carry more than one reply. Fails when the writer joins replies."""
    node = tls_cluster.config.nodes[0]
    tls = tls_dir(tls_cluster)
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    context.load_cert_chain(tls / "client-alice.pem", tls / "client-alice.key")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_object = context.wrap_bio(incoming, outgoing, server_hostname=node.host)
    pending = bytearray()
    with socket.create_connection((node.host, node.client_port), timeout=15) as sock:
        records = tls_records(sock, pending)
        while True:
            try:
                tls_object.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(next(records))
        requests = [jute.frame(jute.encode_connect_request(jute.ConnectRequest(0, 0, 10_000, 0, b"\0" * 16, False)))]
        requests += [jute.frame(jute.encode_request(jute.RequestHeader(xid, OpCode.EXISTS),
                                                     jute.ExistsRequest("/zookeeper", False)))
                     for xid in range(1, 101)]
        tls_object.write(b"".join(requests))
        sock.sendall(outgoing.read())
        plaintext, replies, most_in_one_record = bytearray(), 0, 0
        while replies < len(requests):
            incoming.write(next(records))
            try:
                while True:
                    plaintext += tls_object.read(65536)
            except ssl.SSLWantReadError:
                pass
            sock.sendall(outgoing.read())  # post-handshake messages, if any
            completed = 0
            while len(plaintext) >= 4 and len(plaintext) >= 4 + int.from_bytes(plaintext[:4], "big"):
                del plaintext[:4 + int.from_bytes(plaintext[:4], "big")]
                completed += 1
            replies += completed
            most_in_one_record = max(most_in_one_record, completed)
    assert most_in_one_record == 1, f"a TLS record carried {most_in_one_record} replies"


def test_the_admin_port_speaks_https_to_cluster_certificates_only(tls_cluster: Cluster):
    """[tls] admin (on by default in a [tls] table): /status over HTTPS with a client certificate of
    the cluster CA; plain HTTP and a client without a certificate get nothing."""
    node = tls_cluster.config.nodes[0]
    tls = tls_dir(tls_cluster)
    request = f"GET /status HTTP/1.1\r\nHost: {node.host}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
        s.sendall(request)
        try:
            assert s.recv(64) == b""  # not HTTP: the TLS handshake fails and the port closes
        except ConnectionResetError:
            pass
    bare = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    with socket.create_connection((node.host, node.admin_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with bare.wrap_socket(raw, server_hostname=node.host) as s:
                s.sendall(request)  # TLS 1.3: the refusal arrives after the client's side of the handshake
                assert s.recv(64) == b""
                raise ConnectionError("closed")
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    context.load_cert_chain(tls / "client-alice.pem", tls / "client-alice.key")
    with context.wrap_socket(socket.create_connection((node.host, node.admin_port), timeout=10),
                             server_hostname=node.host) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"role"' in answer
