"""How far behind a follower is in bytes: the leader's running totals of what it proposed.

A follower's lag in transactions is a difference of zxid counters; in bytes it needs the
sizes of the transactions it has not acknowledged, which the leader may already have
trimmed from its history. So the leader keeps, per proposal of its leadership, the running
total of record bytes through it, and drops the points no follower can still ask about
(trim): memory stays at one small entry per transaction some voter has not acknowledged,
and never much beyond the leader's in-memory history.

Proposals come in zxid order, so the points are two append-only lists searched with bisect;
trimming moves a start index and compacts the lists now and then: a proposal and an ACK cost
a list append and a bisect, which matters on the leader's hot path.
"""

from __future__ import annotations

from bisect import bisect_right

# A transaction's txn-log record is 32 bytes of framing and ids, then its data (docs/formats.md,
# "Records"; zab/storage/record.py's encoded_size, which the core may not import).
RECORD_FIXED_BYTES = 32
COMPACT_AFTER = 1024  # points trimmed before the lists are cut (amortized: at least half of them)


def record_bytes(data_len: int) -> int:
    """Bytes one transaction's record takes in the txn log, as the leader proposed it."""
    return RECORD_FIXED_BYTES + data_len


class ProposedBytes:
    """Running totals of the record bytes a leader proposed after `base_zxid` (the end of its
    initial history, where its leadership began)."""

    def __init__(self, base_zxid: int) -> None:
        self.total = 0
        self._zxids = [base_zxid]  # increasing; from self._start on, the points kept
        self._totals = [0]  # the running total through each
        self._start = 0

    def __len__(self) -> int:
        return len(self._zxids) - self._start

    @property
    def oldest_zxid(self) -> int:
        return self._zxids[self._start]

    def proposed(self, zxid: int, data_len: int) -> None:
        assert zxid > self._zxids[-1], "proposals come in zxid order"
        self.total += record_bytes(data_len)
        self._zxids.append(zxid)
        self._totals.append(self.total)

    def lag(self, acked_zxid: int) -> int:
        """Record bytes proposed after `acked_zxid`. For a zxid older than the oldest point kept
        (of an earlier epoch than the leadership's start, or a learner still syncing) it is the
        whole range kept: a lower bound, as lag_txns counts all of the epoch for such a zxid."""
        i = bisect_right(self._zxids, acked_zxid, self._start)
        return self.total - self._totals[max(i, self._start + 1) - 1]

    def trim(self, needed_zxid: int) -> None:
        """Forget the points below the one `needed_zxid` falls on: nobody asks about a zxid
        older than that any more (the leader passes the lowest one a learner still needs)."""
        keep_from = bisect_right(self._zxids, needed_zxid, self._start) - 1
        if keep_from <= self._start:
            return
        self._start = keep_from
        if self._start >= COMPACT_AFTER and self._start * 2 >= len(self._zxids):
            del self._zxids[:self._start], self._totals[:self._start]
            self._start = 0
