"""The client-port handlers driven with well-formed requests carrying extreme values
(lengths, counts, ids, negative numbers, huge versions and paths), after decoding:
the edge guard, the leader's preparation, apply on every node, the read handlers
and the reply encoder. Nothing but a declared refusal may leave them (issue 17)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metastore.core import cluster_secret as CS
from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.core.acl import ACL, OPEN_ACL_UNSAFE, SUPER_ID, Id, Perm, fixup_acl
from metastore.edge.edge_guard import MAX_AUTH_IDS, ClientLimits, ClientRefused, check_auth, check_connect, check_reply
from metastore.errors import BadArguments, NoAuth
from metastore.wire.jute_defs import Err, OpCode
from metastore.core.responses import READ_OPS, read_reply, write_reply
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import Error, ErrorResult, MultiResult
from zab.core import zxid as Z
from zab.core.statemachine import Refusal

I32 = st.sampled_from([-(1 << 31), -2, -1, 0, 1, (1 << 31) - 1]) | st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.sampled_from([-(1 << 63), -1, 0, 1, (1 << 40), (1 << 63) - 1]) | st.integers(-(1 << 63), (1 << 63) - 1)
U64 = st.sampled_from([0, 1, (1 << 63), (1 << 64) - 1, 0xFF00_0000_0000_0001]) | st.integers(0, (1 << 64) - 1)
PATHS = st.sampled_from(["/", "/a", "/a/b", "/zookeeper", "/zookeeper/config", "/zookeeper/config/x",
                         CS.SECRET_PATH, CS.SECRET_PATH + "/x", "/zookeeper/quota", "/" + "p" * 70_000,
                         "/a/" + "\u00fc" * 3000, "", "a", "/a/"]) | st.text(max_size=30).map(lambda t: "/" + t)
DATA = st.none() | st.binary(max_size=8) | st.sampled_from([b"d" * 70_000, b"e" * ((1 << 20) + 1)])
IDS = st.sampled_from([("world", "anyone"), ("auth", ""), ("digest", "u:x"), ("super", ""), ("ip", "127.0.0.1"),
                       ("digest", "u" * 5000 + ":x"), ("x509", "CN=a")])
ACLS = st.lists(st.builds(lambda p, i: ACL(p, Id(*i)), I32, IDS), max_size=4).map(tuple) | st.just(
    tuple(ACL(31, Id("digest", f"u{i}:x")) for i in range(300)))
CREATE = st.builds(jute.CreateRequest, PATHS, DATA, ACLS, I32)
WRITES = st.one_of(
    st.tuples(st.sampled_from([OpCode.CREATE, OpCode.CREATE2, OpCode.CREATE_CONTAINER]), CREATE),
    st.tuples(st.just(OpCode.CREATE_TTL), st.builds(jute.CreateTTLRequest, PATHS, DATA, ACLS, I32, I64)),
    st.tuples(st.just(OpCode.DELETE), st.builds(jute.DeleteRequest, PATHS, I32)),
    st.tuples(st.just(OpCode.SET_DATA), st.builds(jute.SetDataRequest, PATHS, DATA, I32)),
    st.tuples(st.just(OpCode.SET_ACL), st.builds(jute.SetACLRequest, PATHS, ACLS, I32)),
    st.tuples(st.just(OpCode.CHECK), st.builds(jute.CheckVersionRequest, PATHS, I32)),
)
MULTI_OPS = st.one_of(st.tuples(st.just(OpCode.CREATE), CREATE),
                      st.tuples(st.just(OpCode.SET_DATA), st.builds(jute.SetDataRequest, PATHS, DATA, I32)),
                      st.tuples(st.just(OpCode.CHECK), st.builds(jute.CheckVersionRequest, PATHS, I32)),
                      st.tuples(st.just(OpCode.DELETE), st.builds(jute.DeleteRequest, PATHS, I32)))
REQUESTS = WRITES | st.tuples(st.just(OpCode.MULTI), st.lists(MULTI_OPS, max_size=40).map(
    lambda ops: jute.MultiRequest(tuple(ops))))
AUTHS = st.lists(IDS, max_size=3).map(tuple)
READS = st.one_of(
    st.tuples(st.just(OpCode.EXISTS), st.builds(jute.ExistsRequest, PATHS, st.booleans())),
    st.tuples(st.just(OpCode.GET_DATA), st.builds(jute.GetDataRequest, PATHS, st.booleans())),
    st.tuples(st.just(OpCode.GET_CHILDREN), st.builds(jute.GetChildrenRequest, PATHS, st.booleans())),
    st.tuples(st.just(OpCode.GET_CHILDREN2), st.builds(jute.GetChildren2Request, PATHS, st.booleans())),
    st.tuples(st.just(OpCode.GET_ACL), st.builds(jute.GetACLRequest, PATHS)),
    st.tuples(st.just(OpCode.GET_EPHEMERALS), st.builds(jute.GetEphemeralsRequest, PATHS)),
    st.tuples(st.just(OpCode.GET_ALL_CHILDREN_NUMBER), st.builds(jute.GetAllChildrenNumberRequest, PATHS)),
    st.tuples(st.just(OpCode.WHO_AM_I), st.none()),
    st.tuples(st.just(OpCode.CHECK), st.builds(jute.CheckVersionRequest, PATHS, I32)),  # standalone: a read
)
READS = READS | st.tuples(st.just(OpCode.MULTI_READ), st.lists(
    READS.filter(lambda r: r[0] in (OpCode.GET_DATA, OpCode.GET_CHILDREN)),  # what multiRead decodes
    max_size=50).map(lambda ops: jute.MultiRequest(tuple(ops))))
SECRET = bytes(range(32))


def cluster_with_secret() -> MetastoreStateMachine:
    """A leader's state machine after the first leader committed the cluster secret."""
    sm = MetastoreStateMachine()
    prepared = sm.prepare(Z.make(1, 1), 0, E.encode_envelope(E.Envelope(E.INIT_SECRET, 0, 1, (), SECRET)))
    assert not isinstance(prepared, Refusal)
    sm.apply(Z.make(1, 1), prepared)
    return sm


