"""docs/benchmarks.md from a suite's Results.

The file is regenerated on every run, except the hand-written analysis
between ANALYSIS_START and ANALYSIS_END, which is carried over so that a
rerun does not erase it (it names the run it was written for: check that it
still matches the figures above it).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from bench import kzbench, ledger_report, stats, zab_report
from bench.stats import fmt_ms, fmt_num, fmt_ratio, max_or_none, median_or_none, ratio
from bench.suite import QUIET_WAIT_SECTION_S, Results

ANALYSIS_START = "<!-- analysis:start (hand-written; kept when the file is regenerated) -->"
ANALYSIS_END = "<!-- analysis:end -->"
DEFAULT_ANALYSIS = "_No analysis written for this run yet._"


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
        parts += [zab_report.summary(r), zab_report.elections(r), zab_report.throughput(r), zab_report.fsync(r),
                  zab_report.profile(r)]
    else:
        parts.append(f"## {zab_report.TITLE}\n\nNot run in this run (`--only metastore`).\n")
    parts += [_kz_rows(r), _kz_failover(r), _kz_profile(r), ledger_section or ledger_report.not_run(),
              _analysis(analysis), _problems(r)]
    return "\n".join(parts)


def _analysis(analysis: str) -> str:
    return f"## Analysis\n\n{ANALYSIS_START}\n{analysis}\n{ANALYSIS_END}\n"


def ledger_only(path: Path, section: str) -> str:
    """The file after a run of `--only ledger`: its section replaced, the intro rewritten, the rest kept."""
    text = path.read_text() if path.exists() else "\n".join([_intro(), _analysis(DEFAULT_ANALYSIS)])
    return ledger_report.splice(text, section, _intro())


# -- sections -------------------------------------------------------------------------------


def _intro() -> str:
    return """# Benchmarks

A local 3-node Quire cluster beside Apache ZooKeeper 3.8 (Debian's `zookeeper`
package) run the same way on the same machine as the reference, in two parts,
a third part that measures bookies and ledgers against this machine's disk, a
fourth that measures what TLS on every port costs each system, and a fifth, run
only on demand, that loads a large znode tree into both:

* **Metastore** (`bench/kzbench.py`, `bench/kzworker.py`): one kazoo-driven workload, unchanged, against
  the ZooKeeper ensemble and against `clusterd`'s client ports (ZooKeeper's client protocol), in one run, reported
  as Quire/ZooKeeper ratios against the targets of issue 3.
* **Zab layer** (the rest of `bench/`): failover, broadcast throughput and group commit, measured with znode
  `setData` writes from the project's trio client `metastore.client.MetaClient` (Quire) and from kazoo
  (ZooKeeper), the same shapes of load on both; Quire's nodes there are voters only (no bookie role).
* **Ledgers and bookies** (`bench/ledger.py`, `bench/ledger_load.py`, `bench/ledger_proc.py`): one bookie's
  storage engine and a 3-node cluster through the ledger SDK, against the disk's own rates measured in the
  same run, reported against the targets of issue 4 (section 8, which records its own run), with the floor
  the 64 KB row stands on (`bench/write_floor.py`: the same bytes through minimal bookies, no protocol).
* **TLS** (`bench/tls.py`): Quire and ZooKeeper each run plain and with TLS on every port side by side, the
  same rows alternating between the two copies, reported as TLS/plain ratios against the targets of
  issue 17 (section 9, which records its own run).
* **Large state** (`bench/large_tree.py`, `bench/tree_loader.py`): a tree of 1,000,000 znodes of 100 B and one
  of 1 GB loaded into each system by the same kazoo processes; snapshot write time, restart to serving, a wiped
  follower's resynchronization and every server's peak RSS, against the targets of issue 19 (section 10, which
  records its own run; not part of the default run).

The suite runs on demand, never as part of the tests (tests/ does not import bench/):

    bash bench/run.sh            # installs zookeeper, kazoo, py-spy if missing, then runs the suite
                                 # (PYTHON=/path/to/venv/bin/python: an interpreter with this project installed)
    python -m bench.run          # the suite alone (about 25 to 30 minutes); --quick for a smoke run
    python -m bench.run --only metastore   # one part only (the report then holds only that part)
    python -m bench.run --only ledger      # the ledger part (about 5 minutes): rewrites section 8 only
    python -m bench.run --only tls         # the TLS part (about 10 to 12 minutes): rewrites section 9 only
    python -m bench.run --only large_tree  # large state (about 25 minutes; --znodes, --znode-bytes,
                                           # --big-znodes, --big-bytes, --no-big): rewrites section 10 only
    python -m bench.run --help   # --no-zk, --keep (keep the temp dirs and logs), --workdir, --output

Every benchmark starts its own cluster from a copy of cluster.toml (or a zoo.cfg
per server) with free ports in a temp dir; every server listens on 127.0.0.1 only.
The figures below are those of the last run; everything in this file except the
Analysis section is regenerated by `bench.run` (a run of `--only ledger`, `--only tls` or
`--only large_tree` rewrites section 8, 9 or 10 only, and the other parts' runs carry them over).
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
    lines += ["The same kazoo workload against ZooKeeper and against Quire's client ports (ZooKeeper's protocol), "
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
    lines.append(f"| writes resume after SIGKILL of the leader: median | {fmt_ms(qf)} | {fmt_ms(zf)} | "
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
            f"{fmt_ms(stats.percentile(lat, 50))} | {fmt_ms(stats.percentile(lat, 99))} | {fmt_ms(max_or_none(lat))} | "
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
        lines.append(f"| {system} | {len(samples)} | {fmt_ms(median_or_none(resume))} | "
                     f"{fmt_ms(min(resume) if resume else None)} | {fmt_ms(max_or_none(resume))} | "
                     f"{fmt_ms(median_or_none(both))} | {fmt_ms(max_or_none(both))} | {failed} |")
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
    lines += [f"py-spy {zab_report.SAMPLING} on the Quire leader during a {m.profile_s:g} s window of the row "
              f"\"{load.title}\" ({p.throughput:,.0f} writes/s with the two samplers attached). The leader used "
              f"{(cpu.user_s + cpu.system_s) / cpu.wall_s:.2f} cores: {cpu.user_s / cpu.wall_s:.2f} user, "
              f"{cpu.system_s / cpu.wall_s:.2f} system (from /proc over {cpu.wall_s:.1f} s). As in section 4: "
              "`--gil` counts the thread holding the GIL, the other profile every thread that is not idle.", ""]
    for prof in p.profiles:
        lines += zab_report.profile_tables(prof)
    if p.follower is not None and p.follower_cpu is not None:
        fc = p.follower_cpu
        lines += [f"A follower serving kazoo clients, sampled at the same time (GIL holder only); it used "
                  f"{(fc.user_s + fc.system_s) / fc.wall_s:.2f} cores ({fc.user_s / fc.wall_s:.2f} user, "
                  f"{fc.system_s / fc.wall_s:.2f} system).", ""]
        lines += zab_report.profile_tables(p.follower, "Follower")
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
