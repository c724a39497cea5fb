"""The znode tree, one operation at a time: the Stat effects ZooKeeper documents,
sessions and ephemerals, containers and TTL nodes, system znodes, snapshots.

Each test drives a DataTree through committed transactions (metastore.core.txn.apply),
as every node does, and checks what a client would read back.
"""

from __future__ import annotations

import pytest

from metastore.core import paths
from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Id, Perm
from metastore.errors import (BadArguments, DecodeError, NoChildrenForEphemerals, NoNode, NotEmpty, TxnConflict)
from metastore.wire.snapshot_codec import FrozenTree, decode_snapshot, encode_tree
from metastore.wire.snapshot_stream import SnapshotDecoder
from metastore.core.ephemeral_owner import CONTAINER_OWNER, MAX_TTL_MS, EphemeralType, ephemeral_type, ttl_owner
from metastore.core.tree import DataTree, i32, next_version
from metastore.core.txn import (AlreadyApplied, CloseSession, Create, CreateSession, Delete, SessionClosed, SetACL,
                           SetData, Transaction, apply)

SESSION = 0x0100_0000_0000_0001
EPOCH = 0x5_0000_0000


class Cluster:
    """Commits transactions to one tree with increasing zxids and times, as the leader would."""

    def __init__(self) -> None:
        self.tree = DataTree()
        self.zxid = EPOCH
        self.time_ms = 1_700_000_000_000

    def commit(self, body):
        self.zxid += 1
        self.time_ms += 10
        return apply(self.tree, self.zxid, Transaction(self.time_ms, body))

    def create(self, path: str, data: bytes = b"", owner: int = 0, acl=OPEN_ACL_UNSAFE):
        parent = paths.parent_of(path)
        return self.commit(Create(path, data, acl, owner, self.tree.parent_cversion(parent) + 1))

    def create_sequential(self, prefix: str, owner: int = 0) -> str:
        parent = paths.parent_of(prefix + "0")
        return self.create(paths.sequential_path(prefix, self.tree.parent_cversion(parent)), owner=owner).path

    def set_data(self, path: str, data: bytes):
        return self.commit(SetData(path, data, next_version(self.tree.get(path)[1].version)))


@pytest.fixture
def zk() -> Cluster:
    return Cluster()


def test_a_fresh_tree_shows_zookeepers_system_znodes():
    tree = DataTree()
    assert tree.children("/") == ["zookeeper"]
    assert tree.children("/zookeeper") == ["config", "quota"]
    root = tree.get("/")[1]
    # Internal create counter 0 with one child: a client sees cversion -1, as on a fresh ZooKeeper.
    assert (root.cversion, root.num_children, root.czxid, root.pzxid) == (-1, 1, 0, 0)
    assert tree.get("/zookeeper")[1].cversion == -2
    acl, config = tree.acl("/zookeeper/config")
    assert acl == READ_ACL_UNSAFE and config.aversion == -1
    assert tree.acl("/zookeeper/quota")[0] == OPEN_ACL_UNSAFE
    assert tree.all_children_number("/") == 3
    assert tree.all_children_number("/zookeeper") == 2


def test_create_stamps_the_new_znode_and_counts_a_child_change_on_the_parent(zk):
    result = zk.create("/app", b"hello")
    stat = zk.tree.get("/app")[1]
    assert result.path == "/app" and result.stat == stat
    assert (stat.czxid, stat.mzxid, stat.pzxid) == (zk.zxid,) * 3
    assert stat.ctime == stat.mtime == zk.time_ms
    assert (stat.version, stat.cversion, stat.aversion, stat.ephemeral_owner) == (0, 0, 0, 0)
    assert (stat.data_length, stat.num_children) == (5, 0)
    root = zk.tree.get("/")[1]
    assert (root.cversion, root.pzxid, root.num_children, root.mzxid) == (0, zk.zxid, 2, 0)


def test_delete_counts_a_child_change_but_sequence_numbers_keep_counting_creates(zk):
    zk.create("/jobs")
    first = zk.create_sequential("/jobs/job-")
    assert first == "/jobs/job-0000000000"
    zk.commit(Delete(first))
    jobs = zk.tree.get("/jobs")[1]
    assert (jobs.cversion, jobs.pzxid, jobs.num_children) == (2, zk.zxid, 0)
    assert zk.create_sequential("/jobs/job-") == "/jobs/job-0000000001"
    zk.create("/jobs/plain")  # every create advances the counter, sequential or not
    assert zk.create_sequential("/jobs/job-") == "/jobs/job-0000000003"
    assert zk.tree.get("/jobs")[1].cversion == 5


