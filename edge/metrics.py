"""Metrics of this process (prometheus-client): every counter and histogram Quire records.

One registry per process, since one clusterd process runs one node (a ledger client in an
application process records into that process's registry, which the application may serve
with prometheus_client's own exposition). The admin port serves this registry and, beside it,
gauges read from the node's status at scrape time (clusterd/daemon/admin.py): those cost
nothing between scrapes.

Every name is listed here, so that this module is the catalogue docs/operations.md and the
Grafana dashboard (docs/grafana-dashboard.json) are written from. Latencies are in seconds.

`ENABLED` turns the recording off (`metrics = false` in cluster.toml's [cluster]): the benchmark's rows with metrics
on and off measure what they cost; the hot paths look at it before they take a time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

ENABLED = True

REGISTRY = CollectorRegistry(auto_describe=True)

# 100 µs to 10 s: a loopback round trip at the low end, an election at the top.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def _histogram(name: str, doc: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS) -> Histogram:
    return Histogram(name, doc, labels, registry=REGISTRY, buckets=buckets)


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    return Counter(name, doc, labels, registry=REGISTRY)


# -- metastore client port ---------------------------------------------------------------------
CLIENT_REQUEST_SECONDS = _histogram(
    "quire_client_request_seconds", "Client-port requests from arrival to answer, by operation", ("op",))
CLIENT_PACKETS_RECEIVED = _counter("quire_client_packets_received", "Requests received on the client port")
CLIENT_PACKETS_SENT = _counter("quire_client_packets_sent", "Answers and notifications sent on the client port")
CLIENT_CONNECTIONS = _counter("quire_client_connections", "Client connections accepted")

# -- Zab -----------------------------------------------------------------------------------------
COMMIT_SECONDS = _histogram(
    "quire_zab_commit_seconds", "On the leader: a proposal's time from its log append to its commit")
ELECTIONS = _counter("quire_zab_elections", "Leader elections this node took part in (each time it was LOOKING)")
ELECTION_SECONDS = _histogram("quire_zab_election_seconds", "From LOOKING to a decided role (leading or following)")

# -- durable logs: the Zab txn log and the bookie journal ----------------------------------------
FSYNC_SECONDS = _histogram(
    "quire_fsync_seconds", "One group commit: writing the batch and fdatasync, by log (txnlog, journal)", ("log",))
FSYNC_BATCH = _histogram("quire_fsync_batch_size", "Items made durable by one group commit, by log", ("log",),
                         buckets=BATCH_BUCKETS)

# -- bookie ----------------------------------------------------------------------------------------
BOOKIE_ADD_SECONDS = _histogram("quire_bookie_add_seconds", "A bookie's add: from arrival to the durable answer")
BOOKIE_READ_SECONDS = _histogram("quire_bookie_read_seconds", "A bookie's read of one entry: arrival to answer")
BOOKIE_GC_RUNS = _counter("quire_bookie_gc_runs", "Garbage-collection passes of the bookie's entry logs")
BOOKIE_GC_LEDGERS = _counter("quire_bookie_gc_ledgers_removed", "Deleted ledgers whose entries GC dropped")
BOOKIE_COMPACTIONS = _counter("quire_bookie_compactions", "Compaction passes that rewrote at least one entry log")
BOOKIE_COMPACTION_FREED_BYTES = _counter("quire_bookie_compaction_freed_bytes", "Entry-log bytes compaction freed")

# -- ledger client (in the process that writes: AutoRecovery's here, an application's there) ------
LEDGER_APPEND_SECONDS = _histogram(
    "quire_ledger_append_seconds", "A ledger append: from the call to its acknowledgement by an ack quorum")
LEDGER_ENSEMBLE_CHANGES = _counter("quire_ledger_ensemble_changes", "Ensemble changes made by this process's writers")

# -- AutoRecovery --------------------------------------------------------------------------------
RECOVERY_BYTES_COPIED = _counter("quire_autorecovery_bytes_copied", "Entry bytes AutoRecovery copied to new bookies")
RECOVERY_LEDGERS_REPLICATED = _counter("quire_autorecovery_ledgers_replicated",
                                       "Ledgers AutoRecovery made fully replicated again")

#: Children resolved once, for the hot paths.
TXNLOG_FSYNC, JOURNAL_FSYNC = FSYNC_SECONDS.labels("txnlog"), FSYNC_SECONDS.labels("journal")
TXNLOG_BATCH, JOURNAL_BATCH = FSYNC_BATCH.labels("txnlog"), FSYNC_BATCH.labels("journal")
