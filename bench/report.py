"""docs/benchmarks.md from a suite's Results.

The file is regenerated on every run, except the hand-written analysis
between ANALYSIS_START and ANALYSIS_END, which is carried over so that a
rerun does not erase it (it names the run it was written for: check that it
still matches the figures above it).
"""

from __future__ import annotations

import math
from pathlib import Path

from collections import Counter

from bench import kzbench, ledger_report, stats
from bench.election import Sample
from bench.profile import Profile
from bench.stats import fmt_num, fmt_ratio, ratio
from bench.suite import QUIET_WAIT_SECTION_S, Results
from bench.throughput import FsyncStats, Result

ANALYSIS_START = "<!-- analysis:start (hand-written; kept when the file is regenerated) -->"
ANALYSIS_END = "<!-- analysis:end -->"
DEFAULT_ANALYSIS = "_No analysis written for this run yet._"
TOP_FUNCTIONS = 15


def existing_analysis(path: Path) -> str:
    if not path.exists():
        return DEFAULT_ANALYSIS
    text = path.read_text()
    if ANALYSIS_START in text and ANALYSIS_END in text:
        return text.split(ANALYSIS_START, 1)[1].split(ANALYSIS_END, 1)[0].strip()
    return DEFAULT_ANALYSIS


def render(r: Results, analysis: str, ledger_section: str | None = None) -> str:
    """The whole file. `ledger_section`: bench/ledger_report.py's section (this run's, or the one carried over
    from the file by existing_ledger_section); None leaves a placeholder."""
    parts = [_intro(), _environment(r), _kz_summary(r)]
    if "zab" in r.parts:
        parts += [_summary(r), _elections(r), _throughput(r), _fsync(r), _profile(r)]
    else:
        parts.append("## Zab layer (KV demo client)\n\nNot run in this run (`--only metastore`).\n")
    parts += [_kz_rows(r), _kz_failover(r), _kz_profile(r), ledger_section or ledger_report.not_run(),
              _analysis(analysis), _problems(r)]
    return "\n".join(parts)


def _analysis(analysis: str) -> str:
    return f"## Analysis\n\n{ANALYSIS_START}\n{analysis}\n{ANALYSIS_END}\n"


def ledger_only(path: Path, section: str) -> str:
    """The file after a run of `--only ledger`: its section replaced, the intro rewritten, the rest kept."""
    text = path.read_text() if path.exists() else "\n".join([_intro(), _analysis(DEFAULT_ANALYSIS)])
    return ledger_report.splice(text, section, _intro())


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{1000 * seconds:,.1f} ms"


# -- sections -------------------------------------------------------------------------------


def _intro() -> str:
    return """# Benchmarks

A local 3-node Quire cluster beside Apache ZooKeeper 3.8 (Debian's `zookeeper`
package) run the same way on the same machine as the reference, in two parts,
a third part that measures bookies and ledgers against this machine's disk, and
a fourth that measures what TLS on every port costs each system:

* **Metastore** (`bench/kzbench.py`, `bench/kzworker.py`): one kazoo-driven workload, unchanged, against
  the ZooKeeper ensemble and against `clusterd` with `client_protocol = "zookeeper"`, in one run, reported
  as Quire/ZooKeeper ratios against the targets of issue 3.
* **Zab layer** (the rest of `bench/`): failover, broadcast throughput and group commit, measured with the
  KV demo client (Quire) and kazoo (ZooKeeper).
* **Ledgers and bookies** (`bench/ledger.py`, `bench/ledger_load.py`, `bench/ledger_proc.py`): one bookie's
  storage engine and a 3-node cluster through the ledger SDK, against the disk's own rates measured in the
  same run, reported against the targets of issue 4 (section 8, which records its own run), with the floor
  the 64 KB row stands on (`bench/write_floor.py`: the same bytes through minimal bookies, no protocol).
* **TLS** (`bench/tls.py`): Quire and ZooKeeper each run plain and with TLS on every port side by side, the
  same rows alternating between the two copies, reported as TLS/plain ratios against the targets of
  issue 17 (section 9, which records its own run).

The suite runs on demand, never as part of the tests (tests/ does not import bench/):

    bash bench/run.sh            # installs zookeeper, kazoo, py-spy if missing, then runs the suite
                                 # (PYTHON=/path/to/venv/bin/python: an interpreter with this project installed)
    python -m bench.run          # the suite alone (about 25 to 30 minutes); --quick for a smoke run
    python -m bench.run --only metastore   # one part only (the report then holds only that part)
    python -m bench.run --only ledger      # the ledger part (about 5 minutes): rewrites section 8 only
    python -m bench.run --only tls         # the TLS part (about 10 to 12 minutes): rewrites section 9 only
    python -m bench.run --help   # --no-zk, --keep (keep the temp dirs and logs), --workdir, --output

Every benchmark starts its own cluster from a copy of cluster.toml (or a zoo.cfg
per server) with free ports in a temp dir; every server listens on 127.0.0.1 only.
The figures below are those of the last run; everything in this file except the
Analysis section is regenerated by `bench.run` (a run of `--only ledger` or `--only tls`
rewrites section 8 or 9 only, and the other parts' runs carry them over).
"""


