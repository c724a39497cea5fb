"""Whatever a client sends, the leader's preparation yields a transaction that every
node can apply, or a refusal that changes nothing: prepare never raises, apply never
conflicts, and the leader's view of the future equals the tree once everything is applied."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import Error, ErrorResult, MultiResult
from zab.core import zxid as Z
from zab.core.statemachine import Refusal
from metastore_fixtures import answer


names = st.sampled_from(["a", "b", "c", "zookeeper", "x-", "", ".", "..", "\u0000", "ü"])
paths = st.lists(names, min_size=0, max_size=3).map(lambda parts: "/" + "/".join(parts)) | st.sampled_from(
    ["", "a", "//", "/a/", "/a//b"])
ids = st.sampled_from([("world", "anyone"), ("auth", ""), ("digest", "u:x"), ("digest", "bad"),
                       ("ip", "10.0.0.0/8"), ("ip", "300.1.1.1"), ("nosuch", "x"), ("world", "nobody")])
acls = st.lists(st.builds(lambda p, i: jute.ACL(p, jute.Id(*i)), st.integers(-1, 40), ids), max_size=3).map(tuple)
versions = st.integers(-2, 3)
data = st.binary(max_size=20) | st.none()
create = st.builds(jute.CreateRequest, paths, data, acls, st.integers(-1, 7))
ops = st.one_of(
    st.tuples(st.sampled_from([OpCode.CREATE, OpCode.CREATE2, OpCode.CREATE_CONTAINER]), create),
    st.tuples(st.just(OpCode.CREATE_TTL), st.builds(jute.CreateTTLRequest, paths, data, acls, st.integers(0, 7),
                                                    st.integers(-5, 2**41))),
    st.tuples(st.just(OpCode.DELETE), st.builds(jute.DeleteRequest, paths, versions)),
    st.tuples(st.just(OpCode.SET_DATA), st.builds(jute.SetDataRequest, paths, data, versions)),
    st.tuples(st.just(OpCode.SET_ACL), st.builds(jute.SetACLRequest, paths, acls, versions)),
)
multi_ops = st.one_of(
    st.tuples(st.just(OpCode.CREATE), create),
    st.tuples(st.just(OpCode.DELETE), st.builds(jute.DeleteRequest, paths, versions)),
    st.tuples(st.just(OpCode.SET_DATA), st.builds(jute.SetDataRequest, paths, data, versions)),
    st.tuples(st.just(OpCode.CHECK), st.builds(jute.CheckVersionRequest, paths, versions)),
)
requests = st.one_of(ops, st.tuples(st.just(OpCode.MULTI), st.lists(multi_ops, max_size=4).map(
    lambda o: jute.MultiRequest(tuple(o)))))
sessions = st.sampled_from([0x1_0000_0001, 0x1_0000_0002])
steps = st.lists(st.tuples(st.sampled_from(["request", "open", "close", "garbage", "sweep", "claim"]), sessions, requests,
                           st.sampled_from([(), (("digest", "u:x"),)]), st.booleans()), max_size=25)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_prepared_transactions_always_apply(steps):
    sm = MetastoreStateMachine(max_data_bytes=16)
    pending: list[tuple[int, bytes]] = []
    counter = 0
    for kind, session, (opcode, body), auth, commit_now in steps:
        zxid = Z.make(1, counter + 1)
        if kind == "open":
            env = E.Envelope(E.CREATE_SESSION, 1, counter, (), struct.pack(">i", 5000))
        elif kind == "close":
            env = E.Envelope(E.CLOSE_SESSION, 1, counter, (), b"")
        elif kind == "claim":
            env = E.Envelope(E.CLAIM_SESSION, 1 + counter % 3, counter, (), b"")
        elif kind == "sweep":
            env = E.Envelope(E.DELETE_CONTAINER, 1, counter, (), getattr(body, "path", "/").encode())
        elif kind == "garbage":
            env = E.Envelope(E.CLIENT, 1, counter, auth, jute.encode_request(jute.RequestHeader(1, opcode), body)[:7])
        else:
            env = E.Envelope(E.CLIENT, 1, counter, auth, jute.encode_request(jute.RequestHeader(1, opcode), body))
        before = sm.prep._view().digest()
        prepared = sm.prepare(zxid, session, E.encode_envelope(env))
        if isinstance(prepared, Refusal):  # answered, not proposed: the future did not move
            assert sm.prep._view().digest() == before
            result = sm.refused(sm.last_zxid, prepared.data).result
            assert isinstance(result, ErrorResult) or (
                isinstance(result, MultiResult) and all(isinstance(r, ErrorResult) for r in result.results))
        else:
            counter += 1
            pending.append((zxid, prepared))
        if commit_now:  # apply lags prepare by a random amount, as commits lag proposals
            for z, txn in pending:
                applied = sm.apply(z, txn)
                if isinstance(applied.result, MultiResult):
                    assert len(applied.result.results) == len(applied.txn.body.ops)
            pending.clear()
    for z, txn in pending:
        sm.apply(z, txn)
    assert sm.prep._view().digest() == sm.tree.digest()
    assert sm.tree.digest() == sm.tree.recompute_digest()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
          database=None)
@given(steps)
def test_a_request_decoded_by_the_client_port_prepares_exactly_as_its_bytes(steps):
    """ClientRequest.decoded: the leader prepares its own clients' requests from what the client
    port decoded; every transaction and refusal must be the bytes the leader would prepare from
    the request's bytes (as it does for a forwarded one)."""
    from_bytes, from_decoded = MetastoreStateMachine(max_data_bytes=16), MetastoreStateMachine(max_data_bytes=16)
    counter, pending = 0, []
    for kind, session, (opcode, body), auth, commit_now in steps:
        if kind not in ("request", "garbage"):
            continue
        payload = jute.encode_request(jute.RequestHeader(1, opcode), body)
        try:
            header, decoded_body = jute.decode_request(payload)
        except jute.JuteError:
            continue  # the client port closes the connection: never submitted
        zxid = Z.make(1, counter + 1)
        env = E.Envelope(E.CLIENT, 1, counter, auth, payload)
        expected = from_bytes.prepare(zxid, session, E.encode_envelope(env))
        got = from_decoded.prepare(zxid, session, E.encode_envelope(env), (env, header.type, decoded_body))
        assert got == expected
        if not isinstance(expected, Refusal):
            counter += 1
            pending.append((zxid, expected))
        if commit_now:  # every prepared transaction, in order: each was prepared on the ones before it
            for z, txn in pending:
                from_bytes.apply(z, txn)
                from_decoded.apply(z, txn)
            pending.clear()
    assert from_bytes.prep._view().digest() == from_decoded.prep._view().digest()