def test_set_data_changes_version_mzxid_mtime_and_nothing_else(zk):
    zk.create("/cfg", b"v0")
    created = zk.tree.get("/cfg")[1]
    result = zk.set_data("/cfg", b"v1!")
    stat = zk.tree.get("/cfg")[1]
    assert result.stat == stat and zk.tree.get("/cfg")[0] == b"v1!"
    assert (stat.version, stat.mzxid, stat.mtime, stat.data_length) == (1, zk.zxid, zk.time_ms, 3)
    assert (stat.czxid, stat.ctime, stat.pzxid, stat.cversion) == (created.czxid, created.ctime, created.pzxid, 0)
    assert zk.tree.get("/")[1].pzxid == created.czxid  # the parent does not notice


def test_set_acl_changes_aversion_only(zk):
    zk.create("/secret")
    acl = (ACL(Perm.READ, Id("digest", "alice:x")),)
    stat = zk.commit(SetACL("/secret", acl, 1)).stat
    assert zk.tree.acl("/secret") == (acl, stat)
    assert (stat.aversion, stat.version, stat.mzxid) == (1, 0, stat.czxid)


def test_versions_wrap_like_java_ints_and_skip_minus_one():
    assert next_version(0) == 1
    assert next_version(2**31 - 1) == -(2**31)
    assert next_version(-2) == 0  # ZOOKEEPER-4743: -1 means "any version" on the wire
    assert i32(2**31) == -(2**31)


def test_an_ephemeral_belongs_to_its_session_and_has_no_children(zk):
    zk.commit(CreateSession(SESSION, 30_000))
    zk.create("/workers")
    zk.create("/workers/w1", owner=SESSION)
    zk.create("/lock", owner=SESSION)
    assert zk.tree.get("/workers/w1")[1].ephemeral_owner == SESSION
    assert zk.tree.ephemerals(SESSION) == ["/lock", "/workers/w1"]
    assert zk.tree.ephemerals(SESSION, "/work") == ["/workers/w1"]  # a string prefix, as ZooKeeper
    assert zk.tree.ephemerals(SESSION, " / ") == ["/lock", "/workers/w1"]
    with pytest.raises(NoChildrenForEphemerals):
        zk.tree.create("/lock/child", b"", OPEN_ACL_UNSAFE, 0, 1, zk.zxid + 1, 0)


def test_closing_a_session_deletes_its_ephemerals_each_as_a_delete(zk):
    zk.commit(CreateSession(SESSION, 30_000))
    zk.create("/workers")
    zk.create("/workers/w1", owner=SESSION)
    zk.create("/workers/w2", owner=SESSION)
    before = zk.tree.get("/workers")[1]
    result = zk.commit(CloseSession(SESSION, ("/workers/w1", "/workers/w2")))
    assert result == SessionClosed(SESSION, ("/workers/w1", "/workers/w2"))
    after = zk.tree.get("/workers")[1]
    assert (after.num_children, after.pzxid, after.cversion) == (0, zk.zxid, before.cversion + 2)
    assert zk.tree.sessions() == {} and zk.tree.ephemerals(SESSION) == []


def test_a_close_session_that_does_not_list_exactly_the_ephemerals_is_a_conflict(zk):
    zk.commit(CreateSession(SESSION, 30_000))
    zk.create("/e1", owner=SESSION)
    zk.create("/e2", owner=SESSION)
    with pytest.raises(TxnConflict):
        zk.commit(CloseSession(SESSION, ("/e1",)))


def test_an_ephemeral_of_an_unknown_session_is_a_conflict(zk):
    with pytest.raises(TxnConflict):
        zk.create("/orphan", owner=SESSION)
    assert "/orphan" not in zk.tree


def test_containers_and_ttl_nodes_hide_their_owner_and_come_due(zk):
    zk.create("/locks", owner=CONTAINER_OWNER)
    zk.create("/cache", owner=ttl_owner(60_000))
    assert zk.tree.get("/locks")[1].ephemeral_owner == 0
    assert zk.tree.get("/cache")[1].ephemeral_owner == 0
    assert zk.tree.containers() == ["/locks"] and zk.tree.ttl_nodes() == ["/cache"]
    now = zk.time_ms
    assert zk.tree.container_candidates(now) == []  # a container never used stays
    assert zk.tree.container_candidates(now + 10, max_never_used_ms=5) == ["/locks"]
    zk.create("/locks/l-1")
    zk.commit(Delete("/locks/l-1"))
    assert zk.tree.container_candidates(now + 60_001) == ["/cache", "/locks"]
    zk.create("/cache/entry")
    assert zk.tree.container_candidates(now + 60_001) == ["/locks"]  # not while it has children


