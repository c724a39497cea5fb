"""The metastore state machine inside the simulated Zab ensemble: random znode writes
through every node, crashes, restarts, SNAP syncs and local snapshots. At the end
every node's tree digest is equal, and replaying the log from *any* snapshot a node
kept rebuilds exactly that digest."""

from __future__ import annotations

import random
import struct

import pytest

from metastore.wire import envelope as E
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode
from metastore.wire.snapshot_codec import decode_snapshot
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import apply
from metastore.wire.txn_codec import decode_txn
from sim.cluster import SimCluster

OPEN = (jute.ACL(31, jute.Id("world", "anyone")),)
SESSIONS = [0x0001_0000_0000_0001, 0x0002_0000_0000_0001]


def envelope(kind: int, payload: bytes = b"") -> bytes:
    return E.encode_envelope(E.Envelope(kind, 1, 1_000, (), payload))


def request(opcode: int, body) -> bytes:
    return envelope(E.CLIENT, jute.encode_request(jute.RequestHeader(1, opcode), body))


def random_request(rng: random.Random) -> tuple[bytes, int]:
    path = "/" + "/".join(rng.choice("abc") for _ in range(rng.randint(1, 3)))
    session = rng.choice(SESSIONS)
    kind = rng.randrange(7)
    if kind <= 1:
        flags = rng.choice([0, 0, 1, 2, 3])
        return request(OpCode.CREATE, jute.CreateRequest(path, b"d%d" % rng.randrange(9), OPEN, flags)), session
    if kind == 2:
        return request(OpCode.DELETE, jute.DeleteRequest(path, rng.choice([-1, 0]))), session
    if kind == 3:
        return request(OpCode.SET_DATA, jute.SetDataRequest(path, b"s", rng.choice([-1, 0, 1]))), session
    if kind == 4:
        ops = ((OpCode.CREATE, jute.CreateRequest(path + "m", b"", OPEN, 0)),
               (OpCode.CHECK, jute.CheckVersionRequest(path, rng.choice([-1, 0]))))
        return request(OpCode.MULTI, jute.MultiRequest(ops)), session
    if kind == 5:
        return envelope(E.CREATE_SESSION, struct.pack(">i", 5000)), session
    return envelope(E.CLOSE_SESSION), session


def replayed_digest(snapshot: bytes, log, upto: int) -> str:
    tree = decode_snapshot(snapshot)
    for txn in log:
        if tree.last_zxid < txn.zxid <= upto:
            apply(tree, txn.zxid, decode_txn(txn.data))
    assert tree.last_zxid == upto
    return f"{tree.digest():016x}"


@pytest.mark.parametrize("seed", range(6))
def test_metastore_under_crashes_converges_and_replays_from_any_snapshot(seed):
    rng = random.Random(seed)
    c = SimCluster(3, seed=seed, state_machine=MetastoreStateMachine, snapshot_every_txns=15, sync_window_txns=10)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    for session in SESSIONS:
        c.submit(c.leader(), envelope(E.CREATE_SESSION, struct.pack(">i", 5000)), session_id=session)
    for step in range(120):
        alive = c.alive()
        req, session = random_request(rng)
        c.submit(rng.choice(alive), req, session_id=session)
        c.run(rng.randint(0, 15))
        if step % 30 == 17:
            victim = rng.choice(alive)
            c.crash(victim)
            c.run(rng.randint(50, 400))
            c.restart(victim)
    assert c.run_until(c.converged, 20_000), c.describe_failure()
    c.check_final()
    live = {i: c.peer(i).sm for i in c.alive()}
    upto = c.peer(1).last_committed
    for sm in live.values():
        assert sm.tree.digest() == sm.tree.recompute_digest()
    for i, node in c.nodes.items():
        for zxid, snapshot in node.disk.snapshots:
            if zxid <= upto and (not node.disk.log or node.disk.log[0].zxid <= zxid + 1):
                assert replayed_digest(snapshot, node.disk.log, upto) == live[i].digest(), (
                    f"node {i}: replay from snapshot {zxid:#x} differs; seed {seed}")
