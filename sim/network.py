"""A seeded simulated network: FIFO per directed link, random delay, reordering
across links, partitions and crashes that break links.

A broken link behaves like a TCP connection that was reset: everything in
flight on it is lost and both ends learn it (PeerDisconnected) at once; later
messages only flow once the link is whole again. Messages are never silently
dropped from the middle of a live link, because Zab relies on FIFO channels
without gaps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class SimNetwork:
    rng: random.Random
    min_delay_ms: int = 1
    max_delay_ms: int = 8
    # (a, b) -> generation; in-flight messages from an older generation are dropped on arrival
    generation: dict[tuple[int, int], int] = field(default_factory=dict)
    last_arrival: dict[tuple[int, int], int] = field(default_factory=dict)
    blocked: set[frozenset[int]] = field(default_factory=set)
    messages_sent: int = 0

    def link_up(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.blocked

    def schedule(self, a: int, b: int, now: int) -> tuple[int, int] | None:
        """Arrival time and generation of a message a -> b, or None if the link is cut."""
        if not self.link_up(a, b):
            return None
        self.messages_sent += 1
        t = max(now + self.rng.randint(self.min_delay_ms, self.max_delay_ms), self.last_arrival.get((a, b), 0))
        self.last_arrival[(a, b)] = t
        return t, self.generation.get((a, b), 0)

    def current(self, a: int, b: int, gen: int) -> bool:
        return self.generation.get((a, b), 0) == gen

    def break_link(self, a: int, b: int) -> None:
        for pair in ((a, b), (b, a)):
            self.generation[pair] = self.generation.get(pair, 0) + 1
            self.last_arrival.pop(pair, None)

    def partition(self, *groups: set[int]) -> list[tuple[int, int]]:
        """Cut every link between different groups; returns the links cut."""
        cut = []
        for i, g in enumerate(groups):
            for h in groups[i + 1:]:
                for a in g:
                    for b in h:
                        self.blocked.add(frozenset((a, b)))
                        self.break_link(a, b)
                        cut.append((a, b))
        return cut

    def heal(self) -> None:
        self.blocked.clear()