def test_ephemeral_owner_encoding_follows_ephemeral_type():
    assert ephemeral_type(0) is EphemeralType.VOID
    assert ephemeral_type(SESSION) is EphemeralType.NORMAL
    assert ephemeral_type(0x8000_0000_0000_0000) is EphemeralType.CONTAINER
    assert ttl_owner(1) == 0xFF00_0000_0000_0001 and ephemeral_type(ttl_owner(1)) is EphemeralType.TTL
    with pytest.raises(BadArguments):
        ttl_owner(MAX_TTL_MS + 1)
    with pytest.raises(ValueError):
        ephemeral_type(0xFF01_0000_0000_0001)  # reserved extended type bits


def test_system_znodes_cannot_be_deleted_and_config_is_local(zk):
    for path in ("/", "/zookeeper", "/zookeeper/quota", "/zookeeper/config"):
        with pytest.raises(BadArguments):
            zk.tree.delete(path, zk.zxid + 1)
    with pytest.raises(BadArguments):
        zk.tree.create("/zookeeper/config/x", b"", OPEN_ACL_UNSAFE, 0, 1, zk.zxid + 1, 0)
    digest, snapshot = zk.tree.digest(), encode_tree(zk.tree)
    zk.tree.set_config_node(b"server.1=a:2888:3888:participant\nversion=100000000", 0x1_0000_0000, 123)
    data, stat = zk.tree.get("/zookeeper/config")
    assert data.startswith(b"server.1") and (stat.version, stat.mzxid) == (-1, 0x1_0000_0000)
    assert zk.tree.digest() == digest == zk.tree.recompute_digest()
    assert encode_tree(zk.tree) == snapshot


def test_quota_subtree_is_ordinary_data(zk):
    zk.create("/zookeeper/quota/app")
    assert zk.tree.children("/zookeeper/quota") == ["app"]


def test_delete_needs_an_existing_childless_znode(zk):
    zk.create("/a")
    zk.create("/a/b")
    with pytest.raises(NotEmpty):
        zk.tree.delete("/a", zk.zxid + 1)
    with pytest.raises(NoNode):
        zk.tree.delete("/a/zzz", zk.zxid + 1)
    assert zk.tree.all_children_number("/a") == 1
    with pytest.raises(NoNode):
        zk.tree.all_children_number("/missing")


def test_stale_or_repeated_transactions_are_detected(zk):
    zk.create("/a", b"1")
    set_again = SetData("/a", b"2", 1)
    zk.commit(set_again)
    before = encode_tree(zk.tree)
    # Replay of a zxid the tree already holds: ignored, whole.
    assert apply(zk.tree, zk.zxid, Transaction(0, set_again)) == AlreadyApplied(zk.zxid)
    assert encode_tree(zk.tree) == before
    # The same transaction under a new zxid (prepared against a stale view): absolute values no longer fit.
    for body in (set_again, Create("/a", b"", OPEN_ACL_UNSAFE, 0, 2), Delete("/nope"), SetACL("/a", (), 7)):
        with pytest.raises(TxnConflict):
            apply(zk.tree, zk.zxid + 1, Transaction(0, body))


def test_freeze_is_a_view_the_tree_never_changes(zk):
    zk.commit(CreateSession(SESSION, 10_000))
    zk.create("/a", b"before")
    zk.create("/a/e", owner=SESSION)
    snapshot = encode_tree(zk.tree)
    frozen = FrozenTree.of(zk.tree)
    zk.set_data("/a", b"after")
    zk.create("/a/b")
    zk.commit(CloseSession(SESSION, ("/a/e",)))
    assert frozen.nodes["/a"].data == b"before" and sorted(frozen.nodes["/a"].children) == ["e"]
    assert frozen.to_bytes() == snapshot and frozen.zxid == EPOCH + 3
    assert zk.tree.digest() == zk.tree.recompute_digest() != frozen.digest


