"""Fuzzing after decoding: well-typed Zab messages with extreme field values, from a peer
that is not a member or not synchronized, into a 3-node simulated ensemble that keeps
taking writes (issue 17).

Every message type of zab/core/messages.py, every field drawn from the edges of its wire type
and beyond (0, -1, 2**32-1, 2**63, 2**64-1, 2**64, ...), is forged to a random node
(sim.cluster.SimCluster.forge) from a stranger's id or from the id of a node that is down,
between ordinary writes. The core may only refuse (ignore, or drop the sender's links
with a Disconnect action): no exception leaves it, every message any node sends still
encodes (the driver would die on a struct.error), and the simulator's invariant oracles
hold throughout. At the end the absent node comes back, the ensemble converges, every
node has the same state and no acknowledged write is lost."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cluster import SimCluster, create_request
from replay.invariants import InvariantViolation
from zab.core import zxid as Z
from zab.core.actions import Action, Delivered, PersistEpoch, RoleChanged, Send
from zab.wire.codec import encode_frame
from zab.core.messages import (Ack, EnsembleInfo, AckEpoch, AckNewLeader, Commit, FollowerInfo, Inform, LeaderInfo, NewLeader,
                          Notification, Ping, Proposal, Refused, Reject, Request, ServerState, Sync, SyncMode,
                          SyncReply, SyncRequest, SyncTxns, UpToDate)
from zab.core.txn import Txn

SETTLE_MS = 20_000
EDGES = (0, 1, 2, 7, -1, -(2**63), 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**62, 2**63 - 1, 2**63,
         2**64 - 2, 2**64 - 1, 2**64)
STRANGERS = (0, 4, 99, 255, -1, 2**64 - 1)
ABSENT = 3  # down for the whole fuzzing: a member id nobody synchronizes

ints = st.one_of(st.sampled_from(EDGES), st.integers(min_value=-(2**70), max_value=2**70),
                 st.integers(min_value=0, max_value=(1 << 32) + 8))
blobs = st.one_of(st.binary(max_size=48), st.builds(create_request, st.sampled_from(("k0", "evil")), st.just("x"),
                                                     origin=st.sampled_from((1, 2, ABSENT))))
txns = st.builds(Txn, ints, ints, ints, blobs)

MESSAGES = st.one_of(
    st.builds(Notification, ints, ints, ints, ints, st.sampled_from(ServerState)),
    st.builds(FollowerInfo, ints, ints, st.booleans(), ints),
    st.builds(LeaderInfo, ints, st.booleans()),
    st.builds(AckEpoch, ints, ints),
    st.builds(Sync, st.sampled_from(SyncMode), ints, st.none() | blobs),
    st.builds(SyncTxns, st.lists(txns, max_size=3).map(tuple)),
    st.builds(NewLeader, ints, ints),
    st.builds(AckNewLeader, ints),
    st.builds(UpToDate, ints),
    st.builds(Proposal, txns),
    st.builds(Ack, ints),
    st.builds(Commit, ints),
    st.builds(Inform, txns),
    st.builds(Request, ints, ints, blobs),
    st.builds(Reject, ints, ints),
    st.builds(Ping, st.lists(ints, max_size=4).map(tuple)),
    st.builds(SyncRequest, ints, ints),
    st.builds(SyncReply, ints, ints, ints),
    st.builds(Refused, ints, ints, ints, blobs),
    st.builds(EnsembleInfo, ints, st.one_of(blobs, st.sampled_from((
        b"server.1=h:1:1:participant", b"server.9=h:1:1:participant\nserver.8=h:2:2:observer",
        b"server.1=h:1:1:observer,server.2=h:2:2:observer")))),
)

# One step of the hostile run: a message forged to both live nodes (sender, message, simulated
# ms to run afterwards), or a fault of the ordinary kind that sends the ensemble back to
# election, where votes, FOLLOWERINFO and LEADERINFO matter most.
FORGERY = st.tuples(st.just("forge"), st.sampled_from(STRANGERS + (ABSENT,)), MESSAGES,
                    st.integers(min_value=0, max_value=60))
FAULT = st.tuples(st.sampled_from(("isolate", "heal")), st.sampled_from((1, 2)))
STEPS = st.lists(st.one_of(*[FORGERY] * 8, FAULT), min_size=20, max_size=60)


class HostileCheckedCluster(SimCluster):
    """The simulator's oracles, and what a hostile peer must never achieve: every message a
    node sends encodes (as the driver does before a socket), no node follows a non-voter,
    no epoch at the limit is persisted, and every delivered transaction is a request of
    one of the simulation's clients (no forged REQUEST was proposed)."""

    def _send(self, node, a: Send) -> None:
        encode_frame(a.msg)
        super()._send(node, a)

    def _execute(self, node, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, RoleChanged) and a.leader is not None and a.leader not in self.voters:
                raise InvariantViolation(f"node {node.id} follows {a.leader}, not a voter")
            if isinstance(a, PersistEpoch) and max(a.accepted or 0, a.current or 0) >= Z.EPOCH_LIMIT - 1:
                raise InvariantViolation(f"node {node.id} persists an epoch at the limit: {a}")
            if isinstance(a, Delivered) and (a.txn.session_id, a.txn.cxid) not in self._submitted:
                raise InvariantViolation(f"node {node.id} delivers {a.txn}, which no client submitted")
        super()._execute(node, actions)

    @property
    def _submitted(self) -> set[tuple[int, int]]:
        return {(op.session_id, op.cxid) for op in self.ops}


@settings(max_examples=80, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(min_value=0, max_value=2**16), steps=STEPS)
def test_forged_messages_from_strangers_and_unsynchronized_peers_never_break_the_core(seed, steps):
    c = HostileCheckedCluster(3, seed=seed)
    c.crash(ABSENT)
    assert c.run_until(lambda: c.in_broadcast(c.alive()), SETTLE_MS), c.describe_failure()
    for i, step in enumerate(steps):
        if step[0] == "forge":
            _, frm, msg, after_ms = step
            c.forge(1, frm, msg)
            c.forge(2, frm, msg)
            c.run(after_ms)
        elif step[0] == "isolate":
            c.partition({step[1]}, set(c.nodes) - {step[1]})
        else:
            c.heal()
        if i % 3 == 0:  # five creates, then setDatas: writes that change existing znodes too
            n = i // 3
            (c.create if n < 5 else c.set_data)(1 + i % 2, f"k{n % 5}", f"v{i}")
    c.heal()
    c.restart(ABSENT)
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    done = [c.create(n, f"after{n}", str(n)) for n in c.alive()]
    assert c.run_until(lambda: all(o.status == "acked" for o in done), SETTLE_MS), c.describe_failure()
    assert c.run_until(c.converged, SETTLE_MS), c.describe_failure()
    c.check_final()
