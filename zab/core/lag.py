"""How far behind a follower is in bytes: the leader's running totals of what it proposed.

A follower's lag in transactions is a difference of zxid counters; in bytes it needs the
sizes of the transactions it has not acknowledged, which the leader may already have
trimmed from its history. So the leader keeps, per proposal of its leadership, the running
total of record bytes through it (sortedcontainers' SortedDict: zxid -> total), and drops
the points no follower can still ask about (trim): memory stays at one small entry per
transaction some voter has not acknowledged, and never beyond the leader's in-memory history.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

# A transaction's txn-log record is 32 bytes of framing and ids, then its data (docs/formats.md,
# "Records"; zab/storage/record.py's encoded_size, which the core may not import).
RECORD_FIXED_BYTES = 32


def record_bytes(data_len: int) -> int:
    """Bytes one transaction's record takes in the txn log, as the leader proposed it."""
    return RECORD_FIXED_BYTES + data_len


class ProposedBytes:
    """Running totals of the record bytes a leader proposed after `base_zxid` (the end of its
    initial history, where its leadership began)."""

    def __init__(self, base_zxid: int) -> None:
        self.total = 0
        self._through: SortedDict = SortedDict({base_zxid: 0})  # zxid -> total through it

    def __len__(self) -> int:
        return len(self._through)

    @property
    def oldest_zxid(self) -> int:
        return self._through.peekitem(0)[0]

    def proposed(self, zxid: int, data_len: int) -> None:
        assert zxid > self._through.peekitem(-1)[0], "proposals come in zxid order"
        self.total += record_bytes(data_len)
        self._through[zxid] = self.total

    def lag(self, acked_zxid: int) -> int:
        """Record bytes proposed after `acked_zxid`. For a zxid older than the oldest point kept
        (of an earlier epoch than the leadership's start, or a learner still syncing) it is the
        whole range kept: a lower bound, as lag_txns counts all of the epoch for such a zxid."""
        i = self._through.bisect_right(acked_zxid)
        return self.total - self._through.peekitem(max(i, 1) - 1)[1]

    def trim(self, needed_zxid: int) -> None:
        """Forget the points below the one `needed_zxid` falls on: nobody asks about a zxid
        older than that any more (the leader passes the lowest one a learner still needs)."""
        keep_from = self._through.bisect_right(needed_zxid) - 1
        if keep_from > 0:
            del self._through.keys()[:keep_from]