def test_a_snapshot_keeps_sessions_ephemerals_containers_ttls_and_counters(zk):
    zk.commit(CreateSession(SESSION, 10_000))
    zk.create("/locks", owner=CONTAINER_OWNER)
    zk.create_sequential("/locks/lock-", owner=SESSION)
    zk.create("/cache", b"x" * 100, owner=ttl_owner(5))
    zk.commit(Delete("/cache"))
    zk.create("/cache", owner=ttl_owner(5), acl=(ACL(Perm.ALL, Id("ip", "10.0.0.0/8")),))
    restored = decode_snapshot(encode_tree(zk.tree))
    assert restored.last_zxid == zk.tree.last_zxid and restored.digest() == zk.tree.digest()
    assert restored.sessions() == {SESSION: 10_000}
    assert restored.ephemerals(SESSION) == ["/locks/lock-0000000000"]
    assert restored.containers() == ["/locks"] and restored.ttl_nodes() == ["/cache"]
    for path in ("/", "/locks", "/locks/lock-0000000000", "/cache", "/zookeeper", "/zookeeper/config"):
        assert restored.get(path) == zk.tree.get(path)
        assert restored.acl(path) == zk.tree.acl(path)
        assert restored.children(path) == zk.tree.children(path)
    assert restored.parent_cversion("/") == zk.tree.parent_cversion("/") == 3


def test_a_damaged_snapshot_is_refused(zk):
    zk.create("/a", b"payload")
    good = encode_tree(zk.tree)
    flipped = bytearray(good)
    flipped[good.index(b"payload")] ^= 1
    with pytest.raises(DecodeError, match="digest"):
        decode_snapshot(bytes(flipped))
    # A node's restore takes the digest on trust: what it reads is checked whole by a CRC or a
    # SHA-256 first (tests/test_zab_snapshot.py, tests/test_zab_snap_transfer.py).
    trusting = SnapshotDecoder(verify_digest=False)
    trusting.feed(bytes(flipped))
    taken = trusting.finish()
    assert taken.digest() == zk.tree.digest() != taken.recompute_digest()
    with pytest.raises(DecodeError):
        decode_snapshot(good[:-1])
    with pytest.raises(DecodeError):
        decode_snapshot(good + b"\0")


def test_the_digest_follows_every_change_and_tells_states_apart(zk):
    seen = {zk.tree.digest()}
    zk.commit(CreateSession(SESSION, 10_000))
    seen.add(zk.tree.digest())
    zk.create("/a", b"x")
    seen.add(zk.tree.digest())
    zk.set_data("/a", b"x")  # same bytes, new version and mzxid
    seen.add(zk.tree.digest())
    zk.commit(SetACL("/a", OPEN_ACL_UNSAFE, 1))
    seen.add(zk.tree.digest())
    zk.commit(Delete("/a"))
    seen.add(zk.tree.digest())
    assert len(seen) == 6
    assert zk.tree.digest() == zk.tree.recompute_digest()


def test_nested_savepoints_undo_exactly_their_own_changes(zk):
    zk.commit(CreateSession(SESSION, 10_000))
    zk.create("/q")
    zk.create("/q/e", owner=SESSION)
    start = encode_tree(zk.tree)
    outer = zk.tree.savepoint()
    zk.tree.create("/q/a", b"1", READ_ACL_UNSAFE, 0, 2, zk.zxid + 1, 7)
    zk.tree.delete("/q/e", zk.zxid + 1)
    middle = encode_tree(zk.tree)
    inner = zk.tree.savepoint()
    zk.tree.set_data("/q/a", b"2", 1, zk.zxid + 2, 8)
    zk.tree.set_acl("/q", READ_ACL_UNSAFE, 1)
    zk.tree.delete("/q/a", zk.zxid + 2)
    zk.tree.rollback(inner)
    assert encode_tree(zk.tree) == middle and zk.tree.digest() == zk.tree.recompute_digest()
    zk.tree.rollback(outer)
    assert encode_tree(zk.tree) == start and zk.tree.digest() == zk.tree.recompute_digest()
    assert zk.tree.ephemerals(SESSION) == ["/q/e"]
    kept = zk.tree.savepoint()
    zk.tree.create("/q/b", b"", OPEN_ACL_UNSAFE, 0, 2, zk.zxid + 1, 7)
    zk.tree.release(kept)
    zk.commit(CreateSession(SESSION + 1, 10_000))  # recording stopped: sessions may change again
    assert "/q/b" in zk.tree
