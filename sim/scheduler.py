"""The one clock, event heap and random stream every simulated world runs on.

A world (sim.cluster.SimCluster, sim.ledger_world.LedgerWorld) schedules its events with
`at(t, dispatch, event)`: at simulated millisecond `t`, `dispatch(event)` runs. Events due
at the same millisecond run in the order they were scheduled (a sequence number breaks
the tie), so a run is a pure function of the seed. Worlds built on one Scheduler share
its time, its heap and its `rng`: one `run_until` drives all of them, and one seed
decides every choice any of them makes (a Zab leader crash can land between two
ledger adds).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

Dispatch = Callable[[tuple], None]


class Scheduler:
    """Simulated time in integer milliseconds, a heap of `(t, seq, dispatch, event)`, and
    `rng = random.Random(seed)`, the only source of randomness of the worlds on it."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self._events: list[tuple[int, int, Dispatch, tuple]] = []
        self._seq = itertools.count(1)  # faster than an attribute += 1: a call per event

    def at(self, t: int, dispatch: Dispatch, event: tuple) -> None:
        """Run `dispatch(event)` at time `t` (not before `now`: a past `t` runs next)."""
        heapq.heappush(self._events, (t, next(self._seq), dispatch, event))

    def bind(self, dispatch: Dispatch) -> Callable[..., None]:
        """`at` for one world: `at(t, *event)` runs `dispatch(event)` at `t`. One call per event,
        the heap and counter held in the closure (the Zab random tests schedule millions)."""
        events, seq, push = self._events, self._seq, heapq.heappush

        def at(t: int, *event) -> None:
            push(events, (t, next(seq), dispatch, event))
        return at

    def pending(self) -> int:
        """How many events are scheduled."""
        return len(self._events)

    def run_until(self, predicate: Callable[[], bool], timeout_ms: int) -> bool:
        """Run events in order until `predicate()` holds (True) or `timeout_ms` simulated ms
        pass (False); `now` is then the deadline, unless the predicate held first."""
        deadline = self.now + timeout_ms
        # Millions of events in the random tests: the loop works on locals.
        events, pop = self._events, heapq.heappop
        while events and events[0][0] <= deadline:
            if predicate():
                return True
            t, _, dispatch, event = pop(events)
            self.now = t
            dispatch(event)
        self.now = max(self.now, deadline)
        return predicate()
