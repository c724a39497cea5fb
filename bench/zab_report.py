"""The Zab-layer sections of docs/benchmarks.md: their summary and sections 1 to 4, from a suite's Results.

Quire is driven there by its own trio client (metastore.client.MetaClient) and
ZooKeeper by kazoo, both writing znodes (bench/workload.py, bench/election.py).
"""

from __future__ import annotations

from bench import stats
from bench.election import Sample
from bench.profile import Profile
from bench.stats import fmt_ms, fmt_num, fmt_ratio, max_or_none, median_or_none, ratio
from bench.suite import Results
from bench.throughput import FsyncStats, Result

TITLE = "Zab layer (znode writes: MetaClient and kazoo)"
TOP_FUNCTIONS = 15


def summary(r: Results) -> str:
    rows = [f"## Summary: {TITLE}", "",
            "Quire/ZooKeeper ratio: above 1 means Quire takes longer (times) or does more (rates).", "",
            "| figure | Quire | ZooKeeper | Quire/ZK |", "| --- | ---: | ---: | ---: |"]

    def row(name: str, ours: float | None, theirs: float | None, fmt) -> None:  # noqa: ANN001
        rows.append(f"| {name} | {fmt(ours)} | {fmt(theirs)} | {fmt_ratio(ratio(ours, theirs))} |")

    q, z = r.elections.get("Quire", []), r.elections.get("ZooKeeper", [])
    for label, attr in (("leader seen", "leader_s"), ("first write acked", "write_s")):
        qt, zt = _times(q, attr), _times(z, attr)
        row(f"failover, SIGKILL to {label}: median", median_or_none(qt), median_or_none(zt), fmt_ms)
        row(f"failover, SIGKILL to {label}: worst", max_or_none(qt), max_or_none(zt), fmt_ms)
    for value_bytes in r.sizes.value_sizes:
        for concurrency in (1, r.sizes.many):
            qr, zr = r.workload("Quire", value_bytes, concurrency), r.workload("ZooKeeper", value_bytes, concurrency)
            name = f"{value_bytes} B, {concurrency} outstanding"
            row(f"{name}: writes/s", qr and qr.throughput, zr and zr.throughput, lambda v: fmt_num(v, 0))
            row(f"{name}: p50 commit latency", qr and qr.latency_ms(50) / 1000, zr and zr.latency_ms(50) / 1000, fmt_ms)
            row(f"{name}: p99 commit latency", qr and qr.latency_ms(99) / 1000, zr and zr.latency_ms(99) / 1000, fmt_ms)
            row(f"{name}: server CPU per write", qr and _cpu_ms_per_write(qr), zr and _cpu_ms_per_write(zr),
                lambda v: "n/a" if v is None else f"{v:.2f} ms")
            if concurrency > 1:
                for role in ("leader", "follower"):
                    qf, zf = qr and _node(qr, role), zr and _node(zr, role)
                    row(f"{name}: txns per fsync, {role}", qf and qf.txns_per_fsync, zf and zf.txns_per_fsync,
                        lambda v: fmt_num(v, 2))
                    row(f"{name}: log fsyncs/s, {role}", qf and qf.fsyncs_per_s, zf and zf.fsyncs_per_s,
                        lambda v: fmt_num(v, 0))
    rows.append("")
    if r.disk:
        rows.append(f"Disk alone (same filesystem, same run): {r.disk[0].per_s:,.0f} fsyncs/s "
                    f"({r.disk[0].mean_ms:.2f} ms each) for {r.disk[0].name}.")
        rows.append("")
    return "\n".join(rows)