def _environment(r: Results) -> str:
    f = r.facts
    quiet = "yes" if r.quiet[0] else "no"
    lines = ["## The run recorded here", "",
             "| | |", "| --- | --- |",
             f"| command | `{f['command']}` |", f"| date | {f['date']} |", f"| git commit | {f['git']} |",
             f"| nproc | {f['nproc']} |", f"| CPU | {f['cpu']} |", f"| RAM | {f['ram']} |",
             f"| kernel | {f['kernel']} |", f"| Python | {f['python']} |", f"| Java | {f['java']} |",
             f"| ZooKeeper | {r.zk_version or 'not run: ' + r.zk_unavailable} |",
             f"| data dirs | `{f['data_dir']}` |",
             f"| machine idle at start | {quiet} (busy {100 * r.quiet[1]:.0f}% of all CPUs in the last second "
             "checked; other people's jobs share this machine) |",
             f"| suite duration | {r.duration_s / 60:.1f} min |", "",
             "`df -T` of the data dirs:", "", "```", f["df"], "```", ""]
    if r.busy_processes:
        lines += ["Busiest processes when the suite gave up waiting for a quiet machine:", "", "```",
                  *r.busy_processes, "```", ""]
    if r.busy_sections:
        busy = ", ".join(f"{name} ({100 * b:.0f}%)" for name, b in r.busy_sections)
        lines += [f"Sections that started on a busy machine after waiting {QUIET_WAIT_SECTION_S:g} s "
                  f"(CPU busy before the start): {busy}.",
                  ""]
    s = r.sizes
    lines += [f"Sizes: {s.election_runs} elections per system; {s.single_writes} timed writes with 1 outstanding "
              f"(after {s.warmup_single} warm-up writes), {s.many_writes} with {s.many} outstanding (after "
              f"{s.warmup_many}); disk loop {s.fsync_loop_s:g} s; status polled every "
              f"{1000 * s.poll_interval_s:g} ms. Metastore part: {s.kz_window_s:g} s timed window per row after "
              f"{s.kz_warmup_s:g} s of warm-up in each client process; {s.kz_failovers} leader SIGKILLs per "
              f"system; {s.kz_profile_s:g} s py-spy window.", ""]
    return "\n".join(lines)


def _summary(r: Results) -> str:
    rows = ["## Summary: Zab layer (KV demo client)", "",
            "Quire/ZooKeeper ratio: above 1 means Quire takes longer (times) or does more (rates).", "",
            "| figure | Quire | ZooKeeper | Quire/ZK |", "| --- | ---: | ---: | ---: |"]

    def row(name: str, ours: float | None, theirs: float | None, fmt) -> None:  # noqa: ANN001
        rows.append(f"| {name} | {fmt(ours)} | {fmt(theirs)} | {fmt_ratio(ratio(ours, theirs))} |")

    q, z = r.elections.get("Quire", []), r.elections.get("ZooKeeper", [])
    for label, attr in (("leader seen", "leader_s"), ("first write acked", "write_s")):
        qt, zt = _times(q, attr), _times(z, attr)
        row(f"failover, SIGKILL to {label}: median", _med(qt), _med(zt), _ms)
        row(f"failover, SIGKILL to {label}: worst", _max(qt), _max(zt), _ms)
    for value_bytes in r.sizes.value_sizes:
        for concurrency in (1, r.sizes.many):
            qr, zr = r.workload("Quire", value_bytes, concurrency), r.workload("ZooKeeper", value_bytes, concurrency)
            name = f"{value_bytes} B, {concurrency} outstanding"
            row(f"{name}: writes/s", qr and qr.throughput, zr and zr.throughput, lambda v: fmt_num(v, 0))
            row(f"{name}: p50 commit latency", qr and qr.latency_ms(50) / 1000, zr and zr.latency_ms(50) / 1000, _ms)
            row(f"{name}: p99 commit latency", qr and qr.latency_ms(99) / 1000, zr and zr.latency_ms(99) / 1000, _ms)
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


