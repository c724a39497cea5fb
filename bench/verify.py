"""`python -m bench.verify [--records N ...] [--masters M ...]`: the Spark verifier's throughput.

For each size, synthetic logs of a converged 3-node metastore ensemble (bench/verify_data.py,
written by the project's own txn log writer) are verified by `python -m replay.verify_zab`
on each Spark master (a fresh JVM per run), and by the plain single-process scan of
bench/verify_scan.py. Before and after the Spark runs of a size, bench/verify_cores.py
measures how much the machine gives a second process for the same replay work: the
reference for the local[2] / local[1] ratio on a shared VM. Records verified per second = log records of all nodes / seconds,
Spark's JVM startup excluded (it is reported beside). The results replace the section
between VERIFY_START and VERIFY_END in docs/benchmarks.md (appended if absent).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench import machine
from bench.verify_data import generate

REPO = Path(__file__).resolve().parent.parent
VERIFY_START = "<!-- verify:start (written by python -m bench.verify) -->"
VERIFY_END = "<!-- verify:end -->"


def run_spark(dirs: list[Path], master: str, driver_memory: str) -> dict:
    command = [sys.executable, "-m", "replay.verify_zab", *map(str, dirs), "--master", master, "--json",
               "--driver-memory", driver_memory]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    verdict = json.loads(done.stdout)
    startup = verdict["facts"]["spark startup s"]
    return {"passed": verdict["passed"], "records": verdict["facts"]["records"], "wall_s": wall,
            "startup_s": startup, "verify_s": verdict["seconds"] - startup,
            "phases": phases(done.stderr, verdict["seconds"])}


# Progress lines of replay.verify_zab ("[  12.3s] message") that open each phase of the report.
PHASES = (("read", "reading "), ("decode+group", "aggregating "), ("checks", "Checksums"), ("replay", "Replay"))


def phases(stderr: str, total_s: float) -> dict[str, float]:
    """Seconds spent in each of PHASES, from the verifier's progress lines (the last runs to the end)."""
    starts: dict[str, float] = {}
    for line in stderr.splitlines():
        match = re.match(r"\[\s*([0-9.]+)s\] (.*)", line)
        if match is None:
            continue
        for name, prefix in PHASES:
            if name not in starts and match.group(2).startswith(prefix):
                starts[name] = float(match.group(1))
    names = [n for n, _ in PHASES if n in starts]
    ends = [starts[n] for n in names[1:]] + [total_s]
    return {n: round(end - starts[n], 1) for n, end in zip(names, ends)}


def run_scan(dirs: list[Path]) -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench.verify_scan", *map(str, dirs)], capture_output=True,
                          text=True, cwd=REPO, check=True)
    result = json.loads(done.stdout)
    result["wall_s"] = time.monotonic() - started
    result["passed"] = not (result["bad"] or result["misordered"] or result["differing"] or result["forks"]
                            or result["replay_digest_mismatches"])
    return result


def measure(size: int, masters: list[str], workdir: Path, driver_memory: str, log) -> dict:  # noqa: ANN001
    log(f"{size}: generating (reused if present) in {workdir / str(size)}")
    dirs = generate(workdir / str(size), size)
    row: dict = {"records": size, "spark": {}}
    _, busy = machine.wait_quiet(max_busy=0.3, timeout_s=60)
    log(f"{size}: plain scan (machine {busy:.0%} busy before)")
    row["scan"] = run_scan(dirs)
    row["scan"]["busy_before"] = busy
    log(f"{size}: plain scan {row['scan']['seconds']:.1f} s")
    row["cores"] = [run_cores(dirs, log, size)]
    for master in masters:
        _, busy = machine.wait_quiet(max_busy=0.3, timeout_s=60)
        log(f"{size}: spark {master} (machine {busy:.0%} busy before)")
        row["spark"][master] = run_spark(dirs, master, driver_memory)
        row["spark"][master]["busy_before"] = busy
        log(f"{size}: spark {master} {row['spark'][master]['verify_s']:.1f} s "
            f"(+{row['spark'][master]['startup_s']:.1f} s startup)")
    row["cores"].append(run_cores(dirs, log, size))
    return row


def run_cores(dirs: list[Path], log, size: int) -> dict:  # noqa: ANN001
    machine.wait_quiet(max_busy=0.3, timeout_s=60)
    done = subprocess.run([sys.executable, "-m", "bench.verify_cores", *map(str, dirs)], capture_output=True,
                          text=True, cwd=REPO, check=True)
    result = json.loads(done.stdout)
    log(f"{size}: machine scaling for replay tasks {result['scaling']:.2f}x "
        f"({result['serial_s']:.1f} s in one process, {result['parallel_s']:.1f} s in two)")
    return result


