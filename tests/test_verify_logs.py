"""The Spark log and table verifiers (`clusterctl verify logs`, `verify tables`) against a real
3-node cluster's metastore and bookies, and copies with one crafted violation.

The run (once per module): a log whose segments roll every 2,000 bytes gets 120 records from a
writer that closes it, then 40 from a writer process SIGKILLed with its segment in progress; it
is truncated before its third segment and a subscription is committed. A tablespace gets 160
puts through a replica that checkpoints every 30 changes (so its log's head is truncated); the
replica is SIGKILLed and a second one takes over (recovering the log's open segment). Then the
cluster stops.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bookie.client import BookiePool
from cluster_fixtures import Cluster, copy_config, start_cluster
from cluster_fixtures import wait_for as wait_until
from ledger.client import LedgerClient
from metastore.client import MetaClient
from replay import verify_tables
from replay.verify_logs import verify
from replay.verify_report import Verdict
from replay.verify_stream_decode import RECORDS, SEGMENTS, SUBSCRIPTIONS, TRUNCATION
from replay.verify_table_decode import CHECKPOINT, REPLAY, STATE
from replay.verify_zab import add_arguments
from stream.log_metadata import LogSettings
from stream.namespace import Namespace
from stream.position import Position
from stream_fixtures import WRITER, acks_of, spawn
from table_fixtures import ReplicaProcess, wait_leader
from verify_fixtures import drop_journals, rewrite_entry_logs

pytestmark = pytest.mark.multiprocess

NODES = (1, 2, 3)


@pytest.fixture(scope="module")
def log_run(tmp_path_factory) -> Iterator[tuple[Path, dict]]:
    folder = tmp_path_factory.mktemp("verify-logs")
    cluster = start_cluster(Cluster(copy_config(folder)), timeout=120)
    facts: dict = {}
    try:
        async def first() -> None:
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool() as pool, \
                    LedgerClient(meta, pool) as ledgers:
                ns = Namespace(meta, ledgers)
                await ns.create("orders", LogSettings(roll_bytes=2000))
                async with ns.writer("orders") as w:
                    await w.write_many((i, b"r%03d" % i * 25) for i in range(60))
                    for i in range(60, 120):
                        await w.write(i, b"r%03d" % i * 25)
        trio.run(first)
        killed = spawn(cluster, WRITER, "orders", "1000", "4000", "k" * 100)
        lines: list[str] = []
        while len(acks_of(lines)) < 40:  # its segment in progress, with records acknowledged
            line = killed.stdout.readline()
            assert line, killed.stderr.read()
            lines.append(line)
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)

        async def second() -> None:
            async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool() as pool, \
                    LedgerClient(meta, pool) as ledgers:
                ns = Namespace(meta, ledgers)
                listing = await ns.truncate("orders", Position(3, 0, 0))
                facts["segments_left"] = len(listing.segments)
                await ns.commit("orders", "billing", Position(4, 0, 0))
                facts["ledgers"] = {s.seq: s.ledger_id for s in listing.segments}
        trio.run(second)
        facts["table_digest"] = table_run(cluster, folder)
    finally:
        cluster.ctl("down", "--timeout", "10")
    yield folder / "data", facts


def table_run(cluster: Cluster, folder: Path) -> str:
    """The tablespace story of the module doc; the digest both replicas reported."""
    done = cluster.ctl("table", "create", "vt", "--roll-bytes", "3000")
    assert done.returncode == 0, done.stderr
    first = ReplicaProcess(cluster, "vt", "v1", folder, "--checkpoint-every", "30")
    second = None
    try:
        assert wait_leader([first]) is first
        for i in range(160):  # the last checkpoint comes at about 150: the 10 after it are replayed
            status, _ = first.request("POST", "/tx", {"ops": [{"op": "put", "table": "t", "key": f"k{i % 40}",
                                                               "value": f"v{i}" * 20}]})
            assert status == 200
        assert wait_until(lambda: first.status()["checkpoints"] >= 3)
        digest = first.status()["digest"]
        second = ReplicaProcess(cluster, "vt", "v2", folder)
        first.signal(signal.SIGKILL)
        assert wait_leader([second], timeout_s=40) is second
        assert second.status()["digest"] == digest
        return digest
    finally:
        for r in (first, second):
            if r is not None:
                r.stop()


def run_verify(dirs: dict[int, Path]) -> Verdict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return verify(parser.parse_args([str(d) for d in dirs.values()]))


def test_a_real_log_with_a_takeover_after_sigkill_and_a_truncation_passes(spark, log_run):
    folder, facts = log_run
    verdict = run_verify({n: folder / f"node{n}" for n in NODES})
    assert verdict.passed, json.dumps(verdict.to_json(), indent=1)
    assert verdict.facts["logs"] == 2  # "orders" and the tablespace's
    assert verdict.facts["segments"] == verdict.check(SEGMENTS).checked > facts["segments_left"] >= 3
    assert verdict.check(RECORDS).checked >= 10 and verdict.check(SUBSCRIPTIONS).checked == 1
    assert verdict.check(TRUNCATION).checked == 2


def test_an_entry_lost_from_every_bookie_is_caught(spark, log_run, tmp_path):
    folder, facts = log_run
    copy = tmp_path / "data"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("clusterd.pid", "clusterd.log"))
    dirs = {n: copy / f"node{n}" for n in NODES}
    victim = facts["ledgers"][min(facts["ledgers"])]  # the first segment kept
    for n in NODES:
        drop_journals(dirs[n])
        rewrite_entry_logs(dirs[n], lambda ledger, entry, data: None if (ledger, entry) == (victim, 1) else data)
    verdict = run_verify(dirs)
    records = verdict.check(RECORDS)
    assert not records.passed and any("entry 1: no valid record set" in e for e in records.examples), records


def run_verify_tables(dirs: dict[int, Path], *expect: str) -> Verdict:
    parser = argparse.ArgumentParser()
    verify_tables.add_table_arguments(parser)
    return verify_tables.verify(parser.parse_args([str(d) for d in dirs.values()] + [f"--expect={e}" for e in expect]))


def test_a_tablespace_replays_from_its_checkpoint_and_log_to_what_its_replicas_reported(spark, log_run):
    folder, facts = log_run
    dirs = {n: folder / f"node{n}" for n in NODES}
    verdict = run_verify_tables(dirs, f"vt={facts['table_digest']}")
    assert verdict.passed, json.dumps(verdict.to_json(), indent=1)
    replayed = verdict.facts["tablespace vt"]
    assert replayed["keys"] == 40 and replayed["digest"] == facts["table_digest"]
    assert verdict.check(CHECKPOINT).checked == 1 and verdict.check(STATE).checked == 1
    assert 0 < replayed["changes replayed"] < 160  # the checkpoint covers the rest
    wrong = run_verify_tables(dirs, "vt=" + "0" * 64)
    assert {c.name for c in wrong.checks if not c.passed} == {STATE}


def test_a_damaged_checkpoint_is_caught(spark, log_run, tmp_path):
    folder, facts = log_run
    copy = tmp_path / "data"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("clusterd.pid", "clusterd.log"))
    dirs = {n: copy / f"node{n}" for n in NODES}
    verdict = run_verify_tables(dirs)
    checkpoint_ledger = int(verdict.facts["tablespace vt"]["checkpoint ledger"])
    for n in NODES:
        drop_journals(dirs[n])
        rewrite_entry_logs(dirs[n], lambda ledger, entry, data: None if ledger == checkpoint_ledger else data)
    damaged = run_verify_tables(dirs)
    assert not damaged.check(CHECKPOINT).passed and REPLAY not in {c.name for c in damaged.checks if not c.passed}