def _elections(r: Results) -> str:
    lines = ["## 1. Failover: election after SIGKILL of the leader", "",
             "Three nodes serve; the leader is SIGKILLed; the two survivors are polled until one is leader "
             "(Quire: admin `/status` says role `leader`, phase `broadcast`; ZooKeeper: `srvr` says "
             "`Mode: leader`, which ZooKeeper reports when it starts leading, before its followers have synced, "
             "so it is an earlier point of the protocol than Quire's). Then one write is sent to the new leader "
             "on a fresh connection (ZooKeeper: a new kazoo session, retrying every poll interval) and the time "
             "of its acknowledgement recorded: that is the comparable figure. The killed node is restarted and "
             "the next run waits until all three serve.", ""]
    if not r.elections:
        return "\n".join(lines + ["No election ran (see Problems).", ""])
    lines += ["| system | runs | leader seen: median | worst | first write: median | worst | failed runs |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for system, samples in r.elections.items():
        leader, write = _times(samples, "leader_s"), _times(samples, "write_s")
        failed = sum(1 for s in samples if s.leader_s is None or s.write_s is None)
        lines.append(f"| {system} | {len(samples)} | {_ms(_med(leader))} | {_ms(_max(leader))} | "
                     f"{_ms(_med(write))} | {_ms(_max(write))} | {failed} |")
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


def _throughput(r: Results) -> str:
    lines = ["## 2. Broadcast throughput and commit latency", "",
             "Fixed count of writes (each a put/set of the value to one of 64 keys), one cluster per row. "
             "1 outstanding: one client on the leader. Many outstanding: Quire, that many connections through "
             "the project's KVClient (the server runs one request per connection at a time), spread over the "
             "three client ports; ZooKeeper, kazoo `set_async` pipelined on one session per server. Latency is "
             "per write, from the client's send to its acknowledgement. CPU columns: average cores used during "
             "the timed phase (the bench client is this Python process; 'others' is whatever else ran on the "
             "machine).", "",
             "| system | workload | ok | errors | writes/s | p50 | p99 | max | CPU (cores) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for w in r.workloads:
        o = w.outcome
        errors = sum(o.errors.values())
        lines.append(f"| {w.system} | {w.spec.name} | {o.ok} | {errors} | {w.throughput:,.0f} | "
                     f"{_ms(stats.percentile(o.latencies_s, 50))} | {_ms(stats.percentile(o.latencies_s, 99))} | "
                     f"{_ms(max(o.latencies_s) if o.latencies_s else None)} | {w.cpu.summary() if w.cpu else ''} |")
    lines.append("")
    errors = [(w, e) for w in r.workloads for e in w.outcome.error_samples]
    if errors:
        lines += ["Errors returned to the clients:", ""] + [f"- {w.system} {w.spec.name}: `{e}`" for w, e in errors]
        lines.append("")
    return "\n".join(lines)


def _fsync(r: Results) -> str:
    lines = ["## 3. Group commit: transactions per fsync", "",
             "Log counters read before and after the timed phase of each run (the many-outstanding runs first; "
             "the 1-outstanding rows show the cost of one fsync inside each server at low load). Quire: "
             "`/status` `log` (records_synced, syncs, fsync_seconds_total). ZooKeeper: `mntr` "
             "(`zk_sum_sync_processor_batch_size`, `zk_cnt_fsynctime`, `zk_sum_fsynctime`; those also count "
             "the few session txns of the benchmark's own clients). ZooKeeper records each fsync's duration "
             "in whole milliseconds, truncated (`FileTxnLog.commit`), so its mean fsync is a lower bound and "
             "reads near 0 when fsyncs take well under 1 ms; Quire's is measured with `time.perf_counter()` "
             "around the call in the writer thread, so it includes getting the GIL back.", ""]
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


def _profile(r: Results) -> str:
    lines = ["## 4. Profile of the Quire leader under many outstanding writes", ""]
    p = r.profile
    if p is None:
        return "\n".join(lines + ["Not run (see Problems).", ""])
    cpu = p.cpu
    lines += [f"py-spy {_SAMPLING} on the leader during {r.sizes.profile_writes} writes, {r.sizes.many} outstanding, "
              f"100 B values ({p.throughput:,.0f} writes/s with the profilers attached). The leader used "
              f"{(cpu.user_s + cpu.system_s) / cpu.wall_s:.2f} cores: {cpu.user_s / cpu.wall_s:.2f} user, "
              f"{cpu.system_s / cpu.wall_s:.2f} system (from /proc over {cpu.wall_s:.1f} s).", "",
              "Two samplers ran at once: `--gil` counts only the thread holding the GIL, i.e. where the "
              "interpreter's CPU goes; the default mode counts every thread that is not idle, which also "
              "includes the log writer's thread while it waits in fsync and threads that are runnable but "
              "waiting for a CPU (this machine has two for five busy processes). Percentages are of each "
              "profile's samples; lines of a function are merged.", ""]
    for prof in p.profiles:
        lines += _profile_tables(prof)
    return "\n".join(lines)


_SAMPLING = "`record --nonblocking --rate 200`"


def _profile_tables(p: Profile, role: str = "Leader") -> list[str]:
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


def _problems(r: Results) -> str:
    lines = ["## Problems seen under load", "",
             "Collected automatically: sections that failed, errors returned to clients, and every warning, "
             "error or traceback in the servers' logs, grouped (numbers blanked) with a first example. "
             "Quire nodes ran with `--log-level info`.", ""]
    if r.zk_unavailable:
        lines += [f"ZooKeeper was not run: {r.zk_unavailable}", ""]
    for failure in r.failures:
        lines += ["Failed section:", "", "```", failure.rstrip(), "```", ""]
    errors = [w for w in r.workloads if w.outcome.errors]
    for w in errors:
        lines.append(f"- {w.system} {w.spec.name}: client errors {dict(w.outcome.errors)}")
    if errors:
        lines.append("")
    lines += _kz_problems(r)
    for scan in r.scans:
        findings = scan.findings
        if not findings:
            lines += [f"No warnings or errors in the {scan.files} log files of {scan.label}.", ""]
            continue
        lines += [f"{scan.label}: {scan.files} log files (`<benchmark>/<node>`).", "",
                  "| count | pattern | logs |", "| ---: | --- | --- |"]
        for f in findings:
            where = ", ".join(f.sources[:4]) + (f" and {len(f.sources) - 4} more" if len(f.sources) > 4 else "")
            lines.append(f"| {f.count} | `{f.pattern[:140]}` | {where} |")
        lines += ["", "First example of each:", "", "```"]
        lines += [f.example[:700] for f in findings]
        lines += ["```", ""]
    return "\n".join(lines)


# -- helpers -------------------------------------------------------------------------------


def _times(samples: list[Sample], attr: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, attr)) is not None]