def elections(r: Results) -> str:
    lines = ["## 1. Failover: election after SIGKILL of the leader", "",
             "Three nodes serve; the leader is SIGKILLed; the two survivors are polled until one is leader "
             "(Quire: admin `/status` says role `leader`, phase `broadcast`; ZooKeeper: `srvr` says "
             "`Mode: leader`, which ZooKeeper reports when it starts leading, before its followers have synced, "
             "so it is an earlier point of the protocol than Quire's). Then one write, a `setData` of one znode, "
             "is sent to the new leader in a fresh session (Quire: MetaClient; ZooKeeper: kazoo; both retry "
             "connecting within a poll interval) and the time of its acknowledgement recorded: that is the "
             "comparable figure. The killed node is restarted and "
             "the next run waits until all three serve.", ""]
    if not r.elections:
        return "\n".join(lines + ["No election ran (see Problems).", ""])
    lines += ["| system | runs | leader seen: median | worst | first write: median | worst | failed runs |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for system, samples in r.elections.items():
        leader, write = _times(samples, "leader_s"), _times(samples, "write_s")
        failed = sum(1 for s in samples if s.leader_s is None or s.write_s is None)
        lines.append(f"| {system} | {len(samples)} | {fmt_ms(median_or_none(leader))} | "
                     f"{fmt_ms(max_or_none(leader))} | {fmt_ms(median_or_none(write))} | "
                     f"{fmt_ms(max_or_none(write))} | {failed} |")
    lines.append("")
    for system, samples in r.elections.items():
        cells = ", ".join(f"{1000 * s.leader_s:.0f}" if s.leader_s is not None else "none" for s in samples)
        lines.append(f"{system}, SIGKILL to leader seen, every run (ms): {cells}")
        lines.append("")
        notes = [f"{s.killed}: {s.note}" for s in samples if s.note]
        if notes:
            lines += [f"- {n}" for n in notes] + [""]
    lines += _failover_orders(r)
    return "\n".join(lines)


def _failover_orders(r: Results) -> list[str]:
    """Quire's election time split by which survivor went LOOKING first (from the node logs)."""
    if not r.quire_failovers:
        return []
    lines = ["Quire's failovers from the node logs (`bench/timeline.py`), split by which survivor logged "
             "`role=looking` first; time from that line to the new leader's `role=leader` line:", "",
             "| survivor that went LOOKING first | failovers | median | min | max |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for order in ("better vote first", "worse vote first", "same millisecond"):
        times = [f.looking_to_leader_ms for f in r.quire_failovers if f.order == order]
        if times:
            lines.append(f"| {order} | {len(times)} | {stats.median(times):.0f} ms | {min(times):.0f} ms | "
                         f"{max(times):.0f} ms |")
    return lines + [""]


def throughput(r: Results) -> str:
    lines = ["## 2. Broadcast throughput and commit latency", "",
             "Fixed count of writes, one cluster per row: each a `setData` of the value to one of 64 znodes "
             "(`/bench/k0`..`k63`, created beforehand), through ZooKeeper's client protocol on both systems. "
             "1 outstanding: one session on the leader. Many outstanding: one session per server, write i on "
             "session i mod 3, that many writes in flight at all times; Quire, the project's trio client "
             "`metastore.client.MetaClient` (that many tasks each awaiting one `set`, pipelined on the "
             "sessions); ZooKeeper, kazoo `set_async` under a semaphore. Latency is "
             "per write, from the client's send to its acknowledgement. CPU columns: average cores used during "
             "the timed phase (the bench client is this Python process; 'others' is whatever else ran on the "
             "machine).", "",
             "| system | workload | ok | errors | writes/s | p50 | p99 | max | CPU (cores) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for w in r.workloads:
        o = w.outcome
        errors = sum(o.errors.values())
        lines.append(f"| {w.system} | {w.spec.name} | {o.ok} | {errors} | {w.throughput:,.0f} | "
                     f"{fmt_ms(stats.percentile(o.latencies_s, 50))} | {fmt_ms(stats.percentile(o.latencies_s, 99))} | "
                     f"{fmt_ms(max(o.latencies_s) if o.latencies_s else None)} | {w.cpu.summary() if w.cpu else ''} |")
    lines.append("")
    errors = [(w, e) for w in r.workloads for e in w.outcome.error_samples]
    if errors:
        lines += ["Errors returned to the clients:", ""] + [f"- {w.system} {w.spec.name}: `{e}`" for w, e in errors]
        lines.append("")
    return "\n".join(lines)


def fsync(r: Results) -> str:
    lines = ["## 3. Group commit: transactions per fsync", "",
             "Log counters read before and after the timed phase of each run (the many-outstanding runs first; "
             "the 1-outstanding rows show the cost of one fsync inside each server at low load). Quire: "
             "`/status` `log` (records_synced, syncs, fsync_seconds_total). ZooKeeper: `mntr` "
             "(`zk_sum_sync_processor_batch_size`, `zk_cnt_fsynctime`, `zk_sum_fsynctime`). Both also count "
             "the closing of the benchmark's own sessions (one txn per session) after the timed phase. "
             "ZooKeeper records each fsync's duration in whole milliseconds, truncated (`FileTxnLog.commit`), "
             "so its mean fsync is a lower bound and reads near 0 when fsyncs take well under 1 ms; Quire's is "
             "measured with `time.perf_counter()` around the call in the writer thread, so it includes getting "
             "the GIL back.", ""]
    if r.disk:
        lines += ["The disk's own rate, measured in the same run by a plain Python loop in the data dirs' "
                  "filesystem:", "", "| loop | fsyncs/s | mean |", "| --- | ---: | ---: |"]
        lines += [f"| {d.name} | {d.per_s:,.0f} | {d.mean_ms:.2f} ms |" for d in r.disk]
        lines.append("")
    lines += ["| system | workload | node | role | txns | fsyncs | txns/fsync | fsyncs/s | mean fsync | "
              "fsyncs/s vs disk loop |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    disk_rate = r.disk[0].per_s if r.disk else None
    for w in sorted(r.workloads, key=lambda w: (w.spec.concurrency == 1, w.spec.value_bytes, w.system)):
        for f in w.fsync:
            lines.append(f"| {w.system} | {w.spec.name} | {f.node} | {f.role} | {f.txns} | {f.fsyncs} | "
                         f"{fmt_num(f.txns_per_fsync, 2)} | {fmt_num(f.fsyncs_per_s, 0)} | "
                         f"{fmt_num(f.mean_fsync_ms, 2)} ms | {fmt_ratio(ratio(f.fsyncs_per_s, disk_rate))} |")
    lines.append("")
    return "\n".join(lines)


def profile(r: Results) -> str:
    lines = ["## 4. Profile of the Quire leader under many outstanding writes", ""]
    p = r.profile
    if p is None:
        return "\n".join(lines + ["Not run (see Problems).", ""])
    cpu = p.cpu
    lines += [f"py-spy {SAMPLING} on the leader during {r.sizes.profile_writes} writes, {r.sizes.many} outstanding, "
              f"100 B values ({p.throughput:,.0f} writes/s with the profilers attached). The leader used "
              f"{(cpu.user_s + cpu.system_s) / cpu.wall_s:.2f} cores: {cpu.user_s / cpu.wall_s:.2f} user, "
              f"{cpu.system_s / cpu.wall_s:.2f} system (from /proc over {cpu.wall_s:.1f} s).", "",
              "Two samplers ran at once: `--gil` counts only the thread holding the GIL, i.e. where the "
              "interpreter's CPU goes; the default mode counts every thread that is not idle, which also "
              "includes the log writer's thread while it waits in fsync and threads that are runnable but "
              "waiting for a CPU (this machine has two for five busy processes). Percentages are of each "
              "profile's samples; lines of a function are merged.", ""]
    for prof in p.profiles:
        lines += profile_tables(prof)
    return "\n".join(lines)


SAMPLING = "`record --nonblocking --rate 200`"


def profile_tables(p: Profile, role: str = "Leader") -> list[str]:
    title = "holding the GIL" if p.mode == "gil" else "any thread not idle"
    lines = [f"### {role} ({p.leader}), {title}: {p.samples} samples", "",
             "| self % | function (self time) | | total % | function (inclusive, project code) |",
             "| ---: | --- | --- | ---: | --- |"]
    top_self = p.self_counts.most_common(TOP_FUNCTIONS)
    ours = [(f, c) for f, c in p.total_counts.most_common()
            if f.split("(")[-1].startswith(("zab/", "clusterd/", "metastore/"))
            and not f.startswith(("main ", "<module>", "run_node", "_start_services"))][:TOP_FUNCTIONS]
    for i in range(max(len(top_self), len(ours))):
        left = f"{p.share(top_self[i][1]):.1f} | `{top_self[i][0]}`" if i < len(top_self) else " | "
        right = f"{p.share(ours[i][1]):.1f} | `{ours[i][0]}`" if i < len(ours) else " | "
        lines.append(f"| {left} | | {right} |")
    areas = ", ".join(f"{name} {p.share(count):.0f}%" for name, count in p.area_self.most_common())
    lines += ["", f"Self time by area: {areas}.", ""]
    return lines


# -- helpers -------------------------------------------------------------------------------


def _times(samples: list[Sample], attr: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, attr)) is not None]


def _node(w: Result, role: str) -> FsyncStats | None:
    return next((f for f in w.fsync if f.role == role), None)


def _cpu_ms_per_write(w: Result) -> float | None:
    """Milliseconds of CPU all three servers spent per acknowledged write."""
    if not w.cpu or not w.outcome.ok:
        return None
    servers = sum(v for k, v in w.cpu.cores.items() if k != "bench client")
    return 1000 * servers * w.cpu.wall_s / w.outcome.ok
