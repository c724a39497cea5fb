"""The log writer's thread writing to a peer link (PeerTransport.send_from_thread) while the trio
thread sends on the same link: two real transports over loopback TCP.

A follower's ACK leaves from the log writer's thread right after its fsync; the event loop sends
everything else on that link. The frames must arrive whole and, per sender, in order, and a
thread write must never slip in while the link has frames queued or in flight.
"""

from __future__ import annotations

import threading

import trio

from clusterd.localcluster import free_ports
from zab.core.actions import PeerDisconnected, Received
from zab.core.messages import Ack, Ping
from zab.edge.transport import PeerTransport

ACKS = 3000
PINGS = 3000


def test_thread_writes_and_event_loop_sends_interleave_as_whole_frames_in_order() -> None:
    addresses = {i: ("127.0.0.1", p) for i, p in zip((1, 2), free_ports(2))}
    received: list[object] = []
    messages = [0]
    all_arrived = trio.Event()

    def deliver(event: object) -> None:
        events = event if isinstance(event, list) else [event]
        received.extend(events)
        messages[0] += sum(isinstance(e, Received) for e in events)
        if messages[0] >= ACKS + PINGS:
            all_arrived.set()

    async def main() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                sender = PeerTransport("t", 1, addresses, lambda e: None, max_frame_bytes=1 << 20,
                                       send_queue_max=100_000)
                receiver = PeerTransport("t", 2, addresses, deliver, max_frame_bytes=1 << 20, send_queue_max=10)
                await nursery.start(sender.run)
                await nursery.start(receiver.run)
                while not sender.sending_to(2):
                    await trio.sleep(0.01)
                token = trio.lowlevel.current_trio_token()
                direct = [0]

                def thread_main() -> None:
                    for z in range(1, ACKS + 1):
                        if sender.send_from_thread(2, Ack(z)):
                            direct[0] += 1
                        else:  # what the log writer does: hand it to the trio thread, in order
                            trio.from_thread.run_sync(sender.send, 2, Ack(z), trio_token=token)

                thread = threading.Thread(target=thread_main)
                thread.start()
                for i in range(PINGS):  # the event loop's own traffic on the same link meanwhile
                    sender.send(2, Ping(), flush=i % 3 == 0)
                    if i % 3 == 0:
                        await trio.sleep(0)
                sender.flush()
                await trio.to_thread.run_sync(thread.join)
                await all_arrived.wait()
                assert direct[0] > 0, "no frame went from the thread: the test does not test the thread path"
                assert sender.stats.thread_frames_sent == direct[0]
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert not [e for e in received if isinstance(e, PeerDisconnected)]
    acks = [e.msg.zxid for e in received if isinstance(e, Received) and isinstance(e.msg, Ack)]
    assert acks == list(range(1, ACKS + 1))
    assert sum(isinstance(e, Received) and isinstance(e.msg, Ping) for e in received) == PINGS
