"""The znode tree under hypothesis, against a reference model made of plain dicts.

The model plays the leader: it turns each random client operation into the
transaction ZooKeeper's PrepRequestProcessor would produce (or an Error when
the request must fail), then applies it to itself with its own, independent
bookkeeping (it counts the visible cversion as creates + deletes instead of
deriving it). The same transaction, through encode_txn/decode_txn, goes to a
DataTree. After every step the two must show the same thing to a client: every
znode's data, Stat, ACL and children, every session's ephemerals, the sessions
table, and each transaction's result. The tree's incremental digest must equal a
from-scratch recomputation after every step.

Snapshots: a snapshot taken at a random step, restored (verifying its digest, and as a node does,
taking it) and fed the *whole* log
(the prefix it already holds is ignored as AlreadyApplied), ends with the same
digest and the same snapshot bytes as the full run; a freeze() taken at that step
and serialised at the end gives the bytes the tree had at that step.
"""

from __future__ import annotations

import copy
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metastore import errors

from metastore.core import paths
from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Id, Perm, check
from metastore.core.stat import Stat
from metastore.wire.snapshot_codec import FrozenTree, decode_snapshot, encode_tree
from metastore.wire.snapshot_stream import SnapshotDecoder
from metastore.core.ephemeral_owner import CONTAINER_OWNER, ttl_owner
from metastore.core.tree import DataTree, next_version
from metastore.core.txn import (AlreadyApplied, Check, CloseSession, Create, CreateResult, CreateSession, CheckResult,
                           Delete, DeleteResult, Error, ErrorResult, Multi, MultiResult, SessionClosed,
                           SessionCreated, SetACL, SetACLResult, SetData, SetDataResult, Transaction, apply)
from metastore.wire.txn_codec import decode_txn, encode_txn

EXAMPLES = 2000 if os.environ.get("QUIRE_SOAK") else 150
MODEL = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ANY = -1  # the wire's "any version"
# The client's ids: it passes ip ACLs on 10/8 and digest ACLs for "u:abc", nothing else.
AUTH_IDS = (Id("ip", "10.1.2.3"), Id("digest", "u:abc"))
DIGEST_ACL = (ACL(Perm.READ | Perm.WRITE, Id("digest", "u:abc")), ACL(Perm.ADMIN, Id("ip", "10.0.0.0/8")))
LOCKED_ACL = (ACL(Perm.ALL, Id("digest", "someone:else")),)
ACLS = (OPEN_ACL_UNSAFE,) * 5 + (READ_ACL_UNSAFE, DIGEST_ACL, LOCKED_ACL)
MODES = ("persistent", "persistent", "ephemeral", "sequential", "ephemeral_sequential", "container", "ttl")