def run(sm: MetastoreStateMachine, zxid: int, session: int, auth, opcode, body, *, origin: int = 1):
    """Prepare on the leader and apply as every node does; the client's answer."""
    env = E.Envelope(E.CLIENT, origin, 1_000, auth, jute.encode_request(jute.RequestHeader(1, opcode), body))
    prepared = sm.prepare(zxid, session, E.encode_envelope(env))
    if isinstance(prepared, Refusal):
        return sm.refused(sm.last_zxid, prepared.data)
    return sm.apply(zxid, prepared)


# -- hypothesis: prepare, apply, reply ------------------------------------------------------------
@settings(derandomize=True, database=None, max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(U64, AUTHS, REQUESTS), max_size=8))
def test_extreme_writes_are_prepared_applied_and_answered_without_exception(steps):
    sm = cluster_with_secret()
    counter = 2
    for session, auth, (opcode, body) in steps:
        applied = run(sm, Z.make(1, counter), session, auth, opcode, body)
        if not isinstance(applied.result, ErrorResult):
            counter += 1
        reply = write_reply(opcode, applied.result, body)
        jute.encode_reply(jute.ReplyHeader(1, applied.zxid, reply.err), reply.body if reply.err == 0 else None)
    assert sm.tree.digest() == sm.tree.recompute_digest()
    assert CS.read_secret(sm.tree) == SECRET, "a client request changed the cluster secret"


@settings(derandomize=True, database=None, max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(U64, AUTHS, READS)
def test_extreme_reads_are_answered_without_exception(session, auth, read):
    sm = cluster_with_secret()
    run(sm, Z.make(1, 2), 0, (), OpCode.CREATE, jute.CreateRequest("/a", b"x", OPEN_ACL_UNSAFE, 0))
    opcode, body = read
    assert opcode in READ_OPS
    reply = read_reply(sm.tree, opcode, body, session, [Id(s, i) for s, i in auth])
    payload = jute.encode_reply(jute.ReplyHeader(7, sm.last_zxid, reply.err), reply.body if reply.err == 0 else None)
    try:
        check_reply(payload, ClientLimits())
    except ClientRefused as e:
        assert e.code == Err.MARSHALLING_ERROR and not e.close
    if opcode == OpCode.GET_DATA and body.path == CS.SECRET_PATH:
        assert reply.err == NoAuth.code, "a client read the cluster secret"


@settings(derandomize=True, database=None, max_examples=500, deadline=None)
@given(I64, I64, I32, st.binary(max_size=40) | st.none())
def test_the_connect_guard_passes_only_ids_the_peer_protocol_can_carry(session_id, last_zxid, timeout, passwd):
    req = jute.ConnectRequest(0, last_zxid, timeout, session_id, passwd, False)
    try:
        check_connect(req)
    except ClientRefused as e:
        assert e.code == Err.SESSION_EXPIRED and e.close
        return
    struct.pack(">QQ", session_id, 1)  # Zab's REQUEST and SYNCREQUEST
    assert session_id == 0 or len(passwd) == 16


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=10), st.text(max_size=70_000) | st.text(max_size=8)), max_size=80))
def test_the_auth_guard_keeps_every_envelope_encodable(ids):
    held = [Id("ip", "127.0.0.1")]
    for scheme, ident in ids:
        try:
            check_auth(held, Id(scheme, ident))
        except ClientRefused as e:
            assert e.code == Err.AUTH_FAILED
            break
        held.append(Id(scheme, ident))
    assert len(held) <= MAX_AUTH_IDS + 1
    E.decode_envelope(E.encode_envelope(E.Envelope(E.CLIENT, 1, 0, tuple((i.scheme, i.id) for i in held), b"")))


