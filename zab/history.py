"""A peer's history: the logged transactions it keeps in memory.

Everything at or below `base_zxid` is summarised by the state machine (a
snapshot, or transactions trimmed after delivery); above it, every logged
transaction is here in zxid order with no gap (FAULTS.md: a hole in the
in-memory log is a bug, so appends assert contiguity).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from zab import zxid as Z
from zab.txn import Txn


class History:
    def __init__(self, base_zxid: int = 0, txns: Sequence[Txn] = ()) -> None:
        self.base_zxid = base_zxid
        self._txns: list[Txn] = []
        self._zxids: list[int] = []
        for t in txns:
            self.append(t)

    def __len__(self) -> int:
        return len(self._txns)

    @property
    def last_zxid(self) -> int:
        return self._zxids[-1] if self._zxids else self.base_zxid

    def append(self, txn: Txn) -> None:
        assert Z.follows(self.last_zxid, txn.zxid), (
            f"history gap: {Z.fmt(txn.zxid)} cannot follow {Z.fmt(self.last_zxid)}")
        self._txns.append(txn)
        self._zxids.append(txn.zxid)

    def contains(self, zxid: int) -> bool:
        """True when `zxid` is a point this history passes through (base included)."""
        if zxid == self.base_zxid:
            return True
        i = bisect.bisect_left(self._zxids, zxid)
        return i < len(self._zxids) and self._zxids[i] == zxid

    def floor(self, zxid: int) -> int | None:
        """The largest point of this history at or below `zxid`; None below the base."""
        if zxid < self.base_zxid:
            return None
        i = bisect.bisect_right(self._zxids, zxid)
        return self._zxids[i - 1] if i else self.base_zxid

    def after(self, zxid: int) -> list[Txn]:
        """Every transaction above `zxid`; `zxid` must not be below the base."""
        assert zxid >= self.base_zxid, f"{Z.fmt(zxid)} is below the in-memory base {Z.fmt(self.base_zxid)}"
        return self._txns[bisect.bisect_right(self._zxids, zxid):]

    def between(self, low: int, high: int) -> list[Txn]:
        """Transactions with low < zxid <= high."""
        return self._txns[bisect.bisect_right(self._zxids, low):bisect.bisect_right(self._zxids, high)]

    def truncate_after(self, zxid: int) -> None:
        assert zxid >= self.base_zxid, f"cannot truncate to {Z.fmt(zxid)} below base {Z.fmt(self.base_zxid)}"
        i = bisect.bisect_right(self._zxids, zxid)
        del self._txns[i:]
        del self._zxids[i:]

    def reset(self, base_zxid: int) -> None:
        """Forget everything: the state at `base_zxid` arrived as a snapshot."""
        self.base_zxid = base_zxid
        self._txns.clear()
        self._zxids.clear()

    def trim(self, committed_zxid: int, keep: int) -> None:
        """Drop the oldest committed transactions beyond the newest `keep`.

        Trims in batches of at least keep/8: deleting from the front of a list costs
        the whole list, so doing it per delivery would be quadratic.
        """
        excess = len(self._txns) - keep
        if excess < max(1, keep // 8):
            return
        limit = min(excess, bisect.bisect_right(self._zxids, committed_zxid))
        if limit <= 0:
            return
        self.base_zxid = self._zxids[limit - 1]
        del self._txns[:limit]
        del self._zxids[:limit]
