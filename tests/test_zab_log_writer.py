import collections
import threading

import trio
import trio.testing

from zab.core.actions import LogAppend, LogSync, PersistEpoch, Send
from zab.core.acks import coalesce_acks
from zab.edge.log_writer import LogWriter, send_acks
from zab.core.messages import Ack, AckNewLeader, Ping
from zab.storage.snapshot import SnapshotStore
from zab.core.txn import Txn
from zab.storage.txnlog import TxnLog


def test_only_the_highest_ack_per_peer_survives_a_group_commit_and_order_is_kept():
    actions = [Send(3, Ack(1)), Send(1, Ack(1)), PersistEpoch(current=2), Send(3, AckNewLeader(2)),
               Send(3, Ack(2)), Send(1, Ack(2)), Send(3, Ack(3)), Send(2, Ping())]
    assert coalesce_acks(actions) == [PersistEpoch(current=2), Send(3, AckNewLeader(2)), Send(1, Ack(2)),
                                      Send(3, Ack(3)), Send(2, Ping())]


def test_nothing_to_coalesce_is_returned_as_is():
    actions = [Send(3, Ack(1)), Send(1, Ack(1))]
    assert coalesce_acks(actions) is actions


def test_only_ack_only_batches_may_be_sent_from_the_writers_thread():
    assert send_acks([Send(1, Ack(5))])
    assert send_acks([Send(1, Ack(5)), Send(2, Ack(5))])
    assert not send_acks([Send(1, AckNewLeader(2))])  # synchronization: the trio thread sends it, in order
    assert not send_acks([Send(1, Ack(5)), PersistEpoch(current=2)])


def test_what_a_finished_fsync_released_can_be_taken_before_its_wake_up_and_is_run_once(tmp_path):
    """LogWriter.take_done: the driver takes a batch's released actions as soon as the fsync is done,
    before the run_sync_soon wake-up; that wake-up then finds nothing left and calls on_done no more."""
    on_done_calls = []
    finished, woken = threading.Event(), trio.Event()

    class Signalled(collections.deque):  # the writer's queue of releases, telling us when one is put
        def append(self, then) -> None:  # noqa: ANN001
            super().append(then)
            finished.set()

    async def main() -> None:
        def on_done() -> None:
            on_done_calls.append(writer.take_done())
            woken.set()

        log = TxnLog.open(tmp_path / "log")
        writer = LogWriter(log, SnapshotStore(tmp_path / "snap"), snapshots_retained=2, on_done=on_done)
        writer._done = Signalled()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            for zxid in (1, 2):
                writer.submit(LogAppend((Txn(zxid=zxid, session_id=1, cxid=zxid, data=b"x"),)))
                writer.submit(LogSync(then=(Send(1, Ack(zxid)),)))
                writer.flush()
                assert finished.wait(10)  # the event loop is held meanwhile: the wake-up cannot run
                finished.clear()
                assert writer.take_done() == [[Send(1, Ack(zxid))]]
                assert writer.take_done() == []
                await trio.testing.wait_all_tasks_blocked()  # the wake-up ran and found nothing
            assert on_done_calls == [] and [t.zxid for t in log.read_after(0)] == [1, 2]
            writer.submit(LogAppend((Txn(zxid=3, session_id=1, cxid=3, data=b"x"),)))
            writer.submit(LogSync(then=(Send(1, Ack(3)),)))
            writer.flush()
            with trio.fail_after(10):
                await woken.wait()  # not taken early: the wake-up hands it over
            assert on_done_calls == [[[Send(1, Ack(3))]]]
            nursery.cancel_scope.cancel()
        log.close()

    trio.run(main)


def test_a_flush_after_the_writer_stopped_writes_to_no_descriptor(tmp_path):
    """A step still running in another task while a node stops may flush after run() closed the
    wake-up pipe: that raised OSError (EBADF), or wrote into whatever file reused the number."""
    async def main() -> None:
        log = TxnLog.open(tmp_path / "log")
        writer = LogWriter(log, SnapshotStore(tmp_path / "snap"), snapshots_retained=2, on_done=lambda: None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        writer.submit(LogAppend((Txn(zxid=1, session_id=1, cxid=1, data=b"x"),)))
        writer.flush()
        log.close()

    trio.run(main)
