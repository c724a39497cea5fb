"""`python -m replay.verify_zab DIR...` (or `clusterctl verify zab DIR...`, or
`spark-submit replay/verify_zab.py DIR...`): check a cluster's Zab logs on Spark.

Each DIR is one node's data directory, named so that its id shows (node1, n1, 1)
or given as DIR=ID. Progress goes to stderr, the verdict table (or --json) to
stdout. Exit status: 0 every check passed, 1 some check failed, 2 the command
line or the input was refused. Checks and definitions: docs/verify.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from replay.verify_decode import DEFAULT_CHUNK_RECORDS, VerifyInputError
from replay.verify_report import CheckResult, Verdict, render_table

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ZAB_LOG = "ZabLog"


def add_arguments(parser: argparse.ArgumentParser, *, dirs_required: bool = True) -> None:
    """The options of `verify zab` (shared with clusterctl, where DIRs default to the config's)."""
    parser.add_argument("dirs", nargs="+" if dirs_required else "*", metavar="DIR[=ID]",
                        help="a node's data directory (one per node)")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default: spark-submit's --master when run by it, else local[*])")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--voters", type=int, default=None,
                        help="voters in the ensemble, for majorities (default: the number of DIRs)")
    parser.add_argument("--chunk-records", type=int, default=DEFAULT_CHUNK_RECORDS,
                        help=f"records per Spark task when decoding (default {DEFAULT_CHUNK_RECORDS})")
    parser.add_argument("--driver-memory", default=None, help="spark.driver.memory, e.g. 4g (local mode)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="Spark's console progress bar on stderr (default: when stderr is a terminal; under "
                        "spark-submit, its --conf spark.ui.showConsoleProgress)")


def verify(args: argparse.Namespace, progress=None) -> Verdict:  # noqa: ANN001 - a callable or None
    """Run every Zab check on `args.dirs`; returns the verdict (raises VerifyInputError)."""
    return verify_with_context(args, progress)[0]


def verify_with_context(args: argparse.Namespace, progress=None):  # noqa: ANN001, ANN201
    """verify(), also returning the checks' Context (frames, committed history, tops) for the
    ledger verifier, which reads the metadata from the same logs. The caller unpersists."""
    # Imported here so that `--help` and input errors need no JVM.
    from replay.spark_session import build_session
    from replay.spark_source import parse_dirs, read_zab
    from replay.spark_zab_checks import Context, run_checks

    started = time.monotonic()
    say = progress or (lambda message: None)
    nodes = parse_dirs(args.dirs)
    voters = args.voters or len(nodes)
    if voters < len(nodes):
        raise VerifyInputError(f"--voters {voters} is fewer than the {len(nodes)} directories given")
    say(f"starting Spark ({args.master or 'the master spark-submit was given, else local[*]'})")
    spark = build_session(args.master, driver_memory=args.driver_memory, progress=getattr(args, "progress", None))
    spark_started = time.monotonic() - started
    say(f"Spark master: {spark.sparkContext.master}")
    say(f"reading {len(nodes)} node(s): {', '.join(f'{n.node}={n.path}' for n in nodes)}")
    frames = read_zab(spark, nodes, chunk_records=args.chunk_records, with_txn=False)
    say(f"decoding {sum(s.layout.records for s in frames.segments)} records in {len(frames.segments)} segments")
    ctx = Context(spark, frames, voters, say)
    checks = run_checks(ctx)  # its first job decodes (the records stay cached) and counts them
    records = ctx.records
    frames.unpersist()
    facts = {"nodes given": len(nodes), "records": records, "spark master": spark.sparkContext.master,
             "spark application": spark.sparkContext.applicationId, "spark startup s": round(spark_started, 2),
             **ctx.facts}
    return Verdict("zab", checks, facts, time.monotonic() - started), ctx


def zab_first(args: argparse.Namespace, say: Callable[[str], None]):  # noqa: ANN201 - (CheckResult, Verdict, Context)
    """For the verifiers of what lives in the metastore (ledgers, logs): the Zab checks first,
    summarised as one ZabLog row naming the failed checks, with their verdict and Context."""
    zab, ctx = verify_with_context(args, say)
    failed = [c.name for c in zab.checks if not c.passed]
    row = CheckResult(ZAB_LOG, checked=len(zab.checks), violations=len(failed),
                      examples=[f"{name} failed: run `verify zab` for details" for name in failed])
    return row, zab, ctx


def progress_printer(started: float | None = None):  # noqa: ANN201 - a callable
    """A progress callback printing `[  1.2s] message` lines to stderr."""
    origin = time.monotonic() if started is None else started

    def say(message: str) -> None:
        print(f"[{time.monotonic() - origin:6.1f}s] {message}", file=sys.stderr, flush=True)
    return say


def run(args: argparse.Namespace, verifier: Callable[..., Verdict] | None = None) -> int:
    """Verify (with `verifier`, this module's `verify` by default), print, and return the exit status.
    The ledger verifier's command runs through here too."""
    try:
        verdict = (verifier or verify)(args, progress_printer())
    except VerifyInputError as err:
        print(f"verify: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(verdict.to_json() if args.json else render_table(verdict))
    return EXIT_OK if verdict.passed else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.verify_zab", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
