"""Waiters are keyed by a request identity unique across nodes (issue 17, "Waiters").

A client session moves between nodes; each node numbers its requests with a counter of
its own, so the same (session, cxid) can be in flight on two nodes at once. Every node
delivers every transaction, and a driver that keyed its waiters by (session, cxid) gave
one node's client the answer to the other node's request (or, for a `sync`, a write's
result where a zxid was expected: an AssertionError in the node). Three PeerDrivers in
one process over real loopback TCP (tests/test_zab_transport.py's Ensemble); this failed
before the driver stamped each request with its node's id."""

from __future__ import annotations

from pathlib import Path

import trio

from sim.cluster import create_request, set_data_request, version_of
from zab_fixtures import Ensemble, run_ensemble

ROUNDS = 30
SESSION = 5 << 56 | 1  # one session, as if it had moved from one follower to the other


def test_the_same_session_and_cxid_on_two_nodes_get_their_own_answers(tmp_path: Path) -> None:
    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.wait_until("every node in broadcast", ens.all_in_broadcast, 20)
        a, b = [i for i in ens.drivers if i != leader]
        results_a, results_b, syncs = [], [], []
        # Both envelopes name node a as the client's node: the leader's SessionMoved check
        # (tests/test_metastore_prepare.py) would refuse one of the two otherwise, and this
        # story is about the drivers' waiters, which must tell two successful writes apart.
        with trio.fail_after(60):
            for cxid in range(1, ROUNDS + 1):
                write_a = (create_request("a", "1", origin=a) if cxid == 1
                           else set_data_request("a", str(cxid), origin=a))
                pa = await ens.drivers[a].start_submit(SESSION, cxid, write_a)
                pb = await ens.drivers[b].start_submit(SESSION, cxid, create_request(f"b{cxid}", "x", origin=a))
                ps = await ens.drivers[leader].start_sync(SESSION, cxid)
                results_a.append(await pa.result())
                results_b.append(await pb.result())
                syncs.append(await ps.result())
        # Node a wrote one znode over and over (versions 0, 1, ...), node b created a fresh one each time.
        versions_a = [version_of(r) for r in results_a]
        assert versions_a == list(range(ROUNDS)), versions_a
        created_b = [(r.result.path, version_of(r)) for r in results_b]
        assert created_b == [(f"/b{cxid}", 0) for cxid in range(1, ROUNDS + 1)], created_b
        assert all(isinstance(z, int) for z in syncs), syncs

    run_ensemble(tmp_path, story)
