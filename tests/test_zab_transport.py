"""Three PeerDrivers in one process over real loopback TCP (zab/edge/transport.py, zab/edge/driver.py).

Story (a): hostile bytes on a node's peer port (garbage, a truncated frame, an
oversized length header, a HELLO of another cluster or of an unknown id, a
valid HELLO followed by a corrupt frame): each such connection is closed and
the ensemble keeps committing. Story (b): writes commit through every node;
one node is stopped, the other two keep committing; the node restarts from its
data directory with a fresh driver and catches up to the same zxid and state.

Every wait is bounded by trio.fail_after. Where the driver offers no event to
wait on (roles, zxids), the test polls driver.status() every few milliseconds.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
import trio

from zab.edge import transport
from zab.wire.codec import encode_frame, encode_hello, frame
from sim.cluster import create_request, error_of, read_key
from zab.errors import NoLeader, OutcomeUnknown
from zab_fixtures import CLUSTER, IDS, MAX_FRAME_BYTES, WRITE_TIMEOUT_S, Ensemble, run_ensemble
from zab.core.messages import Commit, Ping

async def expect_closed(ens: Ensemble, node: int, payload: bytes, *, then_eof: bool = False) -> None:
    """Connect to `node`'s peer port, send `payload`, and expect the node to close the connection."""
    host, port = ens.addresses[node]
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(payload)
        if then_eof:
            await stream.send_eof()
        with trio.fail_after(transport.HELLO_TIMEOUT_S + 5):
            while True:
                try:
                    data = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    return  # reset: closed
                if not data:
                    return  # EOF: closed
                raise AssertionError(f"a peer port answered hostile input with {data!r}")
    finally:
        await stream.aclose()


HOSTILE = {
    "garbage": b"GET / HTTP/1.1\r\nHost: quire\r\n\r\n",
    "zeros": b"\0" * 64,
    "oversized-length": struct.pack(">II", 2**32 - 1, 0) + b"x" * 16,
    "just-over-max": struct.pack(">II", MAX_FRAME_BYTES + 1, 0),
    "bad-crc-hello": struct.pack(">II", 4, 12345) + b"QZAB",
    "wrong-cluster": encode_hello("another-cluster", 2),
    "unknown-id": encode_hello(CLUSTER, 99),
    "own-id": encode_hello(CLUSTER, 1),  # sent to node 1: a node never dials itself
    "hello-bad-magic": frame(b"ZZZZ" + b"\0" * 12),
    "message-instead-of-hello": encode_frame(Ping()),
}


def test_hostile_connections_are_closed_and_the_ensemble_keeps_committing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "HELLO_TIMEOUT_S", 1.0)

    async def story(ens: Ensemble) -> None:
        await ens.wait_leader()
        await ens.put(1, "before", "1")
        async with trio.open_nursery() as n:  # all at once: none may delay the others
            for name, payload in HOSTILE.items():
                n.start_soon(expect_closed, ens, 1, payload)
            # A truncated frame followed by EOF, and one left hanging (closed by the HELLO timeout).
            hello = encode_hello(CLUSTER, 2)
            n.start_soon(lambda: expect_closed(ens, 1, hello[:len(hello) - 3], then_eof=True))
            n.start_soon(expect_closed, ens, 1, hello[:len(hello) - 3])
            n.start_soon(expect_closed, ens, 1, struct.pack(">II", 100, 0) + b"y" * 10)
        # Garbage in every node, then writes through every node.
        for i in IDS:
            await expect_closed(ens, i, HOSTILE["garbage"])
        for i in IDS:
            await ens.put(i, f"after-garbage-{i}", "ok")
        await ens.wait_until("all three converged", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)
        assert sum(d.transport.stats.bad_frames for d in ens.drivers.values()) >= len(HOSTILE)

    run_ensemble(tmp_path, story)


def pick_pair(ens: Ensemble, leader: int, relation: str) -> tuple[int, int]:
    """(target, impersonated): whose peer port gets the fake HELLO, and which member it claims to be."""
    followers = [i for i in IDS if i != leader]
    return {"follower-into-leader": (leader, followers[0]),
            "leader-into-follower": (followers[0], leader),
            "follower-into-follower": (followers[0], followers[1])}[relation]


CORRUPTIONS = {
    "crc-mismatch": lambda good: good[:8] + bytes([good[8] ^ 0xFF]) + good[9:],
    "unknown-type": lambda good: frame(b"\x01\xee"),
    "unknown-version": lambda good: frame(b"\x09\x10"),
    "synctxns-4g": lambda good: frame(b"\x01\x06\xff\xff\xff\xff"),
    "oversized-length": lambda good: struct.pack(">II", 2**31, 0),
    "trailing-bytes": lambda good: frame(b"\x01\x10\x00"),
}


