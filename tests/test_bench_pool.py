"""bench/kzbench.pool: several timed windows of one row on one system pooled into one row."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.kzbench import Load, LoadResult, pool
from bench.machine import CpuMeter

LOAD = Load("sync-100", "sync write 100 B", "write", 1, 1, 100, on_leader=True, rounds=2)


def window(ok: int, wall_s: float, server_cores: float, latencies: list[float], *, syscalls: int | None) -> LoadResult:
    cpu = CpuMeter({"node1": 1})
    cpu.wall_s, cpu.cores, cpu.machine_cores = wall_s, {"node1": server_cores, "client1": 0.1}, 1.0
    row = LoadResult("Quire", LOAD, wall_s, ok, latencies, Counter({"ConnectionLoss": 1}), ["e"], 2, cpu, ["node1"],
                     "node1", total_ok=ok + 5)
    row.perf = {"node1": None if syscalls is None else {"syscalls": syscalls, "context_switches": 10}}
    row.leader_run, row.leader_wait = server_cores, 0.1
    return row


def test_pooled_windows_add_up_and_cpu_is_weighted_by_window_length() -> None:
    a = window(100, 5.0, 0.2, [0.001] * 100, syscalls=1000)
    b = window(300, 10.0, 0.5, [0.003] * 300, syscalls=2000)
    row = pool([a, b])
    assert (row.ok, row.window_s, row.total_ok, row.retries) == (400, 15.0, 410, 4)
    assert row.rate == pytest.approx(400 / 15)
    assert sorted(row.latencies) == sorted(a.latencies + b.latencies)
    assert row.errors == Counter({"ConnectionLoss": 2})
    assert row.cpu.cores["node1"] == pytest.approx((0.2 * 5 + 0.5 * 10) / 15)
    # server CPU per operation over the pooled window = total server CPU seconds / total operations
    assert row.server_cpu_us_per_op == pytest.approx(1e6 * (0.2 * 5 + 0.5 * 10) / 400)
    assert row.perf["node1"] == {"syscalls": 3000, "context_switches": 20}
    assert row.leader_run == pytest.approx((0.2 * 5 + 0.5 * 10) / 15)


def test_a_window_without_perf_counts_makes_the_pooled_counts_unknown() -> None:
    row = pool([window(10, 1.0, 0.1, [0.001], syscalls=5), window(10, 1.0, 0.1, [0.001], syscalls=None)])
    assert row.perf["node1"] is None
    assert row.per_op("syscalls") is None


def test_one_window_is_returned_as_is() -> None:
    a = window(1, 1.0, 0.1, [0.001], syscalls=1)
    assert pool([a]) is a