# -- the stories the fuzzing stands behind ---------------------------------------------------------
def test_a_forged_super_identity_in_an_envelope_is_ignored():
    """Before issue 17 an envelope saying ("super", "") passed every ACL: anyone who could
    reach the peer port could write anything."""
    sm = cluster_with_secret()
    locked = (ACL(Perm.ALL, Id("digest", "owner:x")),)
    run(sm, Z.make(1, 2), 0, (("digest", "owner:x"),), OpCode.CREATE, jute.CreateRequest("/locked", b"", locked, 0))
    forged = run(sm, Z.make(1, 3), 0, (("super", ""),), OpCode.SET_DATA, jute.SetDataRequest("/locked", b"!", -1))
    assert isinstance(forged.result, ErrorResult) and forged.result.code == NoAuth.code
    granted = (("super", CS.super_token(SECRET)),)  # what the origin node sends for a super it granted
    ok = run(sm, Z.make(1, 3), 0, granted, OpCode.SET_DATA, jute.SetDataRequest("/locked", b"!", -1))
    assert not isinstance(ok.result, ErrorResult) and sm.tree.get("/locked")[0] == b"!"


@pytest.mark.parametrize("opcode,body", [
    (OpCode.SET_DATA, jute.SetDataRequest("/zookeeper/config", b"server.1=evil", -1)),
    (OpCode.SET_ACL, jute.SetACLRequest("/zookeeper/config", OPEN_ACL_UNSAFE, -1)),
    (OpCode.CREATE, jute.CreateRequest("/zookeeper/config/x", b"", OPEN_ACL_UNSAFE, 0)),
    (OpCode.SET_DATA, jute.SetDataRequest(CS.SECRET_PATH, b"0" * 32, -1)),
    (OpCode.SET_ACL, jute.SetACLRequest(CS.SECRET_PATH, OPEN_ACL_UNSAFE, -1)),
    (OpCode.DELETE, jute.DeleteRequest(CS.SECRET_PATH, -1)),
    (OpCode.CREATE, jute.CreateRequest(CS.SECRET_PATH + "/x", b"", OPEN_ACL_UNSAFE, 0)),
], ids=["setData-config", "setACL-config", "create-under-config", "setData-secret", "setACL-secret",
        "delete-secret", "create-under-secret"])
def test_a_super_write_to_the_nodes_own_znodes_is_refused_not_a_crash(opcode, body):
    """setData on /zookeeper/config by super passed the leader's checks and then failed
    its own apply (TxnConflict: the leader crashed)."""
    sm = cluster_with_secret()
    applied = run(sm, Z.make(1, 2), 0, (("super", CS.super_token(SECRET)),), opcode, body)
    assert isinstance(applied.result, ErrorResult) and applied.result.code == BadArguments.code
    assert CS.read_secret(sm.tree) == SECRET


def test_a_request_no_client_frame_can_hold_is_refused():
    """A 20 MB multi cannot come from the client port (jute.maxbuffer): one that comes
    anyway was forged on the peer port, and must not become a transaction."""
    sm = cluster_with_secret()
    ops = tuple((OpCode.CREATE, jute.CreateRequest(f"/m{i}", b"z" * 1_000_000, OPEN_ACL_UNSAFE, 0))
                for i in range(20))
    applied = run(sm, Z.make(1, 2), 0, (), OpCode.MULTI, jute.MultiRequest(ops))
    assert isinstance(applied.txn.body, Error) and applied.txn.body.code == BadArguments.code
    assert sm.tree.node("/m0") is None