def render(rows: list[dict], masters: list[str], command: str) -> str:
    lines = [VERIFY_START, "## Spark verifier: Zab log records verified per second", "",
             f"Command: `{command}`; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
             f"{os.cpu_count()} CPUs ({machine.cpu_model()}), {machine.mem_total_gib():.1f} GiB RAM.", "",
             "Synthetic logs of a converged 3-node metastore ensemble (bench/verify_data.py: the project's "
             "own txn log writer, 2 epochs, a snapshot every 50,000 txns as cluster.toml's default, setData on 1000 znodes); every "
             "record is decoded (CRC, order, body digest; not the metastore type and path, which no check uses), every check runs, and "
             "every node's log is replayed through MetastoreStateMachine from each snapshot. Rates exclude "
             "the JVM startup (shown apart); `busy` is the machine's CPU use just before the run (shared machine).",
             "", "| records (3 nodes) | plain scan | " + " | ".join(f"Spark {m}" for m in masters)
             + " | local[2] / local[1] | machine: 2 processes / 1 | Spark local[2] / plain scan |",
             "|---|---|" + "---|" * len(masters) + "---|---|---|"]
    for row in rows:
        scan = row["scan"]
        cells = [f"{row['records']:,}", _rate(row["records"], scan["seconds"], scan["busy_before"])]
        for m in masters:
            s = row["spark"][m]
            cells.append(_rate(row["records"], s["verify_s"], s["busy_before"]) + f" (+{s['startup_s']:.0f} s startup)"
                         + ("" if s["passed"] else " FAILED"))
        one, two = row["spark"].get("local[1]"), row["spark"].get("local[2]")
        cells.append(f"{one['verify_s'] / two['verify_s']:.2f}x" if one and two else "n/a")
        cells.append(" / ".join(f"{c['scaling']:.2f}x" for c in row.get("cores", [])) or "n/a")
        cells.append(f"{scan['seconds'] / two['verify_s']:.2f}x" if two else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Targets (issue 5): local[2] at least 1.6x local[1]; Spark no slower than the plain scan "
              "at 10 million records.", "",
              "`machine: 2 processes / 1` is the reference for the scaling ratio (bench/verify_cores.py): the "
              "verifier's own replay tasks on the same logs, run one after another in one process and then split "
              "over two processes at once, measured just before local[1] and just after local[2]. It is what this "
              "VM gave a second busy process at that time; 2.00x would be perfect.", "", "Where the time goes (seconds; Spark: from its progress lines, JVM "
              "startup excluded, `other checks` includes checking every snapshot; plain scan: decoding and tallying every record, then the snapshots and the replays):", "",
              "| records | run | read (walk, plan) | decode + group | other checks | replay |", "|---|---|---|---|---|---|"]
    for row in rows:
        scan = row["scan"]
        lines.append(f"| {row['records']:,} | plain scan | | {scan['seconds'] - scan['replay_s']:.1f} | | "
                     f"{scan['replay_s']:.1f} |")
        for m in masters:
            p = row["spark"][m]["phases"]
            lines.append(f"| {row['records']:,} | Spark {m} | " + " | ".join(
                f"{p[name]:.1f}" if name in p else "" for name, _ in PHASES) + " |")
    lines.append(VERIFY_END)
    return "\n".join(lines)


def _rate(records: int, seconds: float, busy: float) -> str:
    return f"{records / seconds:,.0f}/s ({seconds:.1f} s, busy {busy:.0%})"


def write_section(output: Path, section: str) -> None:
    text = output.read_text() if output.exists() else "# Benchmarks\n"
    if VERIFY_START in text and VERIFY_END in text:
        head, rest = text.split(VERIFY_START, 1)
        text = head + section + rest.split(VERIFY_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    output.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verify", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--workdir", default="/tmp/quire-bench-verify", help="where the logs are generated (kept)")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"))
    args = parser.parse_args(argv)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)
    rows = [measure(size, args.masters, Path(args.workdir), args.driver_memory, log) for size in args.records]
    command = shlex.join(["python", "-m", "bench.verify", *(argv if argv is not None else sys.argv[1:])])
    write_section(Path(args.output), render(rows, args.masters, command))
    print(json.dumps(rows, indent=2))
    return 0 if all(r["scan"]["passed"] and all(s["passed"] for s in r["spark"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
