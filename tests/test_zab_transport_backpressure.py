"""Bounded send queues: a follower that stops reading costs bounded memory, is
disconnected (the core hears PeerDisconnected), and never stalls the others."""

from __future__ import annotations

from functools import partial

import trio

from clusterd.localcluster import free_ports
from zab.core.actions import PeerDisconnected
from zab.wire.codec import FrameDecoder
from zab.core.messages import Proposal
from zab.edge.transport import PeerTransport
from zab.core.txn import Txn

QUEUE_MAX = 8
PAYLOAD = b"x" * 65536


def test_a_follower_that_stops_reading_is_cut_off_and_the_others_keep_receiving():
    me, stuck, healthy = 1, 2, 3
    ports = dict(zip((me, stuck, healthy), free_ports(3)))
    addresses = {i: ("127.0.0.1", p) for i, p in ports.items()}
    events: list[object] = []
    received = {"frames": 0}

    def deliver(event: object) -> None:
        events.append(event)

    async def never_reads(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async def reads_everything(stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await stream.receive_some(1 << 16):
            received["frames"] += len(list(decoder.feed(data)))

    async def story() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(trio.serve_tcp, never_reads, ports[stuck], host="127.0.0.1"))
                await nursery.start(partial(trio.serve_tcp, reads_everything, ports[healthy], host="127.0.0.1"))
                transport = PeerTransport("c", me, addresses, deliver, max_frame_bytes=1 << 20,
                                          send_queue_max=QUEUE_MAX)
                await nursery.start(transport.run)
                while not (transport.sending_to(stuck) and transport.sending_to(healthy)):
                    await trio.sleep(0.01)
                sent = 0
                while PeerDisconnected(stuck) not in events:
                    transport.send(stuck, Proposal(Txn(sent + 1, 0, 0, PAYLOAD)))
                    transport.send(healthy, Proposal(Txn(sent + 1, 0, 0, b"y")))
                    assert transport.queued(stuck) <= QUEUE_MAX, "the send queue grew past its bound"
                    sent += 1
                    await trio.sleep(0)
                assert transport.stats.overflows >= 1
                while received["frames"] < sent:  # every message to the healthy peer arrived
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

    trio.run(story)
    assert PeerDisconnected(healthy) not in events
