"""Operators' metrics on a real 3-node cluster (issue 20): every metric /metrics names is there,
and each moves when its event happens (a scrape before and after). Also ZooKeeper's mntr keys
that Metricbeat's ZooKeeper module reads, and srvr/stat/cons/wchs/dump with real figures."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_fixtures import Cluster, copy_config, kazoo_session, leader_of, start_cluster, wait_for, \
    with_quick_bookie_gc
from clusterd import localcluster
from edge import metrics
from ledger.client_sync import SyncLedgerClient

pytestmark = pytest.mark.multiprocess

# Every name the admin port must serve on a node that is a voter and a bookie (histograms and
# counters by their sample names; docs/operations.md lists them).
EXPECTED = [
    "quire_zab_commit_seconds_count", "quire_zab_elections_total", "quire_zab_election_seconds_count",
    "quire_fsync_seconds_count", "quire_fsync_batch_size_count", "quire_fsync_queue_items",
    "quire_bookie_add_seconds_count", "quire_bookie_read_seconds_count", "quire_bookie_gc_runs_total",
    "quire_bookie_gc_ledgers_removed_total", "quire_bookie_compactions_total",
    "quire_bookie_compaction_freed_bytes_total", "quire_ledger_append_seconds_count",
    "quire_ledger_ensemble_changes_total", "quire_autorecovery_bytes_copied_total",
    "quire_autorecovery_ledgers_replicated_total", "quire_autorecovery_under_replicated_ledgers",
    "quire_role", "quire_epoch", "quire_last_committed_zxid", "quire_connected_peers",
    "quire_client_connections_open", "quire_client_outstanding_requests", "quire_sessions", "quire_watches",
    "quire_znodes", "quire_approximate_data_size_bytes", "quire_client_packets_received_total",
    "quire_client_packets_sent_total", "quire_bookie_storage_entry_log_bytes", "quire_bookie_storage_pending_records",
]
LEADER_ONLY = ["quire_follower_lag_txns", "quire_follower_lag_bytes", "quire_followers", "quire_synced_followers",
               "quire_pending_syncs"]

# What Metricbeat's ZooKeeper module (mntr metricset) reads; the last three only from a leader.
METRICBEAT_MNTR = ["zk_version", "zk_avg_latency", "zk_max_latency", "zk_min_latency", "zk_packets_received",
                   "zk_packets_sent", "zk_num_alive_connections", "zk_outstanding_requests", "zk_server_state",
                   "zk_znode_count", "zk_watch_count", "zk_ephemerals_count", "zk_approximate_data_size",
                   "zk_open_file_descriptor_count", "zk_max_file_descriptor_count"]
METRICBEAT_LEADER = ["zk_followers", "zk_synced_followers", "zk_pending_syncs"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(with_quick_bookie_gc(copy_config(tmp_path_factory.mktemp("metrics"))))
    start_cluster(c)
    yield c
    c.down()


def scrape(cluster: Cluster, node_id: int) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from the node's admin port."""
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def four(cluster: Cluster, node_id: int, word: bytes) -> str:
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    with socket.create_connection((node.host, node.client_port), timeout=10) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def mntr(cluster: Cluster, node_id: int) -> dict[str, str]:
    return dict(line.split("\t", 1) for line in four(cluster, node_id, b"mntr").splitlines())


