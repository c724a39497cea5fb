"""A peer's history: the logged transactions it keeps in memory.

Everything at or below `base_zxid` is summarised by the state machine (a
snapshot, or transactions trimmed after delivery); above it, every logged
transaction is here in zxid order with no gap (FAULTS.md: a hole in the
in-memory log is a bug, so appends assert contiguity).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from zab.core import zxid as Z
from zab.core.txn import Txn

# What a transaction costs in memory beyond its data (its ids and list slots), for byte limits.
TXN_OVERHEAD_BYTES = 64


class History:
    def __init__(self, base_zxid: int = 0, txns: Sequence[Txn] = ()) -> None:
        self.base_zxid = base_zxid
        self._txns: list[Txn] = []
        self._zxids: list[int] = []
        # Running totals of txn_bytes: _ends[i] counts every transaction up to and including
        # _txns[i] since the history began, _start what was trimmed before _txns[0].
        self._ends: list[int] = []
        self._start = 0
        self.rewrites = 0  # counts truncations and resets: what was appended may be gone
        for t in txns:
            self.append(t)

    def __len__(self) -> int:
        return len(self._txns)

    @property
    def bytes(self) -> int:
        """What the transactions held here cost (txn_bytes), for the byte limit of trim()."""
        return self._ends[-1] - self._start if self._ends else 0

    @property
    def last_zxid(self) -> int:
        return self._zxids[-1] if self._zxids else self.base_zxid

    def append(self, txn: Txn) -> None:
        assert Z.follows(self.last_zxid, txn.zxid), (
            f"history gap: {Z.fmt(txn.zxid)} cannot follow {Z.fmt(self.last_zxid)}")
        self._txns.append(txn)
        self._zxids.append(txn.zxid)
        self._ends.append((self._ends[-1] if self._ends else self._start) + txn_bytes(txn))

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
        self.rewrites += i < len(self._zxids)
        del self._txns[i:]
        del self._zxids[i:]
        del self._ends[i:]

    def reset(self, base_zxid: int) -> None:
        """Forget everything: the state at `base_zxid` arrived as a snapshot."""
        self.base_zxid = base_zxid
        self.rewrites += 1
        self._txns.clear()
        self._zxids.clear()
        self._ends.clear()
        self._start = 0

    def trim(self, committed_zxid: int, keep: int, keep_bytes: int | None = None) -> None:
        """Drop the oldest committed transactions beyond the newest `keep`, or beyond the
        newest that fit in `keep_bytes` (txn_bytes).

        Trims in batches of at least an eighth of a limit: deleting from the front of a list
        costs the whole list, so doing it per delivery would be quadratic.
        """
        excess = len(self._txns) - keep
        if excess >= max(1, keep // 8):
            self._drop_front(min(excess, bisect.bisect_right(self._zxids, committed_zxid)))
        if keep_bytes is not None and self.bytes > keep_bytes + keep_bytes // 8:
            # The fewest oldest transactions whose removal leaves at most keep_bytes.
            count = bisect.bisect_left(self._ends, self._ends[-1] - keep_bytes) + 1
            self._drop_front(min(count, bisect.bisect_right(self._zxids, committed_zxid)))

    def _drop_front(self, count: int) -> None:
        if count <= 0:
            return
        self.base_zxid = self._zxids[count - 1]
        self._start = self._ends[count - 1]
        del self._txns[:count]
        del self._zxids[:count]
        del self._ends[:count]


def txn_bytes(txn: Txn) -> int:
    """What one transaction costs in memory, as the byte limits count it."""
    return len(txn.data) + TXN_OVERHEAD_BYTES