class Model:
    """Znodes as dicts keyed by path; the leader's logic and the expected effects, written plainly."""

    def __init__(self) -> None:
        def system(cversion: int, acl=OPEN_ACL_UNSAFE, aversion: int = 0) -> dict:
            return dict(data=b"", acl=acl, czxid=0, mzxid=0, pzxid=0, ctime=0, mtime=0, version=0,
                        creates=0, cversion=cversion, aversion=aversion, owner=0)
        self.nodes = {"/": system(-1), "/zookeeper": system(-2), "/zookeeper/quota": system(0),
                      "/zookeeper/config": system(0, READ_ACL_UNSAFE, -1)}
        self.sessions: dict[int, int] = {}
        self.next_session = 0x0100_0000_0000_0001

    # -- what a client sees ------------------------------------------------------------
    def children(self, path: str) -> list[str]:
        return sorted(paths.basename(p) for p in self.nodes if p != "/" and paths.parent_of(p) == path)

    def stat(self, path: str) -> Stat:
        n = self.nodes[path]
        owner = n["owner"] if n.get("kind") == "ephemeral" else 0  # containers and TTL nodes show 0
        return Stat(n["czxid"], n["mzxid"], n["ctime"], n["mtime"], n["version"], n["cversion"], n["aversion"],
                    owner, len(n["data"] or b""), len(self.children(path)), n["pzxid"])  # null data: length 0

    def ephemerals(self, session_id: int) -> list[str]:
        return sorted(p for p, n in self.nodes.items() if n.get("kind") == "ephemeral" and n["owner"] == session_id)

    # -- the leader: request -> transaction (or a ZooKeeper error) -------------------------
    def _allowed(self, path: str, perm: Perm) -> None:
        if not check(self.nodes[path]["acl"], perm, AUTH_IDS):
            raise errors.NoAuth()

    def prep_create(self, parent: str, name: str, mode: str, session_id: int, data: bytes, acl) -> Create:
        if "ephemeral" in mode and session_id not in self.sessions:
            raise errors.SessionExpired()
        if parent not in self.nodes:
            raise errors.NoNode()
        self._allowed(parent, Perm.CREATE)
        path = paths.join(parent, name)
        if "sequential" in mode:
            path += "%010d" % self.nodes[parent]["creates"]
        if path in self.nodes:
            raise errors.NodeExists()
        if self.nodes[parent].get("kind") == "ephemeral":
            raise errors.NoChildrenForEphemerals()
        owner = {"container": CONTAINER_OWNER, "ttl": ttl_owner(5000)}.get(mode, 0)
        if "ephemeral" in mode:
            owner = session_id
        return Create(path, data, acl, owner, self.nodes[parent]["creates"] + 1)

    def _existing(self, path: str) -> dict:
        if path not in self.nodes:
            raise errors.NoNode()
        return self.nodes[path]

    def _version_ok(self, current: int, expected: int) -> None:
        if expected != ANY and expected != current:
            raise errors.BadVersion()

    def prep_delete(self, path: str, version: int) -> Delete:
        if path in paths.SPECIAL:
            raise errors.BadArguments()
        parent = paths.parent_of(path)
        if parent not in self.nodes:
            raise errors.NoNode()
        self._allowed(parent, Perm.DELETE)
        self._version_ok(self._existing(path)["version"], version)
        if self.children(path):
            raise errors.NotEmpty()
        return Delete(path)

    def prep_set(self, path: str, data: bytes, version: int) -> SetData:
        node = self._existing(path)
        self._allowed(path, Perm.WRITE)
        self._version_ok(node["version"], version)
        return SetData(path, data, next_version(node["version"]))

    def prep_set_acl(self, path: str, acl, version: int) -> SetACL:
        node = self._existing(path)
        self._allowed(path, Perm.ADMIN)
        self._version_ok(node["aversion"], version)
        return SetACL(path, acl, next_version(node["aversion"]))

    def prep_check(self, path: str, version: int) -> Check:
        node = self._existing(path)
        self._allowed(path, Perm.READ)
        self._version_ok(node["version"], version)
        return Check(path, node["version"])

    # -- the expected effects ---------------------------------------------------------
    def apply(self, zxid: int, time_ms: int, body):
        handler = getattr(self, "_apply_" + type(body).__name__)
        return handler(zxid, time_ms, body)

    def _apply_Create(self, zxid, time_ms, op: Create):
        parent = self.nodes[paths.parent_of(op.path)]
        parent["creates"] += 1
        parent["cversion"] += 1
        parent["pzxid"] = zxid
        owner = op.ephemeral_owner
        kind = ("persistent" if owner == 0 else "container" if owner == CONTAINER_OWNER
                else "ttl" if owner >> 56 == 0xFF else "ephemeral")
        self.nodes[op.path] = dict(data=op.data, acl=op.acl, czxid=zxid, mzxid=zxid, pzxid=zxid, ctime=time_ms,
                                   mtime=time_ms, version=0, creates=0, cversion=0, aversion=0,
                                   owner=op.ephemeral_owner, kind=kind)
        return CreateResult(op.path, self.stat(op.path))

    def _apply_Delete(self, zxid, time_ms, op: Delete):
        del self.nodes[op.path]
        parent = self.nodes[paths.parent_of(op.path)]
        parent["cversion"] += 1
        parent["pzxid"] = zxid
        return DeleteResult(op.path)

    def _apply_SetData(self, zxid, time_ms, op: SetData):
        self.nodes[op.path].update(data=op.data, version=op.version, mzxid=zxid, mtime=time_ms)
        return SetDataResult(op.path, self.stat(op.path))

    def _apply_SetACL(self, zxid, time_ms, op: SetACL):
        self.nodes[op.path].update(acl=op.acl, aversion=op.version)
        return SetACLResult(op.path, self.stat(op.path))

    def _apply_Check(self, zxid, time_ms, op: Check):
        return CheckResult(op.path)

    def _apply_Error(self, zxid, time_ms, op: Error):
        return ErrorResult(op.code)

    def _apply_CreateSession(self, zxid, time_ms, op: CreateSession):
        self.sessions[op.session_id] = op.timeout_ms
        return SessionCreated(op.session_id, op.timeout_ms)

    def _apply_CloseSession(self, zxid, time_ms, op: CloseSession):
        for path in op.ephemerals:
            self._apply_Delete(zxid, time_ms, Delete(path))
        del self.sessions[op.session_id]
        return SessionClosed(op.session_id, op.ephemerals)

    def _apply_Multi(self, zxid, time_ms, op: Multi):
        return MultiResult(tuple(self.apply(zxid, time_ms, o) for o in op.ops))