def test_a_multi_whose_auth_acls_expand_past_the_limit_is_refused():
    """"auth" ACLs expand to every id of the session: a small request can ask for a large
    transaction; past twice the request limit it is refused."""
    sm = cluster_with_secret()
    auth = tuple(("digest", f"{'u' * 4000}{i}:x") for i in range(60))
    ops = tuple((OpCode.CREATE, jute.CreateRequest(f"/e{i}", b"", (ACL(31, Id("auth", "")),), 0)) for i in range(20))
    applied = run(sm, Z.make(1, 2), 0, auth, OpCode.MULTI, jute.MultiRequest(ops))
    assert isinstance(applied.result, MultiResult) and applied.result.code == BadArguments.code


def test_the_cluster_secret_is_committed_once():
    sm = cluster_with_secret()
    again = sm.prepare(Z.make(1, 2), 0, E.encode_envelope(E.Envelope(E.INIT_SECRET, 0, 1, (), b"\0" * 32)))
    assert isinstance(again, Refusal) and CS.read_secret(sm.tree) == SECRET
    node = sm.tree.node(CS.SECRET_PATH)
    reply = read_reply(sm.tree, OpCode.GET_DATA, jute.GetDataRequest(CS.SECRET_PATH, False), 1,
                       [Id("ip", "127.0.0.1"), Id("digest", "quire-internal:x")])
    assert reply.err == NoAuth.code and node.acl == CS.secret_acl(SECRET)


def test_not_even_super_reads_the_cluster_secret():
    """super passes every ACL; the secret its session passwords and super tokens derive from
    is refused to it all the same, alone or inside a multiRead (found by the fuzz above)."""
    sm = cluster_with_secret()
    get = jute.GetDataRequest(CS.SECRET_PATH, False)
    assert read_reply(sm.tree, OpCode.GET_DATA, get, 1, [SUPER_ID]).err == NoAuth.code
    multi = read_reply(sm.tree, OpCode.MULTI_READ, jute.MultiRequest(((OpCode.GET_DATA, get),)), 1, [SUPER_ID])
    assert [r.err for r in multi.body.results] == [NoAuth.code]


def test_the_old_shipped_session_secret_is_refused_at_start(tmp_path):
    from clusterd import config as cfg
    text = (Path(__file__).resolve().parent.parent / "cluster.toml").read_text()
    path = tmp_path / "cluster.toml"
    path.write_text(text.replace("[cluster]\n", '[cluster]\nsession_secret = "quire-change-me"\n', 1))
    with pytest.raises(cfg.ConfigError, match="shipped default"):
        cfg.load(path)
    path.write_text(text)
    assert cfg.load(path).session_secret == ""


def test_a_create_with_a_40000_entry_acl_costs_linear_time():
    """A 1 MB create can carry 40,000 ACL entries; removing duplicates with a list scan
    held the leader's event loop for 160 s (quadratic), long enough to lose its quorum.
    Counted in comparisons, not seconds."""
    calls = [0]

    class CountingId(Id):
        __slots__ = ()

        def __eq__(self, other):
            calls[0] += 1
            return Id.__eq__(self, other)

        __hash__ = Id.__hash__

    acl = tuple(ACL(31, CountingId("ip", f"10.0.{i // 256}.{i % 256}")) for i in range(2000))
    assert len(fixup_acl("/a", acl + acl[:10], [])) == 2000
    assert calls[0] < 20_000, f"{calls[0]} comparisons to deduplicate 2,010 entries"


def test_a_multi_read_of_a_large_znode_many_times_is_refused_before_it_is_built():
    """One 1 MB multiRead can name a 1 MB znode 60,000 times: a 60 GB reply, built in
    memory before any size check (the node was killed for lack of memory)."""
    sm = cluster_with_secret()
    run(sm, Z.make(1, 2), 0, (), OpCode.CREATE, jute.CreateRequest("/big", b"b" * 1_000_000, OPEN_ACL_UNSAFE, 0))
    ops = tuple((OpCode.GET_DATA, jute.GetDataRequest("/big", False)) for _ in range(100))
    reply = read_reply(sm.tree, OpCode.MULTI_READ, jute.MultiRequest(ops), 1, [])
    assert reply.err == Err.MARSHALLING_ERROR
    small = read_reply(sm.tree, OpCode.MULTI_READ, jute.MultiRequest(ops[:1]), 1, [])
    assert small.err == 0 and small.body.results[0].data == b"b" * 1_000_000
