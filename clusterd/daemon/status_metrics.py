"""The node's status as Prometheus metrics, read at scrape time (a prometheus-client collector).

What is a level (role, zxids, connections, sessions, znodes, follower lag, queue depths) is a
gauge read from /status when scraped, so it costs nothing between scrapes; what only grows and
is already counted in the status (client packets) is exposed as a counter. The histograms and
the counters of events live in edge/metrics.py. docs/operations.md lists every name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

ROLES = ("leader", "follower", "observer", "looking", "bookie")  # "bookie": a bookie-only node

# Client-port figures with names and help of their own; the rest of the group goes out as
# quire_clients_<key> gauges.
_CLIENT_GAUGES = {
    "connections_open": ("quire_client_connections_open", "Client connections open now"),
    "outstanding": ("quire_client_outstanding_requests", "Requests started and not yet answered"),
    "sessions": ("quire_sessions", "Sessions in the replicated tree"),
    "watches": ("quire_watches", "Watches set by this node's clients"),
    "znodes": ("quire_znodes", "Znodes in the tree"),
    "approximate_data_size": ("quire_approximate_data_size_bytes", "Bytes of every znode's path and data"),
}
_CLIENT_COUNTERS = {
    "packets_received": ("quire_client_packets_received", "Requests received on the client port"),
    "packets_sent": ("quire_client_packets_sent", "Answers and notifications sent on the client port"),
    "connections": ("quire_client_connections_accepted", "Client connections accepted"),
}


class StatusCollector:
    """Collects from `status()`, the node's /status dict."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        role = GaugeMetricFamily("quire_role", "1 for the node's current Zab role, 0 for the others", labels=["role"])
        for r in ROLES:
            role.add_metric([r], int(status.get("role") == r))
        yield role
        for name, key, doc in (("quire_epoch", "epoch", "currentEpoch: epoch of the last NEWLEADER acknowledged"),
                               ("quire_accepted_epoch", "accepted_epoch", "acceptedEpoch: last epoch proposal accepted"),
                               ("quire_last_zxid", "last_zxid", "zxid of the last transaction in the log"),
                               ("quire_last_committed_zxid", "last_committed_zxid", "zxid of the last committed transaction")):
            yield from _gauge(name, doc, status.get(key))
        yield from _gauge("quire_connected_peers", "Peers currently connected", len(status.get("peers") or ()))
        yield from _leader(status)
        log = status.get("log") or {}
        queued = GaugeMetricFamily("quire_fsync_queue_items", "Items waiting for the next group commit, by log",
                                   labels=["log"])
        if _number(log.get("queued")):
            queued.add_metric(["txnlog"], log["queued"])
        storage = ((status.get("bookie") or {}).get("service") or {}).get("storage") or {}
        if _number(storage.get("pending_records")):
            queued.add_metric(["journal"], storage["pending_records"])
        yield queued
        yield from _group("quire_log", log, "txn log statistic")
        clients = dict(status.get("clients") or {})
        for key, (name, doc) in _CLIENT_GAUGES.items():
            yield from _gauge(name, doc, clients.pop(key, None))
        for key, (name, doc) in _CLIENT_COUNTERS.items():
            value = clients.pop(key, None)
            if _number(value):
                yield CounterMetricFamily(name, doc, value=value)
        yield from _group("quire_clients", clients, "client port statistic")
        yield from _bookie(status.get("bookie") or {})

    def describe(self) -> list[Metric]:
        return []  # names depend on the status: no check at registration


def _leader(status: dict) -> Iterator[Metric]:
    followers = status.get("followers")
    if followers is None:
        return
    for key, name, doc in (("lag_txns", "quire_follower_lag_txns",
                            "On the leader: transactions a follower has not acknowledged"),
                           ("lag_bytes", "quire_follower_lag_bytes",
                            "On the leader: txn-log record bytes of the transactions a follower has not acknowledged")):
        lag = GaugeMetricFamily(name, doc, labels=["follower"])
        for fid, f in followers.items():
            if _number(f.get(key)):
                lag.add_metric([fid], f[key])
        yield lag
    yield from _gauge("quire_followers", "On the leader: connected voting followers",
                      sum(1 for f in followers.values() if not f.get("observer")))
    yield from _gauge("quire_synced_followers", "On the leader: learners in sync and heard from lately",
                      status.get("synced_followers"))
    yield from _gauge("quire_pending_syncs", "On the leader: learners being synchronized", status.get("pending_syncs"))


def _bookie(bookie: dict) -> Iterator[Metric]:
    yield from _gauge("quire_bookie_registered", "1 while the bookie is registered in the metastore",
                      bookie.get("registered"))
    yield from _gauge("quire_bookie_read_only", "1 while the bookie's disk is over its threshold", bookie.get("read_only"))
    service = bookie.get("service") or {}
    yield from _group("quire_bookie", service, "bookie service statistic")
    yield from _group("quire_bookie_storage", service.get("storage") or {}, "bookie storage statistic")
    worker = ((bookie.get("autorecovery") or {}).get("worker")) or {}
    yield from _gauge("quire_autorecovery_under_replicated_ledgers",
                      "Ledgers waiting for re-replication, as this node's worker last listed them",
                      worker.get("ledgers_waiting"))


def _group(prefix: str, values: dict, doc: str) -> Iterator[Metric]:
    for key, value in sorted(values.items()):
        yield from _gauge(f"{prefix}_{_metric_name(key)}", f"{doc} {key}", value)


def _gauge(name: str, doc: str, value: Any) -> Iterator[Metric]:
    if _number(value):
        yield GaugeMetricFamily(name, doc, value=int(value) if isinstance(value, bool) else value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _metric_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", str(key))