@pytest.mark.parametrize("relation", ["follower-into-leader", "leader-into-follower", "follower-into-follower"])
def test_valid_hello_then_corrupt_frame_is_closed_and_the_ensemble_keeps_committing(tmp_path: Path,
                                                                                     relation: str) -> None:
    """A connection that says HELLO as a real member (a HELLO proves nothing without TLS)
    never displaces that member's live link into the target, and the corrupt frame that
    follows in the same write closes it at once, before it has waited its turn behind that
    link; the ensemble goes on committing."""

    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.put(1, "before", "1")
        target, impersonated = pick_pair(ens, leader, relation)
        good = encode_frame(Ping())
        for corrupt in CORRUPTIONS.values():
            await expect_closed(ens, target, encode_hello(CLUSTER, impersonated) + corrupt(good))
        for i in IDS:
            await ens.put(i, f"after-corrupt-{i}", "ok")
        await ens.wait_until("all three converged", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)

    run_ensemble(tmp_path, story)


def test_a_protocol_violation_from_the_leaders_link_sends_the_follower_back_to_election(tmp_path: Path) -> None:
    """Well-formed bytes, illegal protocol: a COMMIT far beyond the follower's log, on a
    link that says it is the leader. While the leader's own link is up the impostor waits
    its turn (transport.REPLACE_WAIT_S) and is closed with its COMMIT never delivered; a
    violation that does reach the core sends the follower back to election
    (tests/test_hostile_zab_core.py, test_hostile_leader_bytes.py). Either way the
    ensemble keeps committing."""

    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.put(1, "before", "1")
        target, impersonated = pick_pair(ens, leader, "leader-into-follower")
        await expect_closed(ens, target, encode_hello(CLUSTER, impersonated) + encode_frame(Commit(2**60)))
        for i in IDS:
            await ens.put(i, f"after-violation-{i}", "ok")
        await ens.wait_until("all three converged", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)

    run_ensemble(tmp_path, story)


def test_a_link_closed_by_the_remote_end_is_redialed_without_waiting_for_traffic(tmp_path: Path) -> None:
    """Regression: a dialed (send-only) link closed by the remote end used to be noticed
    only on the next send. Followers never send to each other in BROADCAST, so the link
    stayed half-open, and the first messages sent on it later were lost."""

    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        target, impersonated = pick_pair(ens, leader, "follower-into-follower")
        await ens.wait_until("full mesh", lambda: all(
            set(d.status()["peers"]) == set(IDS) - {i} for i, d in ens.drivers.items()), WRITE_TIMEOUT_S)
        await expect_closed(ens, target, encode_hello(CLUSTER, impersonated) + frame(b"\x01\xee"))
        await ens.wait_until(f"node {impersonated} redialing node {target}",
                             lambda: impersonated in ens.drivers[target].status()["peers"], 5)

    run_ensemble(tmp_path, story)


def test_followers_acks_leave_from_the_log_writers_thread_and_writes_commit(tmp_path: Path) -> None:
    """A follower's ACK is written by its log writer's thread right after the fsync (the event
    loop is not woken for it); the leader never sends from that thread (its own ACK is local)."""

    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        for n in range(30):
            await ens.put(IDS[n % 3], f"k{n}", "v")
        followers = [i for i in IDS if i != leader]
        await ens.wait_until("every node to commit the writes", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)
        sent = {i: ens.drivers[i].status()["log"]["acks_sent_from_thread"] for i in IDS}
        assert sent[leader] == 0, sent
        assert all(sent[f] > 0 for f in followers), sent

    run_ensemble(tmp_path, story)


