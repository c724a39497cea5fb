"""The Spark ledger verifier against a real 3-node cluster's bookies and metastore, and copies
with one crafted violation: a missing replica, a bad entry digest, an entry past a closed
ledger's end.

The run (once per module): three clusterd processes (voters and bookies); through the
ledger SDK, ledger A (E=3, Qw=2, Qa=2) gets 60 entries and is closed, ledger B (E=3, Qw=3,
Qa=2) gets 40 and stays open; a bookie is SIGKILLed and restarted between batches; then
the cluster stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bookie.client import BookiePool
from bookie.entry import Digester, DigestType
from bookie.storage_codec import encode_entry_record
from clusterd import config as cfg
from clusterd import localcluster
from ledger.client_sync import SyncLedgerClient
from replay.spark_ledger import CLOSED, ENTRY_DIGESTS, REPLICAS
from replay.verify_ledgers import verify
from replay.verify_report import Verdict
from replay.verify_zab import add_arguments
from cluster_fixtures import Cluster, copy_config
from verify_fixtures import drop_journals, rewrite_entry_logs

pytestmark = pytest.mark.multiprocess

NODES = (1, 2, 3)


@pytest.fixture(scope="module")
def ledger_run(tmp_path_factory) -> Iterator[tuple[Path, dict[str, int]]]:
    folder = tmp_path_factory.mktemp("verify-ledgers")
    path = copy_config(folder)
    # Node 3, the one SIGKILLed below, keeps its bookie journal in a directory of its own (where an
    # operator mounts a second device): restart, replay and the verifier all go through the link.
    text = path.read_text()
    assert 'data_dir = "data/node3"\n' in text
    path.write_text(text.replace('data_dir = "data/node3"\n',
                                 'data_dir = "data/node3"\nbookie_journal_dir = "journal3"\n'))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    config = cfg.load(path)
    ids = {}
    try:
        with SyncLedgerClient(config.client_addresses(), config.bookie_addresses()) as ledgers:
            a = ledgers.create(3, 2, 2)
            b = ledgers.create(3, 3, 2)
            ids = {"closed": a.ledger_id, "open": b.ledger_id}
            a.append_many([f"a{i}".encode() * 10 for i in range(30)])
            b.append_many([f"b{i}".encode() * 10 for i in range(20)])
            # B's appends return after Qa=2 of Qw=3 acks; an add still on its way to bookie 3 when it
            # dies starts an ensemble change with no spare bookie, which breaks B (as in BookKeeper).
            ledgers.run(every_request_answered, ledgers.client.pool)
            victim = next(n for n in config.nodes if n.id == 3)
            os.kill(localcluster.running_pid(victim), signal.SIGKILL)
            restarted = cluster.ctl("up")
            assert restarted.returncode == 0, restarted.stdout + restarted.stderr
            a.append_many([f"a{i}".encode() * 10 for i in range(30, 60)])
            b.append_many([f"b{i}".encode() * 10 for i in range(20, 40)])
            a.close()
    finally:
        cluster.ctl("down", "--timeout", "10")
    assert (folder / "data" / "node3" / "bookie" / "journal").is_symlink()
    assert list((folder / "journal3").glob("journal.*"))
    yield folder / "data", ids


async def every_request_answered(pool: BookiePool) -> None:
    with trio.fail_after(10):
        while any(s["in_flight"] for s in pool.statistics().values()):
            await trio.sleep(0.005)


@pytest.fixture
def dirs(ledger_run, tmp_path: Path) -> dict[int, Path]:
    copy = tmp_path / "data"
    shutil.copytree(ledger_run[0], copy, ignore=shutil.ignore_patterns("clusterd.pid", "clusterd.log"))
    return {n: copy / f"node{n}" for n in NODES}


def run_verify(dirs: dict[int, Path]) -> Verdict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return verify(parser.parse_args([str(d) for d in dirs.values()]))


def failed(verdict: Verdict) -> set[str]:
    return {c.name for c in verdict.checks if not c.passed}


def test_a_real_run_with_a_bookie_sigkill_passes(spark, ledger_run):
    folder, ids = ledger_run
    verdict = run_verify({n: folder / f"node{n}" for n in NODES})
    assert verdict.passed, verdict.to_json()
    assert verdict.facts["ledgers"] == 2 and verdict.facts["closed"] == 1
    # The closed ledger to its last entry, the open one to the highest LAC its entries carry (>= the first batch).
    assert verdict.check(REPLICAS).checked >= 60 + 20


def test_a_missing_replica_is_caught(spark, dirs, ledger_run):
    closed = ledger_run[1]["closed"]
    for n in (1, 2, 3):  # entry 7 of the closed ledger survives on no bookie of its write set but one
        drop_journals(dirs[n])
    rewrite_entry_logs(dirs[1], lambda ledger, entry, data: None if (ledger, entry) == (closed, 7) else data)
    rewrite_entry_logs(dirs[2], lambda ledger, entry, data: None if (ledger, entry) == (closed, 7) else data)
    rewrite_entry_logs(dirs[3], lambda ledger, entry, data: None if (ledger, entry) == (closed, 7) else data)
    verdict = run_verify(dirs)
    replicas = verdict.check(REPLICAS)
    assert failed(verdict) == {REPLICAS}
    assert replicas.violations == 1 and f"ledger {closed} entry 7: 0 valid copies" in replicas.examples[0]


def test_a_bad_entry_digest_is_caught(spark, dirs, ledger_run):
    closed = ledger_run[1]["closed"]

    def flip(ledger, entry, data):  # noqa: ANN001, ANN202
        if (ledger, entry) != (closed, 3):
            return data
        return data[:-1] + bytes([data[-1] ^ 0xFF])  # payload changed, record CRC recomputed: only the digest knows
    for n in NODES:  # on every bookie of its write set, whichever they are
        rewrite_entry_logs(dirs[n], flip)
    verdict = run_verify(dirs)
    digests = verdict.check(ENTRY_DIGESTS)
    assert ENTRY_DIGESTS in failed(verdict) and f"ledger {closed} entry 3: digest mismatch" in digests.examples[0]


def append_late_entry(node_dir: Path, ledger_id: int, entry_id: int) -> None:
    """A well-formed entry (valid CRC32C digest, as a writer that went on after the close would make)."""
    path = sorted((node_dir / "bookie" / "entrylogs").glob("entrylog.*"))[-1]
    data = Digester(DigestType.CRC32C, b"").package(ledger_id, entry_id, entry_id - 1, 99999, b"late")
    path.write_bytes(path.read_bytes() + encode_entry_record(ledger_id, entry_id, data))


def test_an_entry_past_a_closed_ledgers_end_on_an_ack_quorum_is_caught(spark, dirs, ledger_run):
    closed = ledger_run[1]["closed"]  # E=3, Qw=2, Qa=2, closed at entry 59
    for n in NODES:  # entry 60 on both bookies of its write quorum: it could have been acknowledged
        append_late_entry(dirs[n], closed, 60)
    verdict = run_verify(dirs)
    assert failed(verdict) == {CLOSED}
    example = verdict.check(CLOSED).examples[0]
    assert f"ledger {closed}: closed at entry 59 but entry 60 is on 2 bookies of its write quorum" in example


def test_entries_past_a_close_on_fewer_than_qa_bookies_are_only_noted(spark, dirs, ledger_run):
    # What a killed writer leaves when its last sends reached one bookie: never acknowledged (one copy
    # of the two Qa needs), so recovery rightly closed before them.
    closed = ledger_run[1]["closed"]
    append_late_entry(dirs[1], closed, 60)
    append_late_entry(dirs[1], closed, 61)
    verdict = run_verify(dirs)
    assert failed(verdict) == set()
    notes = " ".join(verdict.check(CLOSED).notes)
    assert f"ledger {closed}: entries 60..61 past the close" in notes, notes
