"""ACLs as ZooKeeper 3.9 enforces them (issue 17), on the pure core and with kazoo on a
real 3-node cluster.

Each story is a read or a watch that used to tell a client about a znode it may not read:
getACL without READ or ADMIN (ZooKeeper's CVE-2019-0201), exists, getAllChildrenNumber, a
multi's check, and a persistent recursive watch firing for a child the watcher cannot read
(CVE-2024-23944). Then the cluster's superDigest identity, which passes every check, and the
x509 scheme a client certificate maps to.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.protocol.serialization import int_struct, write_string
from kazoo.security import ACL as KACL
from kazoo.security import Id as KId
from kazoo.security import make_digest_acl

from clusterd import config as cfg
from clusterd import localcluster
from metastore.core import acl as A
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.errors import NoAuth, NoNode
from metastore.wire.jute_defs import EventType, OpCode
from metastore.core.responses import read_reply
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import ErrorResult
from metastore.core.watches import WatchKind, WatchManager
from cluster_fixtures import Cluster, copy_config
from cluster_fixtures import started_kazoo
from metastore_fixtures import answer
from zab.core import zxid as Z

ALICE = A.digest_auth_id(b"alice:secret")
BOB = A.digest_auth_id(b"bob:pw")
CLIENT_IP = A.Id("ip", "127.0.0.1")
# ZooKeeper's own test suite configures this superDigest, for "super:test".
SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
SESSION = 0x1_0000_0001


# -- the pure core ----------------------------------------------------------------------

class Tree:
    """A metastore state machine with one open session, fed requests as the leader would."""

    def __init__(self) -> None:
        self.sm = MetastoreStateMachine()
        self.counter = 0
        self.submit(E.Envelope(E.CREATE_SESSION, 1, 0, (), struct.pack(">i", 5000)))

    def submit(self, env: E.Envelope):
        self.counter += 1
        return answer(self.sm, Z.make(1, self.counter), SESSION, E.encode_envelope(env))

    def request(self, opcode: int, body: object, auth: tuple[A.Id, ...] = ()):
        payload = jute.encode_request(jute.RequestHeader(1, opcode), body)
        return self.submit(E.Envelope(E.CLIENT, 1, self.counter, tuple((i.scheme, i.id) for i in auth), payload))

    def create(self, path: str, acl: tuple[A.ACL, ...], auth: tuple[A.Id, ...] = ()):
        wire = tuple(jute.ACL(a.perms, jute.Id(a.id.scheme, a.id.id)) for a in acl)
        return self.request(OpCode.CREATE, jute.CreateRequest(path, b"d", wire, 0), auth)

    def read(self, opcode: int, body: object, auth: tuple[A.Id, ...] = ()):
        return read_reply(self.sm.tree, opcode, body, SESSION, list(auth))


ALICE_ONLY = (A.ACL(A.Perm.ALL, ALICE),)


@pytest.fixture
def tree() -> Tree:
    t = Tree()
    t.create("/secret", ALICE_ONLY)
    t.create("/secret/kid", A.OPEN_ACL_UNSAFE, (ALICE,))
    return t


def test_get_acl_needs_read_or_admin(tree: Tree):
    assert tree.read(OpCode.GET_ACL, jute.GetACLRequest("/secret")).err == NoAuth.code
    assert tree.read(OpCode.GET_ACL, jute.GetACLRequest("/secret"), (BOB, CLIENT_IP)).err == NoAuth.code
    assert tree.read(OpCode.GET_ACL, jute.GetACLRequest("/nowhere")).err == NoNode.code
    reply = tree.read(OpCode.GET_ACL, jute.GetACLRequest("/secret"), (ALICE,))
    assert reply.err == 0 and [a.id.id for a in reply.body.acl] == [ALICE.id]


def test_get_acl_without_admin_hides_digest_passwords(tree: Tree):
    acl = (A.ACL(A.Perm.READ, BOB), A.ACL(A.Perm.ALL, ALICE), A.ACL(A.Perm.READ, A.Id("ip", "10.0.0.0/8")))
    tree.create("/shared", acl)
    reply = tree.read(OpCode.GET_ACL, jute.GetACLRequest("/shared"), (BOB,))
    assert reply.err == 0
    assert [(a.perms, a.id.scheme, a.id.id) for a in reply.body.acl] == [
        (A.Perm.READ, "digest", "bob:x"), (A.Perm.ALL, "digest", "alice:x"), (A.Perm.READ, "ip", "10.0.0.0/8")]
    admin_only = (A.ACL(A.Perm.ADMIN, BOB), A.ACL(A.Perm.READ, ALICE))
    tree.create("/admin-only", admin_only)
    reply = tree.read(OpCode.GET_ACL, jute.GetACLRequest("/admin-only"), (BOB,))
    assert [a.id.id for a in reply.body.acl] == [BOB.id, ALICE.id]  # ADMIN sees the digests


def test_exists_needs_read_on_an_existing_node_and_sets_no_watch_when_refused(tree: Tree):
    reply = tree.read(OpCode.EXISTS, jute.ExistsRequest("/secret", True))
    assert reply.err == NoAuth.code and reply.watch is None
    assert tree.read(OpCode.EXISTS, jute.ExistsRequest("/secret", False), (ALICE,)).err == 0
    missing = tree.read(OpCode.EXISTS, jute.ExistsRequest("/secret/none", True))
    assert missing.err == NoNode.code and missing.watch == ("/secret/none", WatchKind.DATA)


def test_get_all_children_number_needs_read(tree: Tree):
    body = jute.GetAllChildrenNumberRequest("/secret")
    assert tree.read(OpCode.GET_ALL_CHILDREN_NUMBER, body).err == NoAuth.code
    reply = tree.read(OpCode.GET_ALL_CHILDREN_NUMBER, body, (ALICE,))
    assert reply.err == 0 and reply.body.total_number == 1


def test_a_multis_check_needs_read(tree: Tree):
    check = jute.MultiRequest(((OpCode.CHECK, jute.CheckVersionRequest("/secret", 0)),))
    applied = tree.request(OpCode.MULTI, check)
    assert applied.result.results == (ErrorResult(NoAuth.code),)
    applied = tree.request(OpCode.MULTI, check, (ALICE,))
    assert not isinstance(applied.result.results[0], ErrorResult)


def test_delete_checks_the_parents_acl_before_telling_whether_the_child_exists(tree: Tree):
    # PrepRequestProcessor: the parent's DELETE first, so NoNode cannot reveal an unreadable child.
    applied = tree.request(OpCode.DELETE, jute.DeleteRequest("/secret/none", -1))
    assert applied.result == ErrorResult(NoAuth.code)
    applied = tree.request(OpCode.DELETE, jute.DeleteRequest("/secret/none", -1), (ALICE,))
    assert applied.result == ErrorResult(NoNode.code)
    assert tree.request(OpCode.DELETE, jute.DeleteRequest("/nowhere/none", -1)).result == ErrorResult(NoNode.code)


def test_super_passes_every_check_and_comes_only_from_the_configured_digest():
    assert A.digest_auth_ids(b"super:test", SUPER_DIGEST) == [A.SUPER_ID, A.digest_auth_id(b"super:test")]
    assert A.digest_auth_ids(b"super:wrong", SUPER_DIGEST) == [A.digest_auth_id(b"super:wrong")]
    assert A.digest_auth_ids(b"super:test", None) == [A.digest_auth_id(b"super:test")]
    assert A.check(ALICE_ONLY, A.Perm.ALL, [A.SUPER_ID])
    assert not A.check(ALICE_ONLY, A.Perm.READ, [A.Id("digest", "super:" + SUPER_DIGEST.split(":")[1])])


def test_watch_events_go_only_to_connections_that_may_read_the_node():
    auth = {1: [CLIENT_IP], 2: [CLIENT_IP, ALICE], 3: [A.SUPER_ID]}
    w = WatchManager(auth_of=lambda conn: auth[conn])
    for conn in auth:
        w.add(conn, "/", WatchKind.PERSISTENT_RECURSIVE)
        w.add(conn, "/open", WatchKind.CHILD)
    hidden = w.trigger("/open/secret", EventType.NODE_CREATED, acl=ALICE_ONLY, parent_acl=A.OPEN_ACL_UNSAFE)
    assert set(hidden) == {(1, EventType.NODE_CHILDREN_CHANGED, "/open"),
                           (2, EventType.NODE_CHILDREN_CHANGED, "/open"), (2, EventType.NODE_CREATED, "/open/secret"),
                           (3, EventType.NODE_CHILDREN_CHANGED, "/open"), (3, EventType.NODE_CREATED, "/open/secret")}
    shown = w.trigger("/open/pub", EventType.NODE_CREATED, acl=A.OPEN_ACL_UNSAFE, parent_acl=A.OPEN_ACL_UNSAFE)
    assert sorted(c for c, ev, at in shown if at == "/open/pub") == [1, 2, 3]


def test_a_one_shot_watch_refused_by_the_acl_is_spent_unheard_as_in_zookeeper():
    w = WatchManager(auth_of=lambda conn: [CLIENT_IP])
    w.add(1, "/later", WatchKind.DATA)  # exists() on a missing node: no ACL to check yet
    assert w.trigger("/later", EventType.NODE_CREATED, acl=ALICE_ONLY, parent_acl=A.OPEN_ACL_UNSAFE) == []
    assert w.count() == 0


def test_applied_events_carry_the_acl_of_their_node_even_when_it_is_deleted(tree: Tree):
    applied = tree.request(OpCode.DELETE, jute.DeleteRequest("/secret/kid", -1), (ALICE,))
    assert [(e.path, e.type, e.acl, e.parent_acl) for e in applied.events] == [
        ("/secret/kid", EventType.NODE_DELETED, A.OPEN_ACL_UNSAFE, ALICE_ONLY)]
    ops = ((OpCode.CREATE, jute.CreateRequest("/m", b"", (jute.ACL(1, jute.Id("digest", BOB.id)),), 0)),
           (OpCode.DELETE, jute.DeleteRequest("/m", -1)))
    applied = tree.request(OpCode.MULTI, jute.MultiRequest(ops))
    assert [(e.type, e.acl) for e in applied.events] == [
        (EventType.NODE_CREATED, (A.ACL(1, BOB),)), (EventType.NODE_DELETED, (A.ACL(1, BOB),))]


# -- kazoo on a real cluster ------------------------------------------------------------

@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("acl"))
    path.write_text(path.read_text().replace("[cluster]\n", f'[cluster]\nsuper_digest = "{SUPER_DIGEST}"\n', 1))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def kazoo(cluster: Cluster, node_id: int | None = None, auth: str | None = None) -> KazooClient:
    return started_kazoo(cluster, node_id, auth_data=[("digest", auth)] if auth else None)


@pytest.fixture(scope="module")
def alice(ensemble: Cluster) -> Iterator[KazooClient]:
    zk = kazoo(ensemble, 1, "alice:secret")
    yield zk
    zk.stop()
    zk.close()


@pytest.fixture
def anon(ensemble: Cluster) -> Iterator[KazooClient]:
    zk = kazoo(ensemble, 1)  # on alice's node: what alice wrote is there to read
    yield zk
    zk.stop()
    zk.close()


def assert_every_node_serves(cluster: Cluster) -> None:
    for node in cfg.load(cluster.path).nodes:
        assert localcluster.running_pid(node) is not None, f"node {node.id} exited"
        zk = kazoo(cluster, node.id)
        try:
            zk.sync("/")
            assert zk.exists("/") is not None
        finally:
            zk.stop()
            zk.close()


class RawRequest:
    """A request kazoo has no method for, sent through its own connection."""

    def __init__(self, opcode: int, body: bytes, parse=lambda buf, offset: None) -> None:
        self.type, self._body, self._parse = opcode, body, parse

    def serialize(self) -> bytearray:
        return bytearray(self._body)

    def deserialize(self, buf, offset):
        return self._parse(buf, offset)


def call(zk: KazooClient, request: RawRequest):
    result = zk.handler.async_result()
    zk._call(request, result)
    return result.get(timeout=10)


def secret_node(alice: KazooClient, path: str) -> None:
    alice.create(path, b"s", acl=[make_digest_acl("alice", "secret", all=True)], makepath=False)


@pytest.mark.multiprocess
def test_kazoo_get_acl_is_refused_without_read_or_admin(ensemble: Cluster, alice: KazooClient, anon: KazooClient):
    secret_node(alice, "/ga")
    with pytest.raises(NoAuthError):
        anon.get_acls("/ga")
    alice.set_acls("/ga", [make_digest_acl("alice", "secret", all=True), KACL(1, KId("world", "anyone"))])
    acls, _ = anon.get_acls("/ga")
    assert sorted((a.id.scheme, a.id.id) for a in acls) == [("digest", "alice:x"), ("world", "anyone")]
    assert alice.get_acls("/ga")[0][0] == make_digest_acl("alice", "secret", all=True)
    assert_every_node_serves(ensemble)


@pytest.mark.multiprocess
def test_kazoo_exists_is_refused_without_read(alice: KazooClient, anon: KazooClient):
    secret_node(alice, "/ex")
    with pytest.raises(NoAuthError):
        anon.exists("/ex")
    assert anon.exists("/ex-missing") is None
    assert alice.exists("/ex") is not None


@pytest.mark.multiprocess
def test_kazoo_get_all_children_number_is_refused_without_read(alice: KazooClient, anon: KazooClient):
    secret_node(alice, "/acn")
    alice.create("/acn/kid", b"")
    count = RawRequest(OpCode.GET_ALL_CHILDREN_NUMBER, write_string("/acn"),
                       lambda buf, offset: int_struct.unpack_from(buf, offset)[0])
    with pytest.raises(NoAuthError):
        call(anon, count)
    assert call(alice, count) == 1


@pytest.mark.multiprocess
def test_kazoo_a_multis_check_is_refused_without_read(alice: KazooClient, anon: KazooClient):
    secret_node(alice, "/chk")
    t = anon.transaction()
    t.check("/chk", 0)
    assert [type(r) for r in t.commit()] == [NoAuthError]
    t = alice.transaction()
    t.check("/chk", 0)
    assert t.commit() == [True]


@pytest.mark.multiprocess
def test_kazoo_persistent_recursive_watch_hides_children_the_watcher_cannot_read(ensemble: Cluster,
                                                                              alice: KazooClient,
                                                                              anon: KazooClient):
    alice.create("/prw", b"")
    watch_recursively = RawRequest(OpCode.ADD_WATCH, write_string("/prw") + int_struct.pack(1))
    call(anon, watch_recursively)
    heard: list[tuple[str, str]] = []
    public_created = threading.Event()

    def listener(event) -> None:
        heard.append((event.type, event.path))
        if event.path == "/prw/public":
            public_created.set()
    # kazoo has no addWatch: listen where its connection looks up the listeners of an event's
    # path (each is called once). Events reach a connection in commit order, so the secret's
    # would arrive before the public node's creation.
    for path in ("/prw/secret", "/prw/public"):
        anon._data_watchers[path].add(listener)
    secret_node(alice, "/prw/secret")
    alice.set("/prw/secret", b"changed")
    alice.create("/prw/public", b"")
    assert public_created.wait(10), heard
    assert all(path != "/prw/secret" for _, path in heard), heard
    assert_every_node_serves(ensemble)


@pytest.mark.multiprocess
def test_kazoo_super_digest_passes_every_acl(ensemble: Cluster, alice: KazooClient):
    secret_node(alice, "/sup")
    admin = kazoo(ensemble, 1, "super:test")
    wrong = kazoo(ensemble, 1, "super:guess")
    try:
        assert admin.get("/sup")[0] == b"s"
        assert admin.exists("/sup") is not None and admin.get_children("/sup") == []
        assert admin.get_acls("/sup")[0] == [make_digest_acl("alice", "secret", all=True)]
        with pytest.raises(NoAuthError):
            wrong.get("/sup")
        with pytest.raises(NoAuthError):
            wrong.get_acls("/sup")
    finally:
        for zk in (admin, wrong):
            zk.stop()
            zk.close()


@pytest.mark.multiprocess
def test_kazoo_super_digest_writes_through_any_acl(ensemble: Cluster, alice: KazooClient):
    """As in ZooKeeper, the super id travels with the session's writes to the leader, which
    takes the word of the node that authenticated it (envelope.py says how it is vouched for)."""
    secret_node(alice, "/supw")
    admin = kazoo(ensemble, 2, "super:test")  # a follower or the leader: either way through Zab
    try:
        admin.set("/supw", b"by super")
        admin.set_acls("/supw", [make_digest_acl("bob", "pw", read=True)])
        admin.create("/supw/kid", b"")
        admin.delete("/supw/kid")
        admin.delete("/supw")
        alice.sync("/supw")
        assert alice.exists("/supw") is None
    finally:
        admin.stop()
        admin.close()
    assert_every_node_serves(ensemble)


def test_a_malformed_super_digest_in_cluster_toml_is_refused_at_load(tmp_path):
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("[cluster]\n", '[cluster]\nsuper_digest = "super:test"\n', 1))
    with pytest.raises(cfg.ConfigError, match="super_digest.*generate_digest"):
        cfg.load(path)
