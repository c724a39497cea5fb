"""Limits in bytes on what Zab holds in memory (issue 17, "Limits count items, not bytes").

The history window, a peer link's send queue and the log writer's queue each had a bound
in items (100,000 transactions, 10,000 frames, none) that large transactions turn into
gigabytes. Each story fills one with large items and checks the bound in bytes; each
failed before the bound existed."""

from __future__ import annotations

import threading
from functools import partial

import trio
import trio.testing

from clusterd.localcluster import free_ports
from sim.cluster import SimCluster
from zab.core.actions import LogAppend, LogSync, PeerDisconnected
from zab.core.history import History, txn_bytes
from zab.edge.log_writer import LogWriter
from zab.core.messages import Proposal
from zab.storage.snapshot import SnapshotStore
from zab.edge.transport import PeerTransport
from zab.core.txn import Txn
from zab.storage.txnlog import TxnLog

BIG = b"x" * 65536


def test_the_history_window_is_bounded_in_bytes_not_only_in_transactions():
    h = History()
    txns = [Txn(i, 0, 0, BIG) for i in range(1, 201)]  # about 13 MiB
    for t in txns:
        h.append(t)
    h.trim(committed_zxid=200, keep=100_000, keep_bytes=1 << 20)
    assert h.bytes <= 1 << 20, h.bytes
    assert h.bytes == sum(map(txn_bytes, h.after(h.base_zxid)))
    assert h.last_zxid == 200 and len(h) == (1 << 20) // txn_bytes(txns[0])
    h.trim(committed_zxid=200, keep=100_000, keep_bytes=1 << 20)  # within the limit: nothing more goes
    assert len(h) == (1 << 20) // txn_bytes(txns[0])


def test_uncommitted_transactions_are_never_trimmed_whatever_their_size():
    h = History()
    for i in range(1, 101):
        h.append(Txn(i, 0, 0, BIG))
    h.trim(committed_zxid=10, keep=100_000, keep_bytes=1 << 16)
    assert h.base_zxid == 10 and len(h) == 90


def test_a_follower_behind_the_byte_window_is_synchronized_by_snapshot():
    c = SimCluster(3, seed=11, sync_window_bytes=200_000)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    leader = c.leader()
    lagging = next(n for n in c.nodes if n != leader)
    c.crash(lagging)
    ops = [c.create(leader, f"k{i}", "v" * 10_000) for i in range(60)]
    assert c.run_until(lambda: all(o.status == "acked" for o in ops), 10_000), c.describe_failure()
    assert c.peer(leader).history.bytes <= 200_000 * 9 // 8
    c.restart(lagging)
    assert c.run_until(c.converged, 10_000), c.describe_failure()
    c.check_final()


def test_a_peer_link_queue_is_bounded_in_bytes():
    me, stuck = 1, 2
    ports = dict(zip((me, stuck), free_ports(2)))
    addresses = {i: ("127.0.0.1", p) for i, p in ports.items()}
    events: list[object] = []
    limit = 1 << 20

    async def never_reads(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async def story() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(trio.serve_tcp, never_reads, ports[stuck], host="127.0.0.1"))
                transport = PeerTransport("c", me, addresses, events.append, max_frame_bytes=1 << 20,
                                          send_queue_max=10_000, send_queue_max_bytes=limit)
                await nursery.start(transport.run)
                while not transport.sending_to(stuck):
                    await trio.sleep(0.01)
                sent = 0
                while PeerDisconnected(stuck) not in events:
                    transport.send(stuck, Proposal(Txn(sent + 1, 0, 0, BIG)))
                    assert transport.queued_bytes(stuck) <= limit, "the send queue grew past its byte bound"
                    sent += 1
                    await trio.sleep(0)
                assert transport.queued(stuck) < 10_000 and transport.stats.overflows >= 1
                nursery.cancel_scope.cancel()

    trio.run(story)


class GatedLog(TxnLog):
    """A real log whose fsync waits until the test opens the gate (a disk that stalls)."""
    gate: threading.Event

    def sync(self) -> None:
        self.gate.wait(30)
        super().sync()


def test_the_log_writer_queue_is_bounded_in_bytes_and_pushes_back(tmp_path):
    limit = 1 << 20

    async def main() -> None:
        log = GatedLog.open(tmp_path / "log")
        log.gate = threading.Event()
        writer = LogWriter(log, SnapshotStore(tmp_path / "snap"), snapshots_retained=2, on_done=lambda: None,
                           max_queued_bytes=limit)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            zxid, waited = 0, False
            while not waited:  # a producer that respects the bound stops at it
                with trio.move_on_after(0.5) as blocked:
                    await writer.wait_room()
                if blocked.cancelled_caught:
                    waited = True
                    break
                zxid += 1
                writer.submit(LogAppend((Txn(zxid, 0, 0, BIG),)))
                writer.submit(LogSync())
                writer.flush()
                assert writer.queued_bytes <= limit + txn_bytes(Txn(zxid, 0, 0, BIG))
            assert writer.queued_bytes >= limit
            log.gate.set()  # the disk moves again: room comes back without further submissions
            with trio.fail_after(10):
                await writer.wait_room()
            assert writer.queued_bytes < limit
            nursery.cancel_scope.cancel()
        log.close()

    trio.run(main)