def test_garbage_is_refused_with_an_error_and_spends_no_zxid():
    sm = MetastoreStateMachine()
    applied = answer(sm, Z.make(1, 1), 1, b"\x07garbage")
    assert isinstance(applied.txn.body, Error) and sm.last_zxid == 0


def test_an_emptied_container_and_an_expired_ttl_node_are_deleted_by_the_leader_sweep():
    sm = MetastoreStateMachine()
    zxids = iter(Z.make(1, c) for c in range(1, 100))

    def run(env: E.Envelope):
        z = next(zxids)
        return answer(sm, z, 0, E.encode_envelope(env))

    def client(opcode, body, time_ms=1_000):
        return run(E.Envelope(E.CLIENT, 1, time_ms, (), jute.encode_request(jute.RequestHeader(1, opcode), body)))

    open_acl = (jute.ACL(31, jute.Id("world", "anyone")),)
    client(OpCode.CREATE_CONTAINER, jute.CreateRequest("/box", b"", open_acl, 4))
    client(OpCode.CREATE_TTL, jute.CreateTTLRequest("/ttl", b"", open_acl, 5, 500))
    assert sm.tree.container_candidates(1_100) == []  # a container that never had a child stays
    client(OpCode.CREATE, jute.CreateRequest("/box/item", b"", open_acl, 0))
    client(OpCode.DELETE, jute.DeleteRequest("/box/item", -1))
    assert sm.tree.container_candidates(1_200) == ["/box"]
    assert sm.tree.container_candidates(2_000) == ["/box", "/ttl"]
    for path in sm.tree.container_candidates(2_000):
        run(E.Envelope(E.DELETE_CONTAINER, 1, 2_000, (), path.encode()))
    assert "/box" not in sm.tree and "/ttl" not in sm.tree
    # a sweep racing a new child is refused, not applied
    client(OpCode.CREATE_CONTAINER, jute.CreateRequest("/box2", b"", open_acl, 4))
    client(OpCode.CREATE, jute.CreateRequest("/box2/kid", b"", open_acl, 0))
    applied = run(E.Envelope(E.DELETE_CONTAINER, 1, 3_000, (), b"/box2"))
    assert isinstance(applied.txn.body, Error) and "/box2/kid" in sm.tree


def test_a_session_that_moved_to_another_node_is_refused_from_the_old_one():
    sm = MetastoreStateMachine()
    zxids = iter(Z.make(1, c) for c in range(1, 100))
    session = 0x1_0000_0001

    def run(origin: int, kind: int, payload: bytes = b""):
        z = next(zxids)
        return answer(sm, z, session, E.encode_envelope(E.Envelope(kind, origin, 1, (), payload)))

    def set_data(origin: int):
        body = jute.encode_request(jute.RequestHeader(1, OpCode.CREATE), jute.CreateRequest(
            f"/n{origin}-{next(zxids)}", b"", (jute.ACL(31, jute.Id("world", "anyone")),), 0))
        return run(origin, E.CLIENT, body)

    run(1, E.CREATE_SESSION, struct.pack(">i", 5000))
    assert not isinstance(set_data(1).txn.body, Error)
    run(2, E.CLAIM_SESSION)  # the client reconnected to node 2
    moved = set_data(1)
    assert isinstance(moved.txn.body, Error) and moved.txn.body.code == -118  # SessionMoved
    assert not isinstance(set_data(2).txn.body, Error)
    # the leader's own housekeeping may close it whoever owns it
    assert run(0, E.CLOSE_SESSION).result.session_id == session