def _med(values: list[float]) -> float | None:
    return stats.median(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def _node(w: Result, role: str) -> FsyncStats | None:
    return next((f for f in w.fsync if f.role == role), None)


def _cpu_ms_per_write(w: Result) -> float | None:
    """Milliseconds of CPU all three servers spent per acknowledged write."""
    if not w.cpu or not w.outcome.ok:
        return None
    servers = sum(v for k, v in w.cpu.cores.items() if k != "bench client")
    return 1000 * servers * w.cpu.wall_s / w.outcome.ok


# -- the metastore part (bench/kzbench.py) ----------------------------------------------------------

_KZ_TARGETS = {  # key -> (figure, how the ratio is read, target ratio) per issue 3
    "write-100-128": ("rate", ">=", 1.0), "write-1024-128": ("rate", ">=", 1.0),
    "sync-100": ("p50", "<=", 1.5), "read-100": ("rate", ">=", 0.8), "cas": ("rate", ">=", 1.0),
}
FAILOVER_TARGET_S = 0.35


def _kz_rate_unit(load: kzbench.Load) -> str:
    return {"write": "writes/s", "read": "reads/s", "cas": "increments/s"}[load.op]


def _kz_verdict(value: float | None, sense: str, target: float) -> str:
    if value is None:
        return "n/a"
    met = value >= target if sense == ">=" else value <= target
    return "yes" if met else "**no**"


def _kz_summary(r: Results) -> str:
    lines = ["## Summary: metastore over the ZooKeeper client protocol (kazoo)", ""]
    m = r.metastore
    if m is None:
        return "\n".join(lines + ["Not run in this run (see Problems).", ""])
    lines += ["The same kazoo workload against ZooKeeper and against Quire (`client_protocol = \"zookeeper\"`), "
              "rows interleaved in one run (section 5). Ratio Quire/ZooKeeper: above 1 means Quire takes longer "
              "(times) or does more (rates). Targets from issue 3; server CPU is utime+stime of the three "
              "server processes over the timed window, per acknowledged operation.", "",
              "| figure | Quire | ZooKeeper | Quire/ZK | target | met |", "| --- | ---: | ---: | ---: | ---: | :---: |"]

    def add(name: str, q: float | None, z: float | None, fmt,  # noqa: ANN001 - a formatter
            target: str = "", verdict: str = "") -> None:
        lines.append(f"| {name} | {fmt(q)} | {fmt(z)} | {fmt_ratio(ratio(q, z))} | {target} | {verdict} |")

    def ms(v: float | None) -> str:
        return "n/a" if v is None or math.isnan(v) else f"{v:,.2f} ms"

    def us(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.0f} us"

    def num(v: float | None) -> str:
        return fmt_num(v, 0)

    for load in kzbench.loads():
        q, z = m.row("Quire", load.key), m.row("ZooKeeper", load.key)
        target = _KZ_TARGETS.get(load.key)
        if load.key.startswith("sync"):
            for pct in (50, 99):
                qv, zv = q and q.latency_ms(pct), z and z.latency_ms(pct)
                t = target if target and pct == 50 else None
                add(f"{load.title}: p{pct} latency", qv, zv, ms, f"<= {t[2]:g}x" if t else "",
                    _kz_verdict(ratio(qv, zv), t[1], t[2]) if t else "")
            continue
        qv, zv = q and q.rate, z and z.rate
        add(f"{load.title}: {_kz_rate_unit(load)}", qv, zv, num, f"{target[1]} {target[2]:g}x" if target else "",
            _kz_verdict(ratio(qv, zv), target[1], target[2]) if target else "")
        if load.op == "write" and load.outstanding == 128:
            qc, zc = q and q.server_cpu_us_per_op, z and z.server_cpu_us_per_op
            add(f"{load.title}: server CPU per write", qc, zc, us, "<= 1x", _kz_verdict(ratio(qc, zc), "<=", 1.0))
    qf, zf = _kz_failover_median(m, "Quire"), _kz_failover_median(m, "ZooKeeper")
    lines.append(f"| writes resume after SIGKILL of the leader: median | {_ms(qf)} | {_ms(zf)} | "
                 f"{fmt_ratio(ratio(qf, zf))} | <= {1000 * FAILOVER_TARGET_S:.0f} ms | "
                 f"{_kz_verdict(qf, '<=', FAILOVER_TARGET_S)} |")
    lines.append("")
    sat = m.row("Quire", kzbench.SATURATING), m.row("ZooKeeper", kzbench.SATURATING)
    for row in sat:
        if row is not None:
            lines.append(f"- Bottleneck at saturation ({row.system}, {row.load.title}): {row.bottleneck()}.")
    lines.append("")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _kz_failover_median(m: kzbench.Results, system: str) -> float | None:
    times = [s.resume_s for s in m.failovers.get(system, []) if s.resume_s is not None]
    return stats.median(times) if times else None


def _kz_rows(r: Results) -> str:
    lines = ["## 5. Metastore: every kazoo row", ""]
    m = r.metastore
    if m is None:
        return "\n".join(lines + ["Not run.", ""])
    lines += [f"Both systems run side by side for the whole part (an idle Quire cluster uses about 0.06 cores, an "
              f"idle ZooKeeper ensemble about 0.01: it shows under 'others' while the other system is measured). "
              f"Each row: P kazoo processes (`bench/kzworker.py`) x N outstanding requests each, "
              f"{m.warmup_s:g} s of warm-up, then one common {m.window_s:g} s window; only operations "
              f"acknowledged inside it count. The latency-bound rows (synchronous writes, CAS) run "
              f"{kzbench.LATENCY_ROUNDS} such windows per system, ZooKeeper and Quire alternating, pooled into "
              f"one row (operations, latencies and CPU of all the windows): a single window of one of them moves "
              f"by up to 2x between neighbours on this shared machine. Processes are spread over the three servers (process i on server "
              f"i mod 3), except the synchronous rows, which run one process on the leader. Writes: `set` of the "
              f"value to one of {kzbench.KEYS} znodes in turn (1 outstanding: blocking `set()`; more: `set_async` "
              f"under a semaphore). Reads: `get_async` of the same znodes. CAS: 4 processes increment one "
              f"counter with `get` then `set(version=...)`, retrying on BadVersion; latency is per acknowledged "
              f"increment, retries included. Before the first row each system ran {kzbench.JIT_WARMUP_S:g} s of "
              f"untimed saturating writes (the JVM's JIT).", "",
              "CPU over the window, from /proc/<pid>/stat utime+stime, in cores: servers (the three server "
              "processes), leader (its share of that), clients (the kazoo processes), others (everything else on "
              "the machine, from /proc/stat). Per-operation CPU is cores x window / acknowledged operations. "
              "'Leader run / wait': from /proc/<pid>/task/<tid>/schedstat, the share of the window the leader was "
              "on a CPU and runnable but waiting for one; for Quire its event-loop thread (the one thread that "
              "runs all its Python code), for ZooKeeper all its threads summed (so it can exceed 100%). "
              "Run + wait near 100% for Quire means its event loop never idled: it was the serial bottleneck, "
              "and the wait part is what a less crowded machine would give back.", "",
              "| system | row | ok | errors | rate/s | p50 | p99 | max | server CPU/op | client CPU/op | "
              "servers | leader | clients | others | machine | leader run / wait |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: |"]
    for row in m.rows:
        lat = row.latencies
        c = row.cpu
        lines.append(
            f"| {row.system} | {row.load.title} | {row.ok} | {sum(row.errors.values())} | {row.rate:,.0f} | "
            f"{_ms(stats.percentile(lat, 50))} | {_ms(stats.percentile(lat, 99))} | {_ms(max(lat) if lat else None)} | "
            f"{fmt_num(row.server_cpu_us_per_op, 0)} us | {fmt_num(row.client_cpu_us_per_op, 0)} us | "
            f"{row.cores():.2f} | {row.leader_cores:.2f} ({row.leader}) | {row.cores(clients=True):.2f} | "
            f"{c.others_cores:.2f} | {c.machine_cores:.2f} | {_share(row.leader_run)} / {_share(row.leader_wait)} |")
    lines += ["", "Which side was the bottleneck, row by row (machine saturated when at least 85% of its CPUs were "
              "busy):", "", "| row | ZooKeeper | Quire |", "| --- | --- | --- |"]
    for load in kzbench.loads():
        cells = [(x.bottleneck() if (x := m.row(sys_, load.key)) else "n/a") for sys_ in ("ZooKeeper", "Quire")]
        lines.append(f"| {load.title} | {cells[0]} | {cells[1]} |")
    lines.append("")
    lines += ["System calls and context switches per acknowledged operation over the window (`perf stat -e "
              "raw_syscalls:sys_enter,context-switches -p <pid>` on each server, all threads; n/a where perf is "
              "missing or not allowed):", "",
              "| row | ZK leader syscalls | ZK all servers syscalls | ZK context switches | Quire leader syscalls | "
              "Quire all servers syscalls | Quire context switches |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for load in kzbench.loads():
        cells = []
        for sys_ in ("ZooKeeper", "Quire"):
            x = m.row(sys_, load.key)
            cells += ([fmt_num(x.per_op("syscalls", [x.leader]), 1), fmt_num(x.per_op("syscalls"), 1),
                       fmt_num(x.per_op("context_switches"), 1)] if x else ["n/a"] * 3)
        lines.append(f"| {load.title} | " + " | ".join(cells) + " |")
    lines.append("")
    cas = [x for x in m.rows if x.load.op == "cas"]
    if cas:
        lines += ["CAS under contention: " + "; ".join(
            f"{x.system} {x.rate:,.0f} increments/s with {x.retries} BadVersion retries "
            f"({x.retries / x.ok if x.ok else float('nan'):.2f} per increment)" for x in cas) + ".", ""]
    for check in m.counter_checks:
        lines.append(f"- {check}")
    if m.counter_checks:
        lines.append("")
    return "\n".join(lines)


def _kz_failover(r: Results) -> str:
    lines = ["## 6. Metastore: writes resume after SIGKILL of the leader", ""]
    m = r.metastore
    if m is None or not m.failovers:
        return "\n".join(lines + ["Not run (see Problems).", ""])
    lines += ["Before each run all three servers serve (`srvr`: one `Mode: leader`, two `Mode: follower`; Quire "
              "also every node in phase broadcast). One kazoo client is pinned to each survivor and sets a znode in "
              "a loop (blocking `set`, retried at once after an error; kazoo reconnects every 10 ms). Once both "
              f"have had {kzbench.PRE_KILL_ACKS} writes acknowledged, the leader (found with `srvr`) is SIGKILLed. "
              "Resume: from the SIGKILL to the acknowledgement of the first write *sent after* it, on either "
              "survivor (a write sent before may be acknowledged after the kill: the old leader committed it). "
              "Both: until each survivor's client had one. The killed server is restarted before the next run.",
              "", "| system | runs | resume: median | min | max | both survivors: median | max | failed runs |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for system, samples in m.failovers.items():
        resume = [s.resume_s for s in samples if s.resume_s is not None]
        both = [s.both_s for s in samples if s.both_s is not None]
        failed = sum(1 for s in samples if s.resume_s is None)
        lines.append(f"| {system} | {len(samples)} | {_ms(_med(resume))} | {_ms(min(resume) if resume else None)} | "
                     f"{_ms(_max(resume))} | {_ms(_med(both))} | {_ms(_max(both))} | {failed} |")
    lines.append("")
    for system, samples in m.failovers.items():
        cells = ", ".join(f"{1000 * s.resume_s:.0f}" if s.resume_s is not None else "none" for s in samples)
        errors = sum((s.errors for s in samples), Counter())
        lines += [f"{system}, every run (ms): {cells}. Client errors while the leader was gone: "
                  f"{dict(errors) or 'none'}.", ""]
        notes = [f"{s.killed}: {s.note}" for s in samples if s.note]
        if notes:
            lines += [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _kz_profile(r: Results) -> str:
    lines = ["## 7. Metastore: profile of the Quire leader under saturating kazoo writes", ""]
    m = r.metastore
    p = m.profile if m else None
    if p is None:
        return "\n".join(lines + ["Not run (see Problems).", ""])
    cpu = p.cpu
    load = next(x for x in kzbench.loads() if x.key == kzbench.SATURATING)
    lines += [f"py-spy {_SAMPLING} on the Quire leader during a {m.profile_s:g} s window of the row "
              f"\"{load.title}\" ({p.throughput:,.0f} writes/s with the two samplers attached). The leader used "
              f"{(cpu.user_s + cpu.system_s) / cpu.wall_s:.2f} cores: {cpu.user_s / cpu.wall_s:.2f} user, "
              f"{cpu.system_s / cpu.wall_s:.2f} system (from /proc over {cpu.wall_s:.1f} s). As in section 4: "
              "`--gil` counts the thread holding the GIL, the other profile every thread that is not idle.", ""]
    for prof in p.profiles:
        lines += _profile_tables(prof)
    if p.follower is not None and p.follower_cpu is not None:
        fc = p.follower_cpu
        lines += [f"A follower serving kazoo clients, sampled at the same time (GIL holder only); it used "
                  f"{(fc.user_s + fc.system_s) / fc.wall_s:.2f} cores ({fc.user_s / fc.wall_s:.2f} user, "
                  f"{fc.system_s / fc.wall_s:.2f} system).", ""]
        lines += _profile_tables(p.follower, "Follower")
    return "\n".join(lines)


def _kz_problems(r: Results) -> list[str]:
    m = r.metastore
    if m is None:
        return []
    lines = []
    for row in m.rows:
        if row.errors:
            lines.append(f"- metastore {row.system} {row.load.title}: client errors {dict(row.errors)}; e.g. "
                         + "; ".join(f"`{e}`" for e in row.error_samples[:2]))
        if row.bad_reads:
            lines.append(f"- metastore {row.system} {row.load.title}: {row.bad_reads} reads returned a value of "
                         "the wrong length")
    for check in m.counter_checks:
        if "DIFFERENT" in check:
            lines.append(f"- CAS counter mismatch: {check}")
    for system, samples in m.failovers.items():
        for s in samples:
            if s.note:
                lines.append(f"- metastore failover {system} ({s.killed}): {s.note}")
    return lines + [""] if lines else []
