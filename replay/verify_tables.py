"""`python -m replay.verify_tables DIR... [--expect NAME=DIGEST]...` (or `clusterctl verify tables`):
replay every tablespace (docs/tablespace.md) from its checkpoint and its log on Spark.

The Zab logs are verified first (the ZabLog row); the tablespaces, their logs and checkpoint
records are read from the metastore tree replayed to the end of the committed history; the
payloads of their ledgers (checkpoints and log segments) are read from every bookie's journal and
entry logs. Each tablespace's state is its checkpoint (checked against the digest its record
names: TableCheckpoint) plus every change after the checkpoint's position, in log order
(TableReplay). With --expect NAME=DIGEST (a replica's `status` digest, taken at the log's end),
the replayed state must have that digest (TableState). The facts give each tablespace's replayed
position, keys and digest. Options, output and exit status as replay.verify_zab.
"""

from __future__ import annotations

import argparse
import sys
import time

from replay import verify_zab
from replay.verify_report import CheckResult, Verdict
from replay.verify_zab import add_arguments, zab_first

METADATA = "TableMetadata"


def verify(args: argparse.Namespace, progress=None) -> Verdict:  # noqa: ANN001 - a callable or None
    """Run the Zab checks, then replay every tablespace; one verdict (raises VerifyInputError)."""
    from replay.spark_stream import final_state, read_payloads
    from replay.verify_table_decode import CHECKPOINT, REPLAY, STATE, replay_tablespace

    started = time.monotonic()
    say = progress or (lambda message: None)
    zab_check, zab, ctx = zab_first(args, say)
    metadata = CheckResult(METADATA)
    say("reading the tablespaces: replaying the metastore to the end of its committed history")
    tablespaces, ledgers = [], []
    if ctx.tops:
        final = final_state(ctx.spark, ctx.frames.segments, ctx.snapshot_rows, ctx.tops, ctx.bases)
        tablespaces, ledgers = final.tablespaces, final.ledgers
        metadata.add(len(final.broken) + bool(final.error), ([final.error] if final.error else []) + final.broken)
    metadata.checked = len(tablespaces)
    wanted = {t.checkpoint["ledger_id"] for t in tablespaces if t.checkpoint}
    wanted |= {s.ledger_id for t in tablespaces if t.log for s in t.log.segments}
    say(f"{len(tablespaces)} tablespace(s), {len(wanted)} ledger(s); reading their entries")
    payloads, lacs = read_payloads(ctx.spark, ctx.frames.nodes, wanted)
    last_entries = {m.ledger_id: m.last_entry for m in ledgers if m.is_closed}
    expected = dict(e.split("=", 1) for e in args.expect or [])
    checks = {name: CheckResult(name) for name in (CHECKPOINT, REPLAY, STATE)}
    facts: dict[str, object] = {"tablespaces": len(tablespaces)}
    for t in tablespaces:
        replayed = replay_tablespace(t, payloads, lacs, last_entries)
        checks[CHECKPOINT].checked += t.checkpoint is not None
        checks[REPLAY].checked += 1
        for name, problems in replayed.problems.items():
            checks[name].add(len(problems), problems)
        digest = replayed.state.digest()
        facts[f"tablespace {t.name}"] = {"position": str(replayed.position), "keys": replayed.state.keys,
                                         "digest": digest, "changes replayed": replayed.changes,
                                         "checkpoint ledger": t.checkpoint["ledger_id"] if t.checkpoint else None}
        if t.name in expected:
            checks[STATE].checked += 1
            if expected[t.name] != digest:
                checks[STATE].add(1, [f"tablespace {t.name}: replayed to {replayed.position}, digest {digest}, "
                                      f"not the expected {expected[t.name]}"])
    missing = sorted(set(expected) - {t.name for t in tablespaces})
    checks[STATE].add(len(missing), [f"tablespace {name}: expected, not in the metastore" for name in missing])
    facts["metastore committed history"] = zab.facts.get("committed history")
    return Verdict("tables", [zab_check, metadata, *checks.values()], facts, time.monotonic() - started)


def add_table_arguments(parser: argparse.ArgumentParser, *, dirs_required: bool = True) -> None:
    add_arguments(parser, dirs_required=dirs_required)
    parser.add_argument("--expect", action="append", metavar="NAME=DIGEST",
                        help="a tablespace's digest as its replicas report it (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Verify, print, and return the exit status (verify_zab.run's printing and exit codes)."""
    return verify_zab.run(args, verify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.verify_tables", description=__doc__.splitlines()[0])
    add_table_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
