"""`python -m bench.run [--quick] [--only zab|metastore] [--no-zk] [--keep] [...]`: run the suite, write the report.

Two parts run by default: the Zab layer with the KV demo client, and the
metastore (kazoo against ZooKeeper and against Quire's ZooKeeper protocol).

Exit status 0 when every section ran, 1 when some failed (the report says
which and why), 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench import report
from bench.suite import FULL, PARTS, QUICK, Suite

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="quire-bench-", dir=args.workdir))
    print(f"bench: working in {workdir}")
    try:
        parts = (args.only,) if args.only else PARTS
        suite = Suite(workdir, QUICK if args.quick else FULL, with_zk=not args.no_zk, repo=REPO, parts=parts)
        results = suite.run(wait_quiet=not args.no_wait)
        output = Path(args.output)
        output.write_text(report.render(results, report.existing_analysis(output)))
        print(f"bench: wrote {output} ({results.duration_s / 60:.1f} min)")
    finally:
        if args.keep:
            print(f"bench: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if results.failures else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of a minute or two")
    parser.add_argument("--only", choices=PARTS, default=None,
                        help="run one part: zab (KV demo client) or metastore (kazoo, ZooKeeper protocol); "
                             "the report is rewritten with that part only")
    parser.add_argument("--no-zk", action="store_true", help="skip the ZooKeeper reference runs "
                                                             "(and so the metastore part)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine first")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (configs, data dirs, node logs)")
    parser.add_argument("--workdir", default=None, help="parent of the temp dir (default: the system's temp dir); "
                                                        "its filesystem is the one measured")
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"), help="default: docs/benchmarks.md")
    return parser


if __name__ == "__main__":
    sys.exit(main())
