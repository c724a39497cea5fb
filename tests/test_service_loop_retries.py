"""The edge's retries are stamina's: they really wait, back off, reset, and stop.

ServiceLoop (ledger/service_loop.py) runs a background service's round forever
under a stamina retry context; the ledger driver (ledger/driver.py) re-reads
metadata the same way while the metastore fails. Stories, on trio's MockClock
(virtual time, autojump: the waits cost nothing and the clock reads exactly
what was waited) or over real loopback bookies:

1. the metastore fails four rounds: each is retried after a longer wait, and
   once a round runs (serves) nothing is retried any more;
2. the waits stop doubling at max_s; a round that lasted max_s starts them again;
3. a round that returns (its session ended cleanly) is run again, after a wait;
4. a bug of ours (TypeError), and a cancellation, go through at once;
5. the metastore fails a writer's close and the two re-reads after it: the
   driver waits each out with a growing backoff, and the ledger closes.

What stamina scheduled is read through its instrumentation hook (`retries`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator

import pytest
import stamina
import trio
import trio.testing
from stamina.instrumentation import RetryDetails

import ledger.driver
from bookie.errors import BookieUnavailable
from ledger.service_loop import ServiceLoop
from metastore import errors as E
from ledger_fixtures import MemoryManager, bookies, ledger_client

from bookie_fixtures import trio_test


@pytest.fixture
def retries() -> Iterator[list[RetryDetails]]:
    """Every retry stamina schedules while the test runs (its wait, its cause), in order."""
    scheduled: list[RetryDetails] = []
    before = stamina.instrumentation.get_on_retry_hooks()
    stamina.instrumentation.set_on_retry_hooks([scheduled.append])
    yield scheduled
    stamina.instrumentation.set_on_retry_hooks(before)


def on_mock_clock(story: Callable[[], Awaitable[None]]) -> None:
    """Run `story` in virtual time; the guard is virtual too, so a stuck loop fails at once."""
    async def guarded() -> None:
        with trio.fail_after(100_000):
            await story()
    trio.run(guarded, clock=trio.testing.MockClock(autojump_threshold=0))


class Rounds:
    """A service round scripted per call: raise the next error, sleep for a while, or serve forever."""

    def __init__(self, *script: BaseException | float | None) -> None:
        self.script = list(script)
        self.started: list[float] = []  # virtual time at which each round began
        self.ended: list[float] = []  # ... and at which each round that ended did

    async def __call__(self) -> None:
        self.started.append(trio.current_time())
        step = self.script[len(self.started) - 1] if len(self.started) <= len(self.script) else None
        try:
            if step is None:
                await trio.sleep_forever()  # a round that works: it serves until cancelled
            if isinstance(step, float):
                await trio.sleep(step)
                raise E.ConnectionLoss("/quire")  # it ran a while, then lost its connection
            assert isinstance(step, BaseException)
            raise step
        finally:
            self.ended.append(trio.current_time())

    def waits(self) -> list[float]:
        """How long the loop waited between one round's end and the next one's start."""
        return [start - end for end, start in zip(self.ended, self.started[1:])]


async def run_for(loop: ServiceLoop, rounds: Callable[[], Awaitable[None]], seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run, rounds)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


def test_failed_rounds_are_retried_with_growing_waits_until_one_serves(retries, caplog):
    loop = ServiceLoop("auditor", logging.getLogger("tests.auditor"), min_s=1.0, max_s=30.0)
    rounds = Rounds(E.ConnectionLoss("/quire"), ExceptionGroup("nursery", [E.SessionExpired("/quire"),
                    BookieUnavailable("bookie 3")]), E.NoAuth("/quire/ledgers"), E.ConnectionLoss("/quire"))
    with caplog.at_level(logging.INFO, "tests.auditor"):
        on_mock_clock(lambda: run_for(loop, rounds, 3_600))

    assert len(rounds.started) == 5  # the fifth serves: an hour later, nothing was retried again
    assert [r.retry_num for r in retries] == [1, 2, 3, 4]
    for n, (scheduled, waited) in enumerate(zip(retries, rounds.waits())):
        assert waited == pytest.approx(scheduled.wait_for)  # stamina itself waited
        assert 2 ** n <= scheduled.wait_for <= 2 ** n + 1  # min_s doubling, plus up to min_s of jitter
    assert loop.statistics() == {"failures": 4, "last_error": "ConnectionLoss: ConnectionLoss (-4) for '/quire'"}
    logged = [r.getMessage() for r in caplog.records if "event=service_retry" in r.getMessage()]
    assert len(logged) == 4 and "error=SessionExpired" in logged[1] and "grouped=True errors=2" in logged[1]


def test_the_waits_stop_at_max_s_and_start_again_after_a_round_that_lasted():
    loop = ServiceLoop("bookie_gc", logging.getLogger("tests.gc"), min_s=1.0, max_s=4.0)
    loss = E.ConnectionLoss("/quire")
    rounds = Rounds(loss, loss, loss, loss, 5.0, loss)  # four quick failures, one after 5 s, one quick
    on_mock_clock(lambda: run_for(loop, rounds, 3_600))

    waits = rounds.waits()
    assert len(waits) == 6 and loop.failures == 6
    assert 1 <= waits[0] <= 2 and 2 <= waits[1] <= 3  # min_s doubling, plus up to min_s of jitter
    assert waits[2] == pytest.approx(4.0) and waits[3] == pytest.approx(4.0)  # 4 and 8: capped at max_s
    assert 1 <= waits[4] <= 2 and 2 <= waits[5] <= 3  # the fifth round lasted: the doubling starts again


def test_a_round_that_returns_is_run_again_after_a_wait(caplog):
    loop = ServiceLoop("bookie_registrar", logging.getLogger("tests.registrar"), min_s=1.0)
    ends: list[float] = []

    async def session_lost_cleanly() -> None:
        ends.append(trio.current_time())
        if len(ends) == 3:
            await trio.sleep_forever()

    with caplog.at_level(logging.INFO, "tests.registrar"):
        on_mock_clock(lambda: run_for(loop, session_lost_cleanly, 3_600))
    assert len(ends) == 3 and 1 <= ends[1] - ends[0] <= 2 and 2 <= ends[2] - ends[1] <= 3
    assert loop.failures == 0
    assert sum("event=service_round_ended" in r.getMessage() for r in caplog.records) == 2


def test_a_bug_goes_through_at_once_and_is_not_waited_out(retries):
    loop = ServiceLoop("replication_worker", logging.getLogger("tests.worker"))
    rounds = Rounds(E.ConnectionLoss("/quire"), TypeError("a bug of ours"))

    async def story() -> None:
        with pytest.raises(TypeError):
            await loop.run(rounds)
        assert trio.current_time() == rounds.ended[-1]  # raised when the round ended: no wait after it

    on_mock_clock(story)
    assert len(rounds.started) == 2 and loop.failures == 1 and len(retries) == 1


@pytest.mark.parametrize("cancel_at_s", [0.5, 1_000.0], ids=["while waiting", "while serving"])
def test_a_cancellation_ends_the_loop(cancel_at_s):
    loop = ServiceLoop("auditor", logging.getLogger("tests.auditor"), min_s=1.0)
    rounds = Rounds(E.ConnectionLoss("/quire"))  # then the second round serves

    async def story() -> None:
        with trio.move_on_after(cancel_at_s) as scope:
            await loop.run(rounds)
        assert scope.cancelled_caught
    on_mock_clock(story)
    assert len(rounds.started) == (1 if cancel_at_s < 1 else 2)


class FlakyMetastore(MemoryManager):
    """The in-memory ledger metadata, behind a metastore that loses the connection on the next
    `writes` writes (before they land) and the next `reads` reads."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = self.reads = 0
        self.read_calls = 0

    async def read(self, ledger_id):
        self.read_calls += 1
        if self.reads:
            self.reads -= 1
            raise E.ConnectionLoss(f"/quire/ledgers/{ledger_id}")
        return await super().read(ledger_id)

    async def write(self, metadata, expected_version):
        if self.writes:
            self.writes -= 1
            raise E.ConnectionLoss(f"/quire/ledgers/{metadata.ledger_id}")
        return await super().write(metadata, expected_version)


@trio_test
async def test_the_driver_waits_out_a_metastore_outage_while_a_writer_closes(tmp_path, retries):
    manager = FlakyMetastore()
    async with bookies(tmp_path, 3) as services, ledger_client(services, manager) as client:
        writer = await client.create(3, 2, 2, password=b"pw")
        await writer.append_many([b"entry %d" % i for i in range(10)])
        manager.writes, manager.reads = 1, 2  # the close CAS is lost, then the re-reads fail twice
        closed = await writer.close()
    assert closed.last_entry == 9 and manager.ledgers[writer.ledger_id][0].last_entry == 9
    assert manager.read_calls == 3  # two lost, the third answered
    reads = [r for r in retries if isinstance(r.caused_by, E.ConnectionLoss)]
    assert [r.retry_num for r in reads] == [1, 2]
    first, second = (ledger.driver.METADATA_RETRY_S * 2 ** n for n in range(2))
    assert first <= reads[0].wait_for <= 2 * first and second <= reads[1].wait_for <= second + first
