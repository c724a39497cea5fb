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
- re-raises everything else: a TypeError or an AssertionError is a bug of ours
  and still ends the node (crash-stop), and Cancelled still cancels.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from bookie.errors import BookieError
from ledger.errors import LedgerError
from ledger.metadata import LedgerMetadataError
from metastore.client.core import Backoff
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


class ServiceLoop:
    """Runs one service's round forever, retrying after SERVICE_ERRORS with backoff.

        loop = ServiceLoop("auditor", log, rng=random.Random(seed))
        await loop.run(self._round)       # never returns; raises only what is not retryable
    """

    def __init__(self, service: str, logger: logging.Logger, *, min_s: float = 1.0, max_s: float = 30.0,
                 rng: random.Random | None = None,
                 errors: tuple[type[BaseException], ...] = SERVICE_ERRORS) -> None:
        self.service = service
        self.log = logger
        self.errors = errors
        self.max_s = max_s
        self.backoff = Backoff(rng or random.Random(), min_s, max_s)
        self.failures = 0
        self.last_error: str | None = None

    def statistics(self) -> dict[str, Any]:
        return {"failures": self.failures, "last_error": self.last_error}

    async def run(self, round_: Callable[[], Awaitable[object]]) -> NoReturn:
        while True:
            started = trio.current_time()
            error: BaseException | None = None
            try:
                await round_()
            except BaseException as e:  # noqa: BLE001 (sorted below: only SERVICE_ERRORS stay caught)
                if not retryable(e, self.errors):
                    raise
                error = e
            if trio.current_time() - started >= self.max_s:
                self.backoff.reset()  # it ran a while: this failure is news, not the same one again
            delay_s = self.backoff.next_delay_s()
            if error is None:
                self.log.info("event=service_round_ended service=%s retry_s=%.2f", self.service, delay_s)
            else:
                self._failed(error, delay_s)
            await trio.sleep(delay_s)

    def _failed(self, error: BaseException, delay_s: float) -> None:
        found = leaves(error)
        self.failures += 1
        self.last_error = f"{type(found[0]).__name__}: {found[0]}"
        self.log.warning("event=service_retry service=%s error=%s detail=%r grouped=%s errors=%d retry_s=%.2f "
                         "failures=%d", self.service, type(found[0]).__name__, str(found[0]),
                         isinstance(error, BaseExceptionGroup), len(found), delay_s, self.failures)
