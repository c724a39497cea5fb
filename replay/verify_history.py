"""The committed history, as far as logs can tell it. Pure: the Spark job aggregates,
this module decides.

What "committed" means from logs alone (docs/verify.md):

* A zxid present in the logs of a majority of the voters is committed, or will be:
  the next leader is elected with the highest last zxid of a quorum, which meets
  that majority, so it has the transaction and commits it (Zab paper, section 3).
  `C` is the highest such zxid.
* A snapshot is taken of delivered state, and a log that starts after a base
  (purge, or a SNAP from a leader) starts after delivered state: both zxids are
  committed. The node's *horizon* is the highest of them.
* The commit point is max(C, every horizon). The committed history H is the chain
  that ends at the highest zxid any log holds at or below the commit point,
  followed backwards through predecessors.

Within an epoch counters are contiguous, so H is a list of spans, one per epoch:
counters lo..hi. A span starts at counter 1 when some log holds it, and its
predecessor (the end of the previous span) is the predecessor those logs give,
chosen by the most nodes; otherwise H starts there (older history is only in
snapshots).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from zab.core import zxid as Z


@dataclass(frozen=True, slots=True)
class EpochSpan:
    """Counters lo..hi of `epoch` are in H; `pred` is the zxid before counter lo in H (None: unknown)."""

    epoch: int
    lo: int
    hi: int
    pred: int | None

    @property
    def first(self) -> int:
        return Z.make(self.epoch, self.lo)

    @property
    def last(self) -> int:
        return Z.make(self.epoch, self.hi)


@dataclass(frozen=True, slots=True)
class CommittedHistory:
    """H: spans oldest first, the commit point, and where the choice of a predecessor was contested."""

    commit_point: int
    spans: tuple[EpochSpan, ...]
    contested: tuple[tuple[int, dict[int, int]], ...] = ()

    def contains(self, zxid: int) -> bool:
        span = self.span_of(Z.epoch_of(zxid))
        return span is not None and span.lo <= Z.counter_of(zxid) <= span.hi

    def span_of(self, epoch: int) -> EpochSpan | None:
        return next((s for s in self.spans if s.epoch == epoch), None)

    def count_between(self, low: int, high: int) -> int:
        """How many zxids of H lie in [low, high]."""
        total = 0
        for s in self.spans:
            a, b = max(s.first, low), min(s.last, high)
            if a <= b:
                total += b - a + 1
        return total

    def successor(self, zxid: int) -> int | None:
        """The zxid after `zxid` in H (None at the end of H)."""
        firsts = [s.first for s in self.spans]
        i = bisect_right(firsts, zxid) - 1
        if i < 0:
            return None
        if zxid < self.spans[i].last:
            return zxid + 1
        return self.spans[i + 1].first if i + 1 < len(self.spans) else None

    @property
    def first(self) -> int | None:
        return self.spans[0].first if self.spans else None

    @property
    def last(self) -> int | None:
        return self.spans[-1].last if self.spans else None


def choose_pred(votes: Mapping[int, int]) -> int:
    """The predecessor most nodes' logs give; a tie goes to the lower zxid (the shorter old branch)."""
    return min(votes, key=lambda z: (-votes[z], z))


def build_history(top: int | None, commit_point: int, counters: Mapping[int, tuple[int, int]],
                  starts: Mapping[int, Mapping[int, int]]) -> CommittedHistory:
    """Walk H backwards from `top` (the highest log zxid <= commit point).

    `counters[epoch]` is (lowest, highest) counter any log holds in that epoch;
    `starts[zxid]` counts, for each zxid at counter 1, the predecessors logs give
    (pred -> number of nodes; unknown predecessors left out).
    """
    spans: list[EpochSpan] = []
    contested = []
    current = top
    while current:
        epoch = Z.epoch_of(current)
        if epoch not in counters or (spans and epoch >= spans[-1].epoch):
            break  # no log holds that epoch (history only in snapshots), or a loop: stop
        first_zxid = Z.make(epoch, 1)
        votes = starts.get(first_zxid, {})
        lo = 1 if first_zxid in starts else counters[epoch][0]
        pred = choose_pred(votes) if votes else None
        if len(votes) > 1:
            contested.append((first_zxid, dict(votes)))
        spans.append(EpochSpan(epoch, lo, Z.counter_of(current), pred if lo == 1 else None))
        current = pred if lo == 1 else None
    return CommittedHistory(commit_point, tuple(reversed(spans)), tuple(contested))
