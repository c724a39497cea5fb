"""`python -m replay.verify_logs DIR...` (or `clusterctl verify logs DIR...`): check every named
log (docs/streams.md) on Spark against its segments' ledgers.

The logs and the ledger metadata live in the metastore, so the Zab logs are verified first (their
checks are summarised as ZabLog) and the znodes are read from the tree replayed to the end of the
committed history. Then every bookie's journal and entry logs are read for the segment ledgers'
entries, whose record sets are checked against the segment metadata: LogSegments, LogRecords,
LogTruncation, LogSubscriptions (replay/verify_stream_decode.py). Options, output and exit status
as replay.verify_zab; definitions in docs/verify.md.
"""

from __future__ import annotations

import argparse
import sys
import time

from replay import verify_zab
from replay.verify_report import MAX_EXAMPLES, CheckResult, Verdict
from replay.verify_zab import add_arguments, zab_first

METADATA = "LogMetadata"


def verify(args: argparse.Namespace, progress=None) -> Verdict:  # noqa: ANN001 - a callable or None
    """Run the Zab checks, then the log checks; one verdict (raises VerifyInputError)."""
    from replay.spark_stream import final_state, read_summaries
    from replay.verify_stream_decode import LogFindings, check_log

    started = time.monotonic()
    say = progress or (lambda message: None)
    zab_check, zab, ctx = zab_first(args, say)
    metadata = CheckResult(METADATA)
    say("reading the logs: replaying the metastore to the end of its committed history")
    logs, ledgers = [], []
    if ctx.tops:
        final = final_state(ctx.spark, ctx.frames.segments, ctx.snapshot_rows, ctx.tops, ctx.bases)
        logs, ledgers = final.logs, final.ledgers
        metadata.add(len(final.broken) + bool(final.error), ([final.error] if final.error else []) + final.broken)
    metadata.checked = len(logs)
    segment_ledgers = {s.ledger_id for view in logs for s in view.segments}
    say(f"{len(logs)} log(s), {len(segment_ledgers)} segment ledger(s); reading the bookies' record sets")
    summaries, lacs = read_summaries(ctx.spark, ctx.frames.nodes, segment_ledgers)
    found = LogFindings()
    by_id = {m.ledger_id: m for m in ledgers}
    for view in logs:
        check_log(view, summaries, lacs, by_id, found)
    checks = [zab_check, metadata]
    for name, violations in found.violations.items():
        result = CheckResult(name, checked=found.checked[name])
        result.add(len(violations), violations[:MAX_EXAMPLES])
        checks.append(result)
    facts = {"logs": len(logs), "segments": sum(len(v.segments) for v in logs), "records": found.records,
             "metastore committed history": zab.facts.get("committed history"),
             "spark startup s": zab.facts.get("spark startup s")}
    return Verdict("logs", checks, facts, time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    """Verify, print, and return the exit status (verify_zab.run's printing and exit codes)."""
    return verify_zab.run(args, verify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.verify_logs", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
