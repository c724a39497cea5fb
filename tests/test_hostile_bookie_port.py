"""Hostile input on the bookie port (issue 17): a real BookieService on loopback, raw sockets.

Each test is one way a client that is slow, silent, greedy or malicious could make a bookie
spend what it should not (CPU, memory, connections, time) or lose what it acknowledged; each
checks the bookie still serves a good client afterwards.
"""

from __future__ import annotations

import trio
import trio.testing

from bookie import protocol as P
from bookie.client import BookieClient
from bookie.entry import Digester, DigestType, master_key
from bookie_fixtures import serving_bookie, trio_test

KEY = master_key(b"secret")
DIGESTER = Digester(DigestType.CRC32C, b"secret")
MIB = 1 << 20


def entry(ledger: int, entry_id: int, payload: bytes | None = None) -> bytes:
    payload = payload if payload is not None else f"entry {entry_id}".encode()
    return DIGESTER.package(ledger, entry_id, entry_id - 1, 100 * (entry_id + 1), payload)


# -- 1. frame assembly is linear in the bytes received ------------------------------------

def test_a_trickled_5_mib_frame_is_assembled_with_linear_copying():
    """Fed 4 KiB at a time, a 5 MiB frame used to be re-copied whole on every read (about 3 GB of
    copying on the shared event loop); now each byte is copied a bounded number of times."""
    frame = P.encode_add(1, 7, 0, KEY, entry(7, 0, b"x" * (5 * MIB - 200)))
    splitter = P.FrameSplitter(6 * MIB)
    bodies = []
    for i in range(0, len(frame), 4096):
        bodies += splitter.feed(frame[i:i + 4096])
    assert len(bodies) == 1 and P.decode_request(bodies[0]).data == entry(7, 0, b"x" * (5 * MIB - 200))
    assert splitter.statistics()["bytes_copied"] <= 3 * len(frame)
    assert splitter.statistics()["pending_bytes"] == 0


def test_frames_split_at_every_boundary_still_come_out_whole_and_in_order():
    frames = [P.encode_add(i, 7, i, KEY, entry(7, i, bytes([i]) * (i * 37))) for i in range(20)]
    stream = b"".join(frames)
    for step in (1, 3, 8, 9, 100, 1000):
        splitter = P.FrameSplitter(1 * MIB)
        bodies = []
        for i in range(0, len(stream), step):
            bodies += splitter.feed(stream[i:i + step])
        assert [P.decode_request(b).entry_id for b in bodies] == list(range(20))
        assert splitter.statistics()["bytes_copied"] <= 3 * len(stream)


@trio_test
async def test_the_bookie_port_assembles_a_trickled_5_mib_add_in_linear_work(tmp_path):
    data = entry(7, 0, b"y" * (5 * MIB - 200))
    frame = P.encode_add(1, 7, 0, KEY, data)
    with trio.fail_after(60):
        async with serving_bookie(tmp_path) as service:
            stream = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with stream:
                for i in range(0, len(frame), 16384):
                    await stream.send_all(frame[i:i + 16384])
                    await trio.testing.wait_all_tasks_blocked()  # the bookie has read it: one read per chunk
                splitter = P.FrameSplitter(1 * MIB)
                answers = []
                while not answers:
                    answers += splitter.feed(await stream.receive_some(1 << 16))
                assert P.decode_response(answers[0]).status is P.Status.OK
            assert service.statistics()["frame_bytes_copied"] <= 3 * len(frame)
            async with BookieClient("127.0.0.1", service.port) as good:
                assert await good.read(7, 0) == data
