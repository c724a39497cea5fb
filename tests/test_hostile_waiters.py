"""Waiters are keyed by a request identity unique across nodes (issue 17, "Waiters").

A client session moves between nodes; each node numbers its requests with a counter of
its own, so the same (session, cxid) can be in flight on two nodes at once. Every node
delivers every transaction, and a driver that keyed its waiters by (session, cxid) gave
one node's client the answer to the other node's request (or, for a `sync`, a write's
result where a zxid was expected: an AssertionError in the node). Three PeerDrivers in
one process over real loopback TCP (tests/test_transport.py's Ensemble); this failed
before the driver stamped each request with its node's id."""

from __future__ import annotations

from pathlib import Path

import trio

from test_transport import Ensemble, run_ensemble
from sim.kv_state_machine import decode_result, encode_put

ROUNDS = 30
SESSION = 5 << 56 | 1  # one session, as if it had moved from one follower to the other


def test_the_same_session_and_cxid_on_two_nodes_get_their_own_answers(tmp_path: Path) -> None:
    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.wait_until("every node in broadcast", ens.all_in_broadcast, 20)
        a, b = [i for i in ens.drivers if i != leader]
        versions_a, versions_b, syncs = [], [], []
        with trio.fail_after(60):
            for cxid in range(1, ROUNDS + 1):
                pa = await ens.drivers[a].start_submit(SESSION, cxid, encode_put("a", str(cxid)))
                pb = await ens.drivers[b].start_submit(SESSION, cxid, encode_put(f"b{cxid}", "x"))
                ps = await ens.drivers[leader].start_sync(SESSION, cxid)
                versions_a.append(decode_result(await pa.result())["version"])
                versions_b.append(decode_result(await pb.result())["version"])
                syncs.append(await ps.result())
        # Node a rewrote one key (versions 1, 2, ...), node b wrote a fresh key each time (version 1).
        assert versions_a == list(range(1, ROUNDS + 1)), versions_a
        assert versions_b == [1] * ROUNDS, versions_b
        assert all(isinstance(z, int) for z in syncs), syncs

    run_ensemble(tmp_path, story)
