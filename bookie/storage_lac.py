"""Who waits for a ledger's LAC on a bookie (trio edge): long polls' tasks and callbacks.

BookieStorage raises a ledger's LAC from an add's LAC field (when the add is
accepted, before its fsync), an explicit LAC or a batch's fsync, and deletes
ledgers; each time it calls `notify(ledger_id)`. Waiting tasks wake then and
re-check. Callbacks (`watch`) run right in that step, so a long poll's answer
leaves without a task wake-up in between (docs/bookie_wire.md, LONG_POLL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

_log = logging.getLogger("quire.bookie.storage")


class LacWaiters:
    """`passed(ledger_id, beyond)`: whether the ledger's LAC is greater than `beyond`, or the ledger
    is deleted (a waiter must learn that too)."""

    def __init__(self, passed: Callable[[int, int], bool]) -> None:
        self._passed = passed
        self._events: dict[int, trio.Event] = {}
        self._watchers: dict[int, list[Callable[[], None]]] = {}

    async def wait_notified(self, ledger_id: int) -> None:
        """Until the next notify(ledger_id)."""
        event = self._events.get(ledger_id)
        if event is None:
            event = self._events[ledger_id] = trio.Event()
        await event.wait()

    def watch(self, ledger_id: int, beyond: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` once passed(ledger_id, beyond): at once if it holds, else from the notify
        that makes it hold. Returns a function that cancels the watch (harmless once called)."""
        if self._passed(ledger_id, beyond):
            callback()
            return _nothing

        def check() -> None:  # every notify of this ledger wakes every watcher: re-check ours
            if self._passed(ledger_id, beyond):
                callback()
            else:
                self._watchers.setdefault(ledger_id, []).append(check)

        self._watchers.setdefault(ledger_id, []).append(check)

        def cancel() -> None:
            current = self._watchers.get(ledger_id)
            if current is not None and check in current:
                current.remove(check)
        return cancel

    def notify(self, ledger_id: int) -> None:
        """The ledger's LAC went up, or it was deleted: wake its tasks, run its watchers' checks."""
        event = self._events.pop(ledger_id, None)
        if event is not None:
            event.set()
        for check in self._watchers.pop(ledger_id, None) or ():
            try:
                check()
            except Exception:  # noqa: BLE001 - a watcher's bug must not fail the add or fsync that raised the LAC
                _log.exception("event=lac_watcher_failed ledger=%s", ledger_id)


def _nothing() -> None:
    """The cancel function of a watch that fired at once."""
