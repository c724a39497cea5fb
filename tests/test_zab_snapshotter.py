"""Local snapshots are written beside the log, not in its way (zab/edge/snapshotter.py): on the
real log writer and real files, appends are made durable and released while a snapshot is still
being written; a snapshot that falls due meanwhile is skipped; the purge comes after the file is
durable; a node that stops mid-snapshot leaves no partial file and recovers from its log."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import trio

from metastore.core.state_machine import MetastoreStateMachine
from tests.test_zab_snap_files import SNAPSHOT, ZXID, running_writer
from zab.core import zxid as Z
from zab.core.actions import LogAppend, LogSync, TakeSnapshot
from zab.core.txn import Txn
from zab.storage.recovery import SNAPSHOT_DIR, recover
from zab.storage.snapshot import TMP_SUFFIX, read_snapshot
from zab.storage.storage_errors import DiskWriteFailed

MARK = "appended"


@dataclass
class GatedView:
    """A frozen view whose encoding stops after its first piece until `gate` opens (or the
    snapshotter is told to stop): a snapshot caught in the middle of being written."""

    zxid: int
    body: bytes
    gate: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event | None = None

    def to_bytes(self) -> bytes:
        return self.body

    def chunks(self, chunk_bytes: int) -> Iterator[bytes]:
        yield self.body[:100]
        self.started.set()
        while not self.gate.wait(0.01):
            if self.stopping is not None and self.stopping.is_set():
                break
        yield self.body[100:]


def txn(counter: int) -> Txn:
    return Txn(Z.make(1, 100 + counter), 0, 0, b"t%d" % counter)


def snapshot_files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / SNAPSHOT_DIR).iterdir())


def test_appends_are_durable_and_released_while_a_snapshot_is_being_written(tmp_path):
    view = GatedView(ZXID, SNAPSHOT)

    async def main() -> None:
        async with running_writer(tmp_path) as perform:
            snapshotter = perform.writer.snapshotter
            await perform([TakeSnapshot(view)])
            await trio.to_thread.run_sync(view.started.wait, 10)
            # The snapshot is half written; the log still takes appends and releases what they held.
            released = await perform([LogAppend((txn(1), txn(2))), LogSync(then=(MARK,))])
            assert released == [MARK]
            assert snapshotter.taken == 0 and snapshot_files(tmp_path) == [f"snapshot.{ZXID:016x}{TMP_SUFFIX}"]
            # Another one falls due meanwhile: skipped, not queued behind it.
            await perform([TakeSnapshot(GatedView(Z.make(1, 102), SNAPSHOT))])
            assert snapshotter.skipped == 1
            view.gate.set()
            await snapshotter.wait_taken(1)
            await perform([])  # the purge queued behind the snapshot has run
        assert snapshot_files(tmp_path) == [f"snapshot.{ZXID:016x}"]
        assert read_snapshot(tmp_path / SNAPSHOT_DIR / f"snapshot.{ZXID:016x}") == (ZXID, SNAPSHOT)
        recovered = recover(tmp_path)
        recovered.log.close()
        assert recovered.snapshot_zxid == ZXID and [t.zxid for t in recovered.txns] == [txn(1).zxid, txn(2).zxid]

    trio.run(main)


def test_older_snapshots_are_purged_only_after_a_newer_one_is_durable(tmp_path):
    sm = MetastoreStateMachine()
    sm.restore(ZXID, SNAPSHOT)

    async def main() -> None:
        async with running_writer(tmp_path) as perform:  # keeps 2 snapshots
            snapshotter = perform.writer.snapshotter
            for n, zxid in enumerate((Z.make(1, 10), Z.make(1, 20), Z.make(1, 30)), start=1):
                view = GatedView(zxid, SNAPSHOT)
                await perform([TakeSnapshot(view)])
                await trio.to_thread.run_sync(view.started.wait, 10)
                # Mid-write: nothing older has gone yet.
                assert len([f for f in snapshot_files(tmp_path) if not f.endswith(TMP_SUFFIX)]) == min(n - 1, 2)
                view.gate.set()
                await snapshotter.wait_taken(n)
                await perform([])
            assert snapshot_files(tmp_path) == [f"snapshot.{Z.make(1, 20):016x}", f"snapshot.{Z.make(1, 30):016x}"]

    trio.run(main)


def test_a_node_stopping_mid_snapshot_leaves_no_partial_file_and_recovers_from_its_log(tmp_path):
    view = GatedView(ZXID, SNAPSHOT)

    async def main() -> None:
        async with running_writer(tmp_path) as perform:
            view.stopping = perform.writer.snapshotter._stopping
            await perform([LogAppend((txn(1),)), LogSync(then=(MARK,))])
            await perform([TakeSnapshot(view)])
            await trio.to_thread.run_sync(view.started.wait, 10)
        # The writer stopped with the snapshot half written: its temporary file is gone.
        assert snapshot_files(tmp_path) == []
        recovered = recover(tmp_path)
        recovered.log.close()
        assert recovered.snapshot_zxid == 0
        assert [t.zxid for t in recovered.txns] == [txn(1).zxid]

    trio.run(main)


def test_a_snapshot_the_disk_refuses_stops_the_writer_and_leaves_no_partial_file(tmp_path):
    class Refused:
        zxid = ZXID

        def to_bytes(self) -> bytes:
            return b""

        def chunks(self, chunk_bytes: int) -> Iterator[bytes]:
            yield b"x" * 100
            raise OSError(28, "No space left on device")

    async def main() -> None:
        async with running_writer(tmp_path) as perform:
            await perform([TakeSnapshot(Refused())])
            await trio.sleep_forever()  # ended by the writer's failure: fail-stop, like a log write's

    with pytest.raises(BaseExceptionGroup) as caught:
        trio.run(main)
    assert caught.group_contains(DiskWriteFailed, match="No space left on device")
    assert snapshot_files(tmp_path) == []
