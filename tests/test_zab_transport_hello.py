"""HELLO handling of the peer transport (zab/edge/transport.py) over real loopback TCP.

Only the HELLO itself is held to HELLO_MAX_BYTES: a member that sends a large frame right
behind its HELLO (a leader with a SYNCTXNS chunk queued for a follower it reconnects to)
arrives in the same read, and used to be refused as an oversized HELLO, again on every
redial. A HELLO naming a member whose link is up waits for that link instead of
displacing it, and the newest waiter takes the place of an older one."""

from __future__ import annotations

import trio

from clusterd.localcluster import free_ports
from zab.edge import transport
from zab.core.actions import Received
from zab.wire.codec import encode_frame, encode_hello
from zab.core.messages import Ping
from zab.edge.transport import PeerTransport

CLUSTER = "c"


async def started(events: list) -> tuple[PeerTransport, tuple[str, int]]:
    me, other = 1, 2
    ports = dict(zip((me, other), free_ports(2)))  # nobody listens for 2: our dials just back off
    addresses = {i: ("127.0.0.1", p) for i, p in ports.items()}
    t = PeerTransport(CLUSTER, me, addresses, lambda e: events.extend(e if isinstance(e, list) else [e]),
                      max_frame_bytes=1 << 20, send_queue_max=100)
    return t, addresses[me]


async def wait_for(predicate, timeout_s: float = 10) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.01)


def test_a_large_frame_in_the_same_read_as_the_hello_is_taken():
    events: list = []
    big = Ping(tuple(range(2000)))  # 16 KB, above HELLO_MAX_BYTES

    async def main() -> None:
        t, (host, port) = await started(events)
        async with trio.open_nursery() as nursery:
            await nursery.start(t.run)
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(encode_hello(CLUSTER, 2) + encode_frame(big))
            await wait_for(lambda: Received(2, big) in events)
            assert t.stats.bad_frames == 0
            await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_second_hello_waits_for_the_first_link_and_the_newest_waiter_wins(monkeypatch):
    monkeypatch.setattr(transport, "REPLACE_WAIT_S", 30.0)
    events: list = []

    async def main() -> None:
        t, (host, port) = await started(events)
        async with trio.open_nursery() as nursery:
            await nursery.start(t.run)
            first = await trio.open_tcp_stream(host, port)
            await first.send_all(encode_hello(CLUSTER, 2) + encode_frame(Ping((1,))))
            await wait_for(lambda: Received(2, Ping((1,))) in events)
            second = await trio.open_tcp_stream(host, port)
            await second.send_all(encode_hello(CLUSTER, 2) + encode_frame(Ping((2,))))
            third = await trio.open_tcp_stream(host, port)
            await third.send_all(encode_hello(CLUSTER, 2) + encode_frame(Ping((3,))))
            with trio.fail_after(10):
                assert await second.receive_some(10) == b""  # closed: the third waits in its place
            assert t.stats.links_refused == 1
            assert Received(2, Ping((2,))) not in events and Received(2, Ping((3,))) not in events
            await first.aclose()  # the first link ends: the waiting one takes over, after the loss
            await wait_for(lambda: Received(2, Ping((3,))) in events)
            assert [type(e).__name__ for e in events] == ["Received", "PeerDisconnected", "Received"]
            await third.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_refused_hellos_are_logged_once_per_interval_with_a_count_not_once_each(caplog):
    """A stranger (or a member the others do not know yet) redialing must not fill the log."""
    events: list = []

    async def main() -> None:
        t, (host, port) = await started(events)
        async with trio.open_nursery() as nursery:
            await nursery.start(t.run)
            for i in range(30):
                stream = await trio.open_tcp_stream(host, port)
                await stream.send_all(b"\xff" * 64)  # a frame length beyond HELLO_MAX_BYTES: refused at once
                await wait_for(lambda: t.stats.bad_frames > i)
                await stream.aclose()
            nursery.cancel_scope.cancel()
        assert t.stats.bad_frames == 30

    with caplog.at_level("WARNING", logger="quire.zab.transport"):
        trio.run(main)
    rejected = [r for r in caplog.records if "peer_rejected" in r.getMessage()]
    assert len(rejected) == 1 and "suppressed_since_last=0" in rejected[0].getMessage()
