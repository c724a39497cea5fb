"""Broadcast throughput and commit latency, with the log's fsync behaviour, for Quire and ZooKeeper.

Each workload gets a fresh 3-node cluster in its own folder. Around the timed
phase the benchmark reads every node's log counters (Quire: /status `log`;
ZooKeeper: `mntr`) and the CPU each process used, so that transactions per
fsync and fsyncs/s come from the same interval as the throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench import stats, workload, zk
from bench.machine import CpuMeter
from bench.quire import QuireCluster


@dataclass(frozen=True)
class Spec:
    value_bytes: int
    concurrency: int
    writes: int
    warmup: int

    @property
    def name(self) -> str:
        return f"{self.value_bytes} B, {self.concurrency} outstanding"


@dataclass
class FsyncStats:
    """One node's log during the timed phase."""

    node: str
    role: str
    txns: int
    fsyncs: int
    fsync_seconds: float
    elapsed_s: float

    @property
    def txns_per_fsync(self) -> float:
        return self.txns / self.fsyncs if self.fsyncs else math.nan

    @property
    def fsyncs_per_s(self) -> float:
        return self.fsyncs / self.elapsed_s if self.elapsed_s else math.nan

    @property
    def mean_fsync_ms(self) -> float:
        return 1000 * self.fsync_seconds / self.fsyncs if self.fsyncs else math.nan


@dataclass
class Result:
    system: str
    spec: Spec
    outcome: workload.Outcome
    cpu: CpuMeter | None = None
    fsync: list[FsyncStats] = field(default_factory=list)
    leader: str = ""

    @property
    def throughput(self) -> float:
        return self.outcome.ok / self.outcome.elapsed_s if self.outcome.elapsed_s else math.nan

    def latency_ms(self, q: float) -> float:
        return 1000 * stats.percentile(self.outcome.latencies_s, q)


# -- Quire -------------------------------------------------------------------------------


def run_quire(folder: Path, spec: Spec) -> Result:
    """Fresh cluster, warm-up, timed writes; the cluster is stopped whatever happens."""
    with QuireCluster(folder, bookies=False) as cluster:
        cluster.start()
        return trio.run(_run_quire, cluster, spec)


async def _run_quire(cluster: QuireCluster, spec: Spec) -> Result:
    leader = await cluster.leader()
    # One outstanding write goes straight to the leader; many are spread over every node.
    addresses = [cluster.client_address(leader)] if spec.concurrency == 1 else cluster.client_addresses()
    before: dict[int, Any] = {}
    meter = CpuMeter(cluster.pids())

    async def mark() -> None:  # between warm-up and timed phase
        before.update(await cluster.statuses())
        meter.start()

    outcome = await workload.quire_writes(addresses, writes=spec.writes, concurrency=spec.concurrency,
                                          value_bytes=spec.value_bytes, warmup=spec.warmup, after_warmup=mark)
    meter.stop()
    after = await cluster.statuses()
    fsync = [_quire_fsync(nid, before[nid], after[nid], outcome.elapsed_s) for nid in sorted(before)
             if before[nid] and after[nid]]
    return Result("Quire", spec, outcome, meter, fsync, leader=f"node{leader}")


def _quire_fsync(nid: int, before: dict[str, Any], after: dict[str, Any], elapsed_s: float) -> FsyncStats:
    b, a = before.get("log", {}), after.get("log", {})
    return FsyncStats(node=f"node{nid}", role=after.get("role", "?"),
                      txns=a.get("records_synced", 0) - b.get("records_synced", 0),
                      fsyncs=a.get("syncs", 0) - b.get("syncs", 0),
                      fsync_seconds=a.get("fsync_seconds_total", 0.0) - b.get("fsync_seconds_total", 0.0),
                      elapsed_s=elapsed_s)


# -- ZooKeeper ----------------------------------------------------------------------------


def run_zk(folder: Path, spec: Spec) -> Result:
    with zk.ZkEnsemble(folder) as ensemble:
        ensemble.start()
        leader = ensemble.wait_serving()
        hosts = [ensemble.hosts(leader)] if spec.concurrency == 1 else [ensemble.hosts(i) for i in ensemble.ids]
        before: dict[int, dict[str, str]] = {}
        meter = CpuMeter(ensemble.pids())

        def mark() -> None:  # between warm-up (JIT, connections) and timed phase
            before.update({i: zk.mntr(ensemble.client_ports[i]) for i in ensemble.ids})
            meter.start()

        outcome = workload.zk_writes(hosts, writes=spec.writes, concurrency=spec.concurrency,
                                     value_bytes=spec.value_bytes, warmup=spec.warmup, after_warmup=mark)
        meter.stop()
        after = {i: zk.mntr(ensemble.client_ports[i]) for i in ensemble.ids}
    fsync = [_zk_fsync(i, before[i], after[i], outcome.elapsed_s) for i in sorted(before)]
    return Result("ZooKeeper", spec, outcome, meter, fsync, leader=f"zk{leader}")


def _zk_fsync(i: int, before: dict[str, str], after: dict[str, str], elapsed_s: float) -> FsyncStats:
    def delta(name: str) -> float:
        return float(after.get(name, 0)) - float(before.get(name, 0))

    return FsyncStats(node=f"zk{i}", role=after.get("zk_server_state", "?"),
                      txns=int(delta("zk_sum_sync_processor_batch_size")),
                      fsyncs=int(delta("zk_cnt_fsynctime")),
                      fsync_seconds=delta("zk_sum_fsynctime") / 1000.0,  # fsynctime is in ms
                      elapsed_s=elapsed_s)
