"""`python -m replay.verify_ledgers DIR...` (or `clusterctl verify ledgers DIR...`): check every
ledger's replicas on Spark against its metadata.

The metadata lives in the metastore, so the Zab logs are verified first (their checks are
summarised as ZabLog) and the ledger znodes are read from the tree replayed to the end of
the committed history. Then every bookie's journal and entry logs are decoded and joined
with the placements the metadata implies. Options, output and exit status as
replay.verify_zab; definitions in docs/verify.md.
"""

from __future__ import annotations

import argparse
import sys
import time

from replay.verify_report import CheckResult, Verdict
from replay import verify_zab
from replay.verify_zab import add_arguments, zab_first

METADATA = "LedgerMetadata"


def verify(args: argparse.Namespace, progress=None) -> Verdict:  # noqa: ANN001 - a callable or None
    """Run the Zab checks, then the ledger checks; one verdict (raises VerifyInputError)."""
    from replay.spark_ledger import check_ledgers, final_metadata, read_entries

    started = time.monotonic()
    say = progress or (lambda message: None)
    zab_check, zab, ctx = zab_first(args, say)
    metadata = CheckResult(METADATA)
    say("reading the ledger metadata: replaying the metastore to the end of its committed history")
    ledgers = []
    if ctx.tops:
        ledgers, broken, error = final_metadata(ctx.spark, ctx.frames.segments, ctx.snapshot_rows, ctx.tops, ctx.bases)
        metadata.add(len(broken) + bool(error), ([error] if error else []) + broken)
    metadata.checked = len(ledgers)
    say(f"{len(ledgers)} ledger(s) in the metadata; reading the bookies' journals and entry logs")
    entries, deleted, problems = read_entries(ctx.spark, ctx.frames.nodes)
    checks = check_ledgers(ctx.spark, entries, ledgers, deleted)
    checks[0].add(len(problems), problems)
    entries.unpersist()
    facts = {"ledgers": len(ledgers), "closed": sum(m.is_closed for m in ledgers),
             "metastore committed history": zab.facts.get("committed history"),
             "spark startup s": zab.facts.get("spark startup s")}
    return Verdict("ledgers", [zab_check, metadata, *checks], facts, time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    """Verify, print, and return the exit status (verify_zab.run's printing and exit codes)."""
    return verify_zab.run(args, verify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.verify_ledgers", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