# -- (b) a node stops, the others go on, it restarts and catches up ------------------------------
@pytest.mark.parametrize("victim_role", ["follower", "leader"])
def test_stopped_node_restarts_from_its_data_dir_and_catches_up(tmp_path: Path, victim_role: str) -> None:
    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        for n, i in enumerate(IDS * 3):
            await ens.put(i, f"k{n % 4}", f"round1-{n}")
        await ens.wait_until("all three converged", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)
        before = ens.drivers[1].status()["last_committed_zxid"]

        victim = leader if victim_role == "leader" else next(i for i in IDS if i != leader)
        await ens.stop(victim)
        rest = [i for i in IDS if i != victim]
        await ens.wait_leader()
        for n in range(10):
            await ens.put(rest[n % 2], f"k{n % 4}", f"round2-{n}")
        await ens.wait_until("the two survivors converged", lambda: ens.converged(rest), WRITE_TIMEOUT_S)
        assert ens.drivers[rest[0]].status()["last_committed_zxid"] > before

        await ens.start(victim)  # a fresh driver and state machine on the same data dir
        await ens.wait_until(f"node {victim} caught up", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)
        target = ens.drivers[rest[0]].status()["last_committed_zxid"]
        assert ens.drivers[victim].status()["last_committed_zxid"] == target
        assert read_key(ens.drivers[victim].state_machine, "k1") == read_key(ens.drivers[rest[0]].state_machine, "k1")
        await ens.put(victim, "after-restart", "ok")  # and it takes writes again
        await ens.wait_until("all three converged", lambda: ens.converged(IDS), WRITE_TIMEOUT_S)

    run_ensemble(tmp_path, story)


# -- (c) acknowledged writes survive stops in flight and a whole-ensemble restart -----------------
def test_acknowledged_writes_survive_a_leader_stopped_mid_stream_and_a_full_restart(tmp_path: Path) -> None:
    """Writers on every node keep submitting (one unique key per write). The leader is
    stopped while writes are in flight, the others go on, it returns; then all three
    stop at once, still with writes in flight, and restart from their data directories.
    Every write that was acknowledged must be there, with its value, on every node;
    nothing that nobody wrote may appear."""

    async def story(ens: Ensemble) -> None:
        await ens.wait_leader()
        acked: dict[str, str] = {}
        attempted: set[str] = set()
        stop_writers = trio.Event()

        async def writer(i: int) -> None:
            for n in itertools.count():
                if stop_writers.is_set():
                    return
                driver = ens.drivers.get(i)
                if driver is None or driver.peer is None:
                    await trio.sleep(0.02)
                    continue
                key = f"w{i}-{n}"
                attempted.add(key)
                try:
                    with trio.fail_after(WRITE_TIMEOUT_S):
                        result = await driver.submit(i << 48 | 2, next(ens._cxid), create_request(key, key, origin=i))
                except (NoLeader, OutcomeUnknown):
                    await trio.sleep(0.02)
                    continue
                assert error_of(result) is None, result
                acked[key] = key

        async with trio.open_nursery() as writers:
            for i in IDS:
                writers.start_soon(writer, i)
            await ens.wait_until("writes acknowledged", lambda: len(acked) >= 100, WRITE_TIMEOUT_S)
            leader = await ens.wait_leader()
            await ens.stop(leader)  # mid-stream: requests are in flight
            count = len(acked)
            await ens.wait_until("writes acknowledged without the old leader", lambda: len(acked) >= count + 80,
                                 WRITE_TIMEOUT_S)
            await ens.start(leader)
            count = len(acked)
            await ens.wait_until("writes acknowledged by all three", lambda: len(acked) >= count + 80,
                                 WRITE_TIMEOUT_S)
            for i in IDS:  # the whole ensemble goes down with writes in flight
                ens.scopes[i].cancel()
            for i in IDS:
                await ens.stop(i)
            stop_writers.set()

        for i in IDS:
            await ens.start(i)
        await ens.wait_leader()
        await ens.put(1, "after-full-restart", "ok")  # commits the recovered history everywhere
        await ens.wait_until("all three converged after the full restart", lambda: ens.converged(IDS),
                             WRITE_TIMEOUT_S)
        for i, d in ens.drivers.items():
            lost = [k for k in acked if read_key(d.state_machine, k) != (k, 0)]
            assert not lost, f"node {i} lost acknowledged writes {lost[:10]} ({len(lost)} of {len(acked)})"
            invented = [k for k in d.state_machine.tree.children("/")
                        if k.startswith("w") and k not in attempted]
            assert not invented, f"node {i} has writes nobody made: {invented}"

    run_ensemble(tmp_path, story)


def test_submit_after_the_driver_stopped_fails_instead_of_hanging(tmp_path: Path) -> None:
    async def story(ens: Ensemble) -> None:
        await ens.wait_leader()
        stopped = ens.drivers[1]
        await ens.stop(1)
        with trio.move_on_after(2) as waited:
            with pytest.raises(NoLeader):
                await stopped.submit(1 << 48 | 3, 1, create_request("k", "v", origin=1))
        assert not waited.cancelled_caught, "submit() on a stopped driver still waiting after 2 s"

    run_ensemble(tmp_path, story)
