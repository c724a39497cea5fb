"""`python -m bench.run [--quick] [--only zab|metastore|ledger|tls|large_tree] [--no-zk] [--keep] [...]`: run the suite, write the report.

Four parts run by default: the Zab layer (failover, broadcast throughput and
group commit: Quire through its own MetaClient, ZooKeeper through kazoo), the
metastore (kazoo against ZooKeeper and against Quire's ZooKeeper protocol),
ledgers and bookies against the disk (bench/ledger.py), and TLS on every port
against plain text, Quire's and ZooKeeper's (bench/tls.py). `--only ledger`
and `--only tls` rewrite only their own section of the report. A fifth part,
large state (bench/large_tree.py: a tree of 1,000,000 znodes and one of 1 GB,
snapshot, restart and a wiped follower's resync on both systems, peak RSS),
takes about 25 minutes on its own and runs only when asked: `--only large_tree`
(its sizes: --znodes, --znode-bytes, --big-znodes, --big-bytes, --no-big), which
rewrites its section (10) only.

Exit status 0 when every section ran, 1 when some failed (the report says
which and why), 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench import (large_tree, large_tree_report, ledger, ledger_report, machine, report, report_section, streams,
                   tablespace, tls, tls_report)
from bench.suite import FULL, PARTS, QUICK, QUIET_BUSY_MAX, Suite
from bench.verify import VERIFY_END, VERIFY_START
from bench.verify import write_section as write_verify_section

ALL_PARTS = PARTS + ("ledger", "tls")
ON_DEMAND = ("large_tree",)  # not in the default run: about 25 minutes of its own
LEDGER_QUIET_WAIT_S = 30.0  # before the ledger and TLS parts, alone or after the suite's parts

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="quire-bench-", dir=args.workdir))
    print(f"bench: working in {workdir}")
    failures: list[str] = []
    try:
        parts = (args.only,) if args.only else ALL_PARTS
        suite_parts = tuple(p for p in parts if p in PARTS)
        output = Path(args.output)
        results = None
        if suite_parts:
            suite = Suite(workdir, QUICK if args.quick else FULL, with_zk=not args.no_zk, repo=REPO, parts=suite_parts)
            results = suite.run(wait_quiet=not args.no_wait)
            failures += results.failures
        section = None
        if "ledger" in parts:
            _wait_quiet(args)  # after the suite's parts too: its metastore rows end saturating the machine
            ledger_results = ledger.run(workdir / "ledger", quick=args.quick)
            failures += ledger_results.failures
            section = ledger_report.render(ledger_results)
        tls_block = tls_report.existing_section(output)
        large_block = large_tree_report.existing_section(output)
        stream_block = report_section.existing_section(output, streams.START, streams.END)  # bench.streams' own
        table_block = report_section.existing_section(output, tablespace.START, tablespace.END)  # bench.tablespace's
        if "tls" in parts:
            _wait_quiet(args)
            tls_results = tls.run(workdir / "tls", quick=args.quick, with_zk=not args.no_zk)
            failures += tls_results.failures
            tls_block = tls_report.render(tls_results)
        if "large_tree" in parts:
            _wait_quiet(args)
            large_results = large_tree.run(workdir / "large_tree", large_tree.trees_of(args), with_zk=not args.no_zk,
                                           zk_heap=args.zk_heap, command=machine.facts(workdir, REPO)["command"])
            failures += large_results.failures + [x for f in large_results.figures for x in f.failures]
            large_block = large_tree_report.render(large_results)
        if results is not None:
            section = section or ledger_report.existing_section(output)
            verify_block = _existing_verify_section(output)
            output.write_text(report.render(results, report.existing_analysis(output), section))
            if verify_block:  # bench.verify's own section survives a full regeneration
                write_verify_section(output, verify_block)
        elif section is not None:
            output.write_text(report.ledger_only(output, section))
        if tls_block is not None:  # written last: in place of its old self, else before the analysis
            tls_report.splice(output, tls_block)
        if large_block is not None:  # the same, after section 9
            large_tree_report.splice(output, large_block)
        if stream_block is not None:  # after section 10
            report_section.splice(output, stream_block, streams.START, streams.END)
        if table_block is not None:  # after section 11
            report_section.splice(output, table_block, tablespace.START, tablespace.END)
        print(f"bench: wrote {output}")
    finally:
        if args.keep:
            print(f"bench: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of a minute or two")
    parser.add_argument("--only", choices=ALL_PARTS + ON_DEMAND, default=None,
                        help="run one part: zab (MetaClient and kazoo), metastore (kazoo, ZooKeeper protocol), ledger "
                             "(bookies and the ledger SDK against the disk), tls (each system plain and with TLS "
                             "on every port) or large_tree (a big znode tree: snapshot, restart, wiped follower, "
                             "peak RSS; not part of the default run); zab or metastore: the report is rewritten "
                             "with that part only (sections 8, 9 and 10 carried over); ledger: only section 8 is; "
                             "tls: only section 9; large_tree: only section 10")
    parser.add_argument("--no-zk", action="store_true", help="skip the ZooKeeper reference runs "
                                                             "(and so the metastore part)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine first")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (configs, data dirs, node logs)")
    parser.add_argument("--workdir", default=None, help="parent of the temp dir (default: the system's temp dir); "
                                                        "its filesystem is the one measured")
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"), help="default: docs/benchmarks.md")
    large = parser.add_argument_group("large_tree (bench/large_tree.py)")
    large_tree.add_arguments(large)
    return parser


def _wait_quiet(args: argparse.Namespace) -> None:
    if not args.no_wait:
        print(f"waiting up to {LEDGER_QUIET_WAIT_S:g} s for a quiet machine (below {100 * QUIET_BUSY_MAX:.0f}% CPU)...")
        machine.wait_quiet(max_busy=QUIET_BUSY_MAX, timeout_s=LEDGER_QUIET_WAIT_S)


def _existing_verify_section(output: Path) -> str | None:
    text = output.read_text() if output.exists() else ""
    if VERIFY_START not in text or VERIFY_END not in text:
        return None
    return VERIFY_START + text.split(VERIFY_START, 1)[1].split(VERIFY_END, 1)[0] + VERIFY_END


if __name__ == "__main__":
    sys.exit(main())

