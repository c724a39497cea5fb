"""PendingAppend.result() (ledger/handles.py): a finished append answers without a scheduler pass,
but still honours cancellation; an unfinished one waits for its outcome."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ledger.errors import LedgerFenced
from ledger.handles import PendingAppend


def test_a_finished_append_answers_without_letting_other_tasks_run() -> None:
    async def main() -> None:
        ran = []
        done = [PendingAppend(i) for i in range(100)]
        for p in done:
            p._finish()
        async def other() -> None:
            ran.append("other")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)  # runs at the next scheduler pass this task takes part in
            assert [await p.result() for p in done] == list(range(100))
            assert ran == []  # collecting 100 finished appends took no pass
            await trio.testing.wait_all_tasks_blocked()  # now let it run
            assert ran == ["other"]

    trio.run(main)


def test_a_finished_append_still_raises_its_error_and_honours_cancellation() -> None:
    async def main() -> None:
        failed = PendingAppend(7)
        failed._finish(LedgerFenced(1, "recovered by another client"))
        with pytest.raises(LedgerFenced):
            await failed.result()
        ok = PendingAppend(8)
        ok._finish()
        with trio.CancelScope() as scope:
            scope.cancel()
            await ok.result()
            raise AssertionError("result() in a cancelled scope returned")
        assert scope.cancelled_caught

    trio.run(main)


def test_an_unfinished_append_waits_for_its_outcome() -> None:
    async def main() -> None:
        p = PendingAppend(3)
        async with trio.open_nursery() as nursery:
            async def finish_later() -> None:
                await trio.sleep(0.01)
                p._finish()
            nursery.start_soon(finish_later)
            with trio.fail_after(5):
                assert await p.result() == 3

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # no I/O here: simulated time