# -- random client operations ------------------------------------------------------------
index = st.integers(min_value=0, max_value=63)
data = st.none() | st.binary(max_size=6)  # None: null data, which the tree keeps apart from b""
version_choice = st.sampled_from(("any", "exact", "wrong"))
names = st.sampled_from(("a", "b", "c", "q-"))

create_op = st.tuples(st.just("create"), index, names, st.sampled_from(MODES), index, data, index)
delete_op = st.tuples(st.just("delete"), index, version_choice)
set_op = st.tuples(st.just("set"), index, data, version_choice)
check_op = st.tuples(st.just("check"), index, version_choice)
client_ops = st.one_of(
    create_op, create_op, create_op, delete_op, set_op,
    st.tuples(st.just("set_acl"), index, index, version_choice),
    st.tuples(st.just("open_session"), st.integers(min_value=1, max_value=60_000)),
    st.tuples(st.just("close_session"), index),
    st.tuples(st.just("multi"), st.lists(st.one_of(create_op, delete_op, set_op, check_op), max_size=4)),
    st.tuples(st.just("error"), st.sampled_from((-101, -102, -110, -8))),
)


def pick(options: list, i: int):
    return options[i % len(options)]


def version(current: int, choice: str) -> int:
    return {"any": ANY, "exact": current, "wrong": current + 7}[choice]


def prep_one(model: Model, op: tuple):
    """One request -> the body of its transaction; raises the ZooKeeper error if it must fail."""
    kind = op[0]
    # Mostly the client's own znodes; sometimes a system znode or a missing one.
    user = sorted(p for p in model.nodes if p not in paths.SPECIAL)
    targets = user * 4 + sorted(paths.SPECIAL) + ["/nope", "/a/nope"]
    if kind == "create":
        _, parent_i, name, mode, session_i, payload, acl_i = op
        session_id = pick(sorted(model.sessions) or [0x0100_0000_0000_0999], session_i)
        return model.prep_create(pick(targets, parent_i), name, mode, session_id, payload, pick(ACLS, acl_i))
    path = pick(targets, op[1])
    current = model.nodes.get(path, {"version": 0, "aversion": 0})
    if kind == "delete":
        return model.prep_delete(path, version(current["version"], op[2]))
    if kind == "set":
        return model.prep_set(path, op[2], version(current["version"], op[3]))
    if kind == "check":
        return model.prep_check(path, version(current["version"], op[2]))
    if kind == "set_acl":
        return model.prep_set_acl(path, pick(ACLS, op[2]), version(current["aversion"], op[3]))
    raise AssertionError(kind)


def prep_multi(model: Model, ops: list, zxid: int, time_ms: int) -> Multi:
    """All or nothing: prepare each op against the effects of the ones before it (on a scratch copy)."""
    scratch = copy.deepcopy(model)
    bodies = []
    for i, op in enumerate(ops):
        try:
            body = prep_one(scratch, op)
        except errors.ZooKeeperError as e:
            return Multi((Error(0),) * i + (Error(e.code),) + (Error(-2),) * (len(ops) - i - 1))
        scratch.apply(zxid, time_ms, body)
        bodies.append(body)
    return Multi(tuple(bodies))


def prepare(model: Model, op: tuple, zxid: int, time_ms: int):
    kind = op[0]
    if kind == "open_session":
        session_id = model.next_session
        model.next_session += 0x1_0001
        return CreateSession(session_id, op[1])
    if kind == "close_session":
        if not model.sessions:
            return Error(-112)
        session_id = pick(sorted(model.sessions), op[1])
        return CloseSession(session_id, tuple(model.ephemerals(session_id)))
    if kind == "multi":
        return prep_multi(model, op[1], zxid, time_ms)
    if kind == "error":
        return Error(op[1])
    try:
        return prep_one(model, op)
    except errors.ZooKeeperError as e:
        return Error(e.code)


# -- the oracle ------------------------------------------------------------------------
def assert_same_view(model: Model, tree: DataTree) -> None:
    assert len(tree) == len(model.nodes)
    for path in model.nodes:
        data, stat = tree.get(path)
        assert data == model.nodes[path]["data"], path
        assert stat == model.stat(path), path
        assert tree.acl(path)[0] == model.nodes[path]["acl"], path
        assert tree.children(path) == model.children(path), path
    for missing in ("/nope", "/a/nope", "/q-"):
        assert (tree.exists(missing) is None) == (missing not in model.nodes)
    assert tree.sessions() == model.sessions
    for session_id in model.sessions:
        assert tree.ephemerals(session_id) == model.ephemerals(session_id)
    assert tree.all_children_number("/") == len(model.nodes) - 1
    assert tree.digest() == tree.recompute_digest()
    assert tree.data_bytes == data_bytes(tree)  # mntr's approximate data size, kept incrementally
    order = {path: i for i, path in enumerate(tree._nodes)}  # the order a snapshot writes: parents first
    assert all(order[paths.parent_of(p)] < i for p, i in order.items() if p != "/")


