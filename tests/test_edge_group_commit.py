"""edge/group_commit.py's writer, with its real thread and real files: what queued during one
write shares the next write's fsync, outcomes come back in the order written, and after a failed
write nothing more is written while every submission learns the error."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from edge.group_commit import GroupCommitWriter, Written

GUARD_S = 10


class Journal:
    """A real append-only file: each write appends its items, one line each, and fsyncs once.
    `gate`, when set, holds a write inside the writer's thread until the test opens it; an item
    in `poison` makes the write fail like a disk error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.fsyncs = 0
        self.threads: set[str] = set()
        self.entered = threading.Event()
        self.gate: threading.Event | None = None
        self.poison: set[str] = set()

    def write(self, items: list[str]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(GUARD_S)
        if self.poison.intersection(items):
            raise OSError(5, "Input/output error")
        os.write(self.fd, b"".join(f"{item}\n".encode() for item in items))
        os.fsync(self.fd)
        self.fsyncs += 1
        return [item.upper() for item in items]

    def lines(self) -> list[str]:
        return self.path.read_text().split()

    def close(self) -> None:
        os.close(self.fd)


def run_writer(tmp_path: Path, story, **options) -> Journal:
    """Run `story(writer, journal, handed_back)` in trio; handed_back collects every Written the
    writer's wake-ups take, in order. The writer is closed (its thread joined) afterwards."""
    journal = Journal(tmp_path / "journal")
    handed_back: list[Written] = []
    arrived = trio.Event()

    async def main() -> None:
        nonlocal arrived

        def on_done() -> None:
            handed_back.extend(writer.take_done())
            arrived.set()

        async def wait_for(count: int) -> None:
            nonlocal arrived
            with trio.fail_after(GUARD_S):
                while len(handed_back) < count:
                    await arrived.wait()
                    arrived = trio.Event()

        writer = GroupCommitWriter(journal.write, on_done=on_done, name="test-writer", **options)
        try:
            await story(writer, journal, handed_back, wait_for)
        finally:
            writer.close()
            with trio.fail_after(GUARD_S):
                await writer.wait_closed()

    try:
        trio.run(main)
    finally:
        journal.close()
    return journal


def test_what_queues_during_a_write_shares_the_next_fsync_and_comes_back_in_order(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        journal.gate = threading.Event()
        writer.submit(["a"])
        assert journal.entered.wait(GUARD_S)  # the writer's thread is inside the first write
        for item in ("b", "c", "d"):  # three producers while the disk is busy
            writer.submit([item])
        assert writer.queued == 4
        journal.gate.set()
        await wait_for(2)
        assert [w.items for w in handed_back] == [["a"], ["b", "c", "d"]]
        assert [w.value for w in handed_back] == [["A"], ["B", "C", "D"]]
        assert all(w.error is None for w in handed_back)
        assert writer.queued == 0 and writer.writes == 2

    journal = run_writer(tmp_path, story)
    assert journal.fsyncs == 2  # four submissions, two fsyncs
    assert journal.lines() == ["a", "b", "c", "d"]
    assert journal.threads == {"test-writer"}  # never on the event loop


def test_many_submissions_come_back_in_submission_order(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        expected = [f"x{n}" for n in range(200)]
        for item in expected:
            writer.submit([item])
            if int(item[1:]) % 7 == 0:
                await trio.sleep(0)  # let some writes start between submissions
        with trio.fail_after(GUARD_S):
            while sum(len(w.items) for w in handed_back) < len(expected):
                await wait_for(len(handed_back) + 1)
        assert [item for w in handed_back for item in w.items] == expected

    journal = run_writer(tmp_path, story)
    assert journal.lines() == [f"x{n}" for n in range(200)]


def test_after_sync_runs_in_the_writers_thread_and_none_wakes_nobody(tmp_path):
    seen: list[tuple[str, list[str]]] = []

    def after_sync(items: list[str], result: list[str]) -> list[str] | None:
        seen.append((threading.current_thread().name, result))
        return None if items == ["quiet"] else result  # an answer sent from the thread: nothing left

    async def story(writer, journal, handed_back, wait_for) -> None:
        writer.submit(["quiet"])
        writer.submit(["loud"])  # may share the write with "quiet": then both come back
        await wait_for(1)
        await trio.testing.wait_all_tasks_blocked()
        assert handed_back[-1].items[-1] == "loud"
        assert all(w.items != ["quiet"] for w in handed_back)

    journal = run_writer(tmp_path, story, after_sync=after_sync)
    assert {name for name, _ in seen} == {"test-writer"}
    assert journal.lines() == ["quiet", "loud"]


def test_a_failed_write_stops_the_writer_and_every_later_submission_learns_it(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        writer.submit(["before"])
        await wait_for(1)
        journal.gate = threading.Event()
        journal.entered.clear()
        writer.submit(["bad"])
        assert journal.entered.wait(GUARD_S)
        writer.submit(["queued-behind"])  # waits for the next write, which never comes
        journal.poison.add("bad")
        journal.gate.set()
        await wait_for(3)
        writer.submit(["after"])
        await wait_for(4)
        before, bad, behind, after = handed_back
        assert before.error is None and before.value == ["BEFORE"]
        assert isinstance(bad.error, OSError) and bad.items == ["bad"]
        assert behind.items == ["queued-behind"] and after.items == ["after"]
        assert behind.error is bad.error and after.error is bad.error and writer.failed is bad.error
        await writer.wait_room()  # a failed writer never holds a producer back

    journal = run_writer(tmp_path, story)
    assert journal.lines() == ["before"]  # nothing written after the failure
    assert journal.fsyncs == 1


def test_producers_wait_for_room_while_the_queued_bytes_are_at_the_bound(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        journal.gate = threading.Event()
        writer.submit(["a"], nbytes=60)
        writer.submit(["b"], nbytes=60)
        assert writer.queued_bytes == 120
        room = trio.Event()

        async def producer() -> None:
            await writer.wait_room()
            room.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.testing.wait_all_tasks_blocked()
            assert not room.is_set()  # 120 bytes queued against a bound of 100
            journal.gate.set()
            with trio.fail_after(GUARD_S):
                await room.wait()
        assert writer.queued_bytes < 100

    run_writer(tmp_path, story, max_queued_bytes=100)


def test_close_writes_what_was_submitted_and_drops_what_comes_after(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        writer.submit(["kept"])
        writer.close()
        writer.submit(["dropped"])
        with trio.fail_after(GUARD_S):
            await writer.wait_closed()

    journal = run_writer(tmp_path, story)
    assert journal.lines() == ["kept"]


def test_an_idle_writer_lets_its_thread_end_and_the_next_submission_starts_another(tmp_path):
    async def story(writer, journal, handed_back, wait_for) -> None:
        writer.submit(["first"])
        await wait_for(1)
        first = writer._thread
        await trio.to_thread.run_sync(first.join, GUARD_S)  # ends after idle_exit_s without work
        assert not first.is_alive()
        writer.submit(["second"])
        await wait_for(2)
        assert writer._thread is not first
        assert [w.value for w in handed_back] == [["FIRST"], ["SECOND"]]

    journal = run_writer(tmp_path, story, idle_exit_s=0.01)
    assert journal.lines() == ["first", "second"]


@pytest.mark.parametrize("idle_exit_s", [None, 10.0])
def test_a_submission_before_the_loop_yields_is_written_by_one_thread(tmp_path, idle_exit_s):
    async def story(writer, journal, handed_back, wait_for) -> None:
        for n in range(20):
            writer.submit([f"s{n}"])
        with trio.fail_after(GUARD_S):
            while sum(len(w.items) for w in handed_back) < 20:
                await wait_for(len(handed_back) + 1)

    journal = run_writer(tmp_path, story, idle_exit_s=idle_exit_s)
    assert journal.lines() == [f"s{n}" for n in range(20)]
    assert journal.threads == {"test-writer"}
