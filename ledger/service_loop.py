"""The loop of a node's background services (trio edge): run a round forever; these errors mean retry.

A background service (the auditor, the replication worker, the bookie's garbage
collector, its registrar and decommission follower) talks to the metastore and
to other bookies, through other nodes. Any of those can fail it: a node paused
or killed mid-request (ConnectionLoss, SessionExpired), an ACL it is not allowed
through (NoAuth), a bookie that does not answer, metadata another client wrote
badly. None of that may end the node (issue 17: "a fault of one node ends
another"). So every service is written as one *round* (open a session, do the
work until something fails) run by `ServiceLoop.run`, which:

- retries after an error of `SERVICE_ERRORS`, raised bare or wrapped in an
  exception group (trio nurseries wrap what their tasks raise; a group counts
  only if every leaf is such an error), logging one structured line and
  backing off (bounded, jittered, doubling; reset after a round that lasted);
  the waiting and the backoff are stamina's (issue 20), one retry context per
  streak of short rounds, since a stamina context's backoff never shrinks;
- re-raises everything else: a TypeError or an AssertionError is a bug of ours
  and still ends the node (crash-stop), and Cancelled still cancels.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import stamina
import trio

from bookie.errors import BookieError
from ledger.errors import LedgerError
from ledger.metadata import LedgerMetadataError
from metastore.errors import MetastoreError

# What a service's calls raise when the metastore, a bookie or another client's data fails it:
# every ZooKeeper outcome (NoAuth, ConnectionLoss, SessionExpired, ...), the recipes' LockLost and
# LeadershipLost, a failed multi, bookie client outcomes, ledger SDK errors, undecodable metadata.
SERVICE_ERRORS: tuple[type[BaseException], ...] = (MetastoreError, BookieError, LedgerError, LedgerMetadataError)


def retryable(error: BaseException, kinds: tuple[type[BaseException], ...] = SERVICE_ERRORS) -> bool:
    """Whether `error` is one of `kinds`, or an exception group (nested or not) of nothing else."""
    if isinstance(error, BaseExceptionGroup):
        return all(retryable(e, kinds) for e in error.exceptions)
    return isinstance(error, kinds)


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside `error`'s groups (just `error` if it is not a group)."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


class _RoundEnded(Exception):
    """A round returned (its session ended cleanly): it runs again after a backoff, as after a failure."""


class ServiceLoop:
    """Runs one service's round forever, retrying after SERVICE_ERRORS with backoff.

        loop = ServiceLoop("auditor", log)
        await loop.run(self._round)       # never returns; raises only what is not retryable

    The n-th retry in a row waits stamina's min_s * 2**(n-1) plus up to min_s of jitter, at most
    max_s; a round that lasted max_s starts the doubling again. stamina draws its jitter from the
    global random: the loop is an edge, timed by trio, and no simulation replays it.
    """

    def __init__(self, service: str, logger: logging.Logger, *, min_s: float = 1.0, max_s: float = 30.0,
                 errors: tuple[type[BaseException], ...] = SERVICE_ERRORS) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"backoff needs 0 < min_s <= max_s, got {min_s}, {max_s}")
        self.service = service
        self.log = logger
        self.errors = errors
        self.min_s, self.max_s = min_s, max_s  # read at each streak: a test may shorten them
        self.failures = 0
        self.last_error: str | None = None
        self._attempt: stamina.Attempt | None = None  # the running round's, for the wait it logs

    def statistics(self) -> dict[str, Any]:
        """Failures retried so far, and the last one's type and message."""
        return {"failures": self.failures, "last_error": self.last_error}

    async def run(self, round_: Callable[[], Awaitable[object]]) -> NoReturn:
        """Run `round_` again and again, forever; raise what it raises that is not retryable."""
        lasted: BaseException | None = None
        while True:
            lasted = await self._streak(round_, lasted)

    async def _streak(self, round_: Callable[[], Awaitable[object]], lasted: BaseException | None) -> BaseException:
        """Rounds under one stamina retry context, until one ends after lasting max_s: returns how it
        ended, for a fresh context (backing off from min_s again) to raise as its first attempt."""
        async for attempt in stamina.retry_context(on=self._retry_on, attempts=None, timeout=None,
                                                  wait_initial=self.min_s, wait_max=self.max_s,
                                                  wait_jitter=self.min_s):
            self._attempt = attempt
            with attempt:
                if lasted is not None:
                    ended, lasted = lasted, None
                    raise ended  # logged and waited out by stamina, as the first failure of this streak
                started = trio.current_time()
                ended = await self._round(round_)
                if trio.current_time() - started >= self.max_s:
                    return ended  # it ran a while: this failure is news, not the same one again
                raise ended
        raise AssertionError("unreachable: the context has no attempt or time limit")

    async def _round(self, round_: Callable[[], Awaitable[object]]) -> BaseException:
        """How one round ended, if it is to be retried; anything else goes through."""
        try:
            await round_()
        except BaseException as e:  # noqa: BLE001 (sorted: only SERVICE_ERRORS are returned)
            if not retryable(e, self.errors):
                raise
            return e
        return _RoundEnded()

    def _retry_on(self, error: Exception) -> bool:
        """stamina's `on`: retry a round that ended or failed with SERVICE_ERRORS (logging it)."""
        wait_s = self._attempt.next_wait if self._attempt is not None else self.min_s
        if isinstance(error, _RoundEnded):
            self.log.info("event=service_round_ended service=%s retry_min_s=%.2f", self.service, wait_s)
            return True
        if not retryable(error, self.errors):
            return False  # stamina re-raises it: a bug of ours, or Cancelled, ends the loop
        self._failed(error, wait_s)
        return True

    def _failed(self, error: BaseException, wait_s: float) -> None:
        found = leaves(error)
        self.failures += 1
        self.last_error = f"{type(found[0]).__name__}: {found[0]}"
        self.log.warning("event=service_retry service=%s error=%s detail=%r grouped=%s errors=%d retry_min_s=%.2f "
                         "failures=%d", self.service, type(found[0]).__name__, str(found[0]),
                         isinstance(error, BaseExceptionGroup), len(found), wait_s, self.failures)