def data_bytes(tree: DataTree) -> int:
    return sum(len(path) + len(node.data or b"") for path, node in tree._nodes.items())


def run(ops: list, snapshot_at: int):
    model, tree = Model(), DataTree()
    log: list[tuple[int, bytes]] = []
    ops = [("open_session", 30_000)] + ops
    snapshot, frozen = None, None
    for step, op in enumerate(ops):
        if step == snapshot_at:
            snapshot, frozen = encode_tree(tree), FrozenTree.of(tree)
        zxid, time_ms = 0x1_0000_0000 + step + 1, 1_700_000_000_000 + 10 * step
        body = prepare(model, op, zxid, time_ms)
        raw = encode_txn(Transaction(time_ms, body))
        log.append((zxid, raw))
        expected = model.apply(zxid, time_ms, body)
        assert apply(tree, zxid, decode_txn(raw)) == expected, body
        assert_same_view(model, tree)
    return model, tree, log, snapshot, frozen


@MODEL
@given(st.lists(client_ops, min_size=10, max_size=80), st.integers(min_value=0, max_value=80))
def test_tree_matches_the_model_and_replay_from_any_snapshot_is_exact(ops, snapshot_at):
    _, tree, log, snapshot, frozen = run(ops, snapshot_at)
    if snapshot is None:
        snapshot, frozen = encode_tree(tree), FrozenTree.of(tree)
    assert frozen.to_bytes() == snapshot, "a frozen view changed after the tree moved on"
    # Verified, and as a node restores (the snapshot's digest taken, each znode hashed only when
    # it first changes or goes): both must end where the full run did.
    for restored in (decode_snapshot(snapshot), _trusting_its_digest(snapshot)):
        for zxid, raw in log:
            result = apply(restored, zxid, decode_txn(raw))
            assert isinstance(result, AlreadyApplied) == (zxid <= frozen.zxid)
        assert restored.digest() == tree.digest() == restored.recompute_digest()
        assert restored.data_bytes == tree.data_bytes == data_bytes(restored)
        assert encode_tree(restored) == encode_tree(tree)
        assert restored.last_zxid == tree.last_zxid


def _znodes(tree: DataTree) -> dict:
    order = {path: i for i, path in enumerate(tree._nodes)}
    assert all(order[paths.parent_of(p)] < i for p, i in order.items() if p != "/")
    return {path: (tree.get(path), tree.acl(path)) for path in tree._nodes}


def _trusting_its_digest(snapshot: bytes) -> DataTree:
    decoder = SnapshotDecoder(verify_digest=False)
    decoder.feed(snapshot)
    return decoder.finish()


@settings(MODEL, max_examples=max(EXAMPLES // 3, 40))
@given(st.lists(client_ops, min_size=10, max_size=60), st.lists(st.one_of(create_op, delete_op, set_op,
       st.tuples(st.just("set_acl"), index, index, version_choice)), min_size=1, max_size=8))
def test_rollback_restores_the_tree_exactly(history, attempt):
    """A half-applied multi on the leader's view: every change since the savepoint is undone."""
    model, tree, _, _, _ = run(history, snapshot_at=-1)
    before, digest = encode_tree(tree), tree.digest()
    ephemerals = {s: tree.ephemerals(s) for s in tree.sessions()}
    frozen = FrozenTree.of(tree)
    savepoint = tree.savepoint()
    zxid = tree.last_zxid + 1
    for op in attempt:
        try:
            body = prep_one(model, op)
        except errors.ZooKeeperError:
            continue
        model.apply(zxid, 0, body)
        apply_op = {Create: lambda b: tree.create(b.path, b.data, b.acl, b.ephemeral_owner, b.parent_cversion,
                                                  zxid, 0),
                    Delete: lambda b: tree.delete(b.path, zxid),
                    SetData: lambda b: tree.set_data(b.path, b.data, b.version, zxid, 0),
                    SetACL: lambda b: tree.set_acl(b.path, b.acl, b.version)}[type(body)]
        apply_op(body)
    tree.rollback(savepoint)
    # The same znodes, not necessarily in the same order: a deleted znode restored goes last, still
    # after its parent (the view a rollback happens in is never snapshotted).
    assert _znodes(tree) == _znodes(decode_snapshot(before)) and before == frozen.to_bytes()
    assert tree.digest() == digest == tree.recompute_digest()
    assert {s: tree.ephemerals(s) for s in tree.sessions()} == ephemerals
    assert tree.containers() == decode_snapshot(before).containers()