def test_every_metric_is_served_and_the_client_and_zab_ones_move(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    follower = next(n.id for n in cluster.config.nodes if n.id != leader)
    before = {n.id: scrape(cluster, n.id) for n in cluster.config.nodes}
    for node_id, samples in before.items():
        missing = [n for n in EXPECTED + (LEADER_ONLY if node_id == leader else []) if n not in names(samples)]
        assert not missing, f"node {node_id} lacks {missing}"
    with kazoo_session(cluster, only=follower) as zk:
        for i in range(20):
            zk.create(f"/metrics-{i}", b"x" * 100)
        zk.get("/metrics-0", watch=lambda event: None)
        zk.get_children("/")
        on_follower = scrape(cluster, follower)
        on_leader = scrape(cluster, leader)
        assert value(on_follower, "quire_sessions") >= value(before[follower], "quire_sessions") + 1
        assert value(on_follower, "quire_watches") >= 1
        assert value(on_follower, "quire_client_connections_open") >= 1
    b = before[follower]
    assert value(on_follower, "quire_client_request_seconds_count", op="create") >= 20
    assert value(on_follower, "quire_client_request_seconds_count", op="get_data") >= 1
    assert value(on_follower, "quire_client_packets_received_total") >= value(b, "quire_client_packets_received_total") + 22
    assert value(on_follower, "quire_client_packets_sent_total") >= value(b, "quire_client_packets_sent_total") + 22
    assert value(on_follower, "quire_znodes") == value(b, "quire_znodes") + 20
    assert value(on_follower, "quire_approximate_data_size_bytes") >= value(b, "quire_approximate_data_size_bytes") + 2000
    for samples, old in ((on_follower, b), (on_leader, before[leader])):
        assert value(samples, "quire_fsync_seconds_count", log="txnlog") > value(old, "quire_fsync_seconds_count",
                                                                                  log="txnlog")
        assert value(samples, "quire_fsync_batch_size_sum", log="txnlog") >= value(
            old, "quire_fsync_batch_size_sum", log="txnlog") + 20
    assert value(on_leader, "quire_zab_commit_seconds_count") >= value(before[leader], "quire_zab_commit_seconds_count") + 20
    assert value(on_follower, "quire_zab_commit_seconds_count") == 0  # only a leader proposes
    assert value(on_leader, "quire_synced_followers") == 2
    assert value(on_leader, "quire_role", role="leader") == 1
    for lag_name in ("quire_follower_lag_txns", "quire_follower_lag_bytes"):
        lags = [v for (name, _), v in on_leader.items() if name == lag_name]
        assert len(lags) == 2 and all(lag >= 0 for lag in lags), lag_name


def test_follower_lag_grows_while_a_follower_is_stopped_and_clears_after_it_resumes(cluster: Cluster) -> None:
    """A SIGSTOPped follower acknowledges nothing: the leader's lag for it grows by the writes it
    missed, in transactions and in their txn-log record bytes (32 bytes of framing and ids plus
    the data each); once resumed it catches up and both go back to 0."""
    leader = leader_of(cluster)
    slow = next(n for n in cluster.config.nodes if n.id != leader)
    label = str(slow.id)
    pid = localcluster.read_pid_file(slow)
    os.kill(pid, signal.SIGSTOP)
    try:
        with kazoo_session(cluster, only=leader) as zk:
            for i in range(20):
                zk.create(f"/lag-{i}", b"x" * 100)
        behind = scrape(cluster, leader)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert value(behind, "quire_follower_lag_txns", follower=label) >= 20
    assert value(behind, "quire_follower_lag_bytes", follower=label) >= 20 * (32 + 100)

    def caught_up() -> bool:
        samples = scrape(cluster, leader)
        return all(samples.get((name, (("follower", label),))) == 0
                   for name in ("quire_follower_lag_txns", "quire_follower_lag_bytes"))
    assert wait_for(caught_up, 30)


def test_bookie_and_ledger_metrics_move(cluster: Cluster) -> None:
    before = {n.id: scrape(cluster, n.id) for n in cluster.config.nodes}
    appended = metrics.REGISTRY.get_sample_value("quire_ledger_append_seconds_count") or 0.0
    hosts = [(n.host, n.client_port) for n in cluster.config.nodes]
    with SyncLedgerClient(hosts) as ledgers:
        writer = ledgers.create(3, 3, 2, password=b"pw")
        writer.append_many([b"e" * 1000] * 30)
        writer.close()
        assert len(ledgers.open(writer.ledger_id, b"pw").read(0, 29)) == 30
        ledgers.delete(writer.ledger_id)
    # In this process: the ledger client's own histogram.
    assert metrics.REGISTRY.get_sample_value("quire_ledger_append_seconds_count") == appended + 30
    after = {n.id: scrape(cluster, n.id) for n in cluster.config.nodes}
    for node_id in after:
        assert value(after[node_id], "quire_bookie_add_seconds_count") > value(before[node_id],
                                                                               "quire_bookie_add_seconds_count")
        assert value(after[node_id], "quire_fsync_seconds_count", log="journal") > value(
            before[node_id], "quire_fsync_seconds_count", log="journal")
    assert sum(value(after[i], "quire_bookie_read_seconds_count") - value(before[i], "quire_bookie_read_seconds_count")
               for i in after) >= 30
    # The deleted ledger's entries go at the next GC passes (every 300 ms in this config).
    assert wait_for(lambda: sum(value(scrape(cluster, i), "quire_bookie_gc_ledgers_removed_total") for i in after)
                    >= sum(value(before[i], "quire_bookie_gc_ledgers_removed_total") for i in after) + 3, 30)
    assert all(value(scrape(cluster, i), "quire_bookie_gc_runs_total") > value(before[i], "quire_bookie_gc_runs_total")
               for i in after)


def test_mntr_has_metricbeats_keys_and_srvr_stat_cons_wchs_dump_have_real_figures(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    with kazoo_session(cluster, only=leader) as zk:
        zk.create("/mntr-eph", b"", ephemeral=True)
        zk.exists("/mntr-eph", watch=lambda event: None)
        rows = mntr(cluster, leader)
        for key in METRICBEAT_MNTR + METRICBEAT_LEADER:
            assert key in rows, key
        assert rows["zk_server_state"] == "leader"
        assert int(rows["zk_followers"]) == 2 and int(rows["zk_synced_followers"]) == 2
        assert int(rows["zk_ephemerals_count"]) >= 1 and int(rows["zk_watch_count"]) >= 1
        assert int(rows["zk_open_file_descriptor_count"]) > 0
        assert float(rows["zk_max_latency"]) > 0  # the requests above were timed
        srvr = four(cluster, leader, b"srvr")
        lat = srvr.split("Latency min/avg/max: ")[1].split()[0].split("/")
        assert float(lat[2]) > 0 and float(lat[0]) <= float(lat[1]) <= float(lat[2])
        cons = four(cluster, leader, b"cons")
        assert f"sid=0x{zk.client_id[0]:x}" in cons and "recved=" in cons
        assert "Total watches:" in four(cluster, leader, b"wchs")
        dump = four(cluster, leader, b"dump")
        assert f"0x{zk.client_id[0]:x}:\n\t/mntr-eph" in dump
        assert "zk_followers" not in mntr(cluster, next(n.id for n in cluster.config.nodes if n.id != leader))


def test_an_election_is_counted_and_timed(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    others = [n.id for n in cluster.config.nodes if n.id != leader]
    before = {i: scrape(cluster, i) for i in others}
    node = next(n for n in cluster.config.nodes if n.id == leader)
    os.kill(localcluster.read_pid_file(node), signal.SIGKILL)
    try:
        assert wait_for(lambda: all(value(scrape(cluster, i), "quire_zab_election_seconds_count")
                                    > value(before[i], "quire_zab_election_seconds_count") for i in others), 30)
        for i in others:
            assert value(scrape(cluster, i), "quire_zab_elections_total") > value(before[i], "quire_zab_elections_total")
    finally:
        start_cluster(cluster)  # brings the killed node back for the module's other tests


def test_metrics_off_leaves_the_status_gauges(tmp_path: Path) -> None:
    path = copy_config(tmp_path)
    path.write_text(path.read_text().replace("[cluster]\n", "[cluster]\nmetrics = false\n", 1))
    c = Cluster(path)
    start_cluster(c)
    try:
        with kazoo_session(c) as zk:
            zk.create("/off", b"")
        samples = {n.id: scrape(c, n.id) for n in c.config.nodes}
        assert all(value(s, "quire_znodes") > 0 for s in samples.values())
        assert all(("quire_client_request_seconds_count", (("op", "create"),)) not in s for s in samples.values())
        assert all(value(s, "quire_fsync_seconds_count", log="txnlog") == 0 for s in samples.values())
    finally:
        c.down()


# ZooKeeper 3.8's AdminServer command names (its docs' "The AdminServer" list).
ZOOKEEPER_COMMANDS = {
    "configuration", "connection_stat_reset", "connections", "dirs", "dump", "environment", "get_trace_mask",
    "hash", "initial_configuration", "is_read_only", "last_snapshot", "leader", "monitor",
    "observer_connection_stat_reset", "observers", "ruok", "server_stats", "set_trace_mask", "stat_reset",
    "stats", "system_properties", "voting_view", "watch_summary", "watches", "watches_by_path", "zabstate",
    "snapshot", "restore",
}


def admin_get(cluster: Cluster, node_id: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    with socket.create_connection((node.host, node.admin_port), timeout=10) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_admin_server_commands_answer_json_as_zookeepers(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    code, body = admin_get(cluster, leader, "/commands")
    assert code == 200
    served = json.loads(body)["commands"]
    assert set(served) <= ZOOKEEPER_COMMANDS and {"monitor", "stats", "connections", "dump", "watch_summary"} <= set(served)
    with kazoo_session(cluster, only=leader) as zk:
        zk.create("/cmd-eph", b"", ephemeral=True)
        for name in served:
            code, body = admin_get(cluster, leader, f"/commands/{name}")
            answer = json.loads(body)
            assert code == 200 and answer["command"] == name and answer["error"] is None, name
        monitor = json.loads(admin_get(cluster, leader, "/commands/mntr")[1])  # short names too
        assert monitor["command"] == "monitor"
        for key in METRICBEAT_MNTR + METRICBEAT_LEADER:
            assert key[3:] in monitor, key
        dump = json.loads(admin_get(cluster, leader, "/commands/dump")[1])
        assert dump["session_id_to_ephemeral_paths"][str(zk.client_id[0])] == ["/cmd-eph"]
        conns = json.loads(admin_get(cluster, leader, "/commands/connections")[1])["connections"]
        assert any(c["session_id"] == zk.client_id[0] for c in conns)
    assert admin_get(cluster, leader, "/commands/stat_reset")[0] == 404  # it changes state: not served
    assert admin_get(cluster, leader, "/commands/monitor", method="POST")[0] == 405


def test_the_grafana_dashboard_names_only_served_metrics(cluster: Cluster) -> None:
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bquire_[a-z_]+", e)}
    served = set().union(*(names(scrape(cluster, n.id)) for n in cluster.config.nodes))
    served |= {n.rsplit("_", 1)[0] for n in served if n.endswith(("_bucket", "_count", "_sum"))}
    assert used and used <= served, sorted(used - served)

