"""Client-port request latency: ZooKeeper's ServerStats (min/avg/max since the last reset, for
`stat`, `srvr` and `mntr`) and the per-operation histogram of edge/metrics.py."""

from __future__ import annotations

from edge import metrics
from metastore.wire.jute_defs import OpCode


class RequestLatency:
    """From a request's arrival to its answer (ZooKeeper measures the same span)."""

    def __init__(self) -> None:
        self._by_op: dict[int, object] = {}  # histogram children, resolved once per operation
        self.reset()

    def reset(self) -> None:
        """ZooKeeper's `srst`: the min/avg/max start again (the histogram is cumulative)."""
        self.count, self.total_s, self.min_s, self.max_s = 0, 0.0, 0.0, 0.0

    def observe(self, op: int, seconds: float) -> None:
        if not self.count or seconds < self.min_s:
            self.min_s = seconds
        self.max_s = max(self.max_s, seconds)
        self.count += 1
        self.total_s += seconds
        if metrics.ENABLED:
            child = self._by_op.get(op)
            if child is None:
                child = self._by_op[op] = metrics.CLIENT_REQUEST_SECONDS.labels(_op_name(op))
            child.observe(seconds)

    def min_avg_max_ms(self) -> tuple[float, float, float]:
        """In milliseconds, as ZooKeeper prints them (3.6 on prints fractions too)."""
        avg = self.total_s / self.count if self.count else 0.0
        return round(self.min_s * 1000, 3), round(avg * 1000, 3), round(self.max_s * 1000, 3)


def _op_name(op: int) -> str:
    try:
        return OpCode(op).name.lower()
    except ValueError:
        return str(op)
