"""The Spark Zab verifier against logs of a real 3-node metastore run with a leader SIGKILL,
and against copies of them where one violation was crafted with the project's own encoders.

The run (once per module, tests/verify_fixtures.py): three clusterd processes speak the ZooKeeper protocol and
snapshot every 100 txns; kazoo writes through them; a third of the way in the leader is
SIGKILLed (a new epoch starts), later restarted; once every node has committed the same
zxid the cluster stops. Each test copies the data directories, damages one thing, and
checks that exactly the check that should notice it does, with the offender in its examples.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from metastore.wire.snapshot_codec import decode_snapshot, encode_tree
from replay.logs import check_logs_agree
from replay.spark_zab_checks import (AGREEMENT, CHECK_NAMES, CHECKSUMS, EPOCH_ORDER, PREFIX, QUORUM, REPLAY,
                                     SKIPPED)
from replay.spark_ledger import read_entries
from replay.spark_source import parse_dirs, read_zab
from replay.verify_report import Verdict
from replay.verify_zab import add_arguments, verify
from replay.verify_zab import main as verify_main
from cluster_fixtures import ENV, REPO
from verify_fixtures import NODES, WRITES, real_run  # noqa: F401 - real_run is a fixture of this module's tests
from zab.core import zxid as Z
from zab.storage.record import encode_record, scan_records
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR
from zab.storage.snapshot import SnapshotStore
from zab.core.txn import Txn
from zab.storage.txnlog import SEGMENT_HEADER_BYTES, TxnLog, decode_segment_header, encode_segment_header, segment_name

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def dirs(real_run: Path, tmp_path: Path) -> dict[int, Path]:
    """A private copy of the run's data directories, for a test to damage."""
    copy = tmp_path / "data"
    shutil.copytree(real_run, copy, ignore=shutil.ignore_patterns("clusterd.pid", "clusterd.log"))
    return {n: copy / f"node{n}" for n in NODES}


def run_verify(dirs: dict[int, Path], *extra: str) -> Verdict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return verify(parser.parse_args([*(str(d) for d in dirs.values()), *extra]))


def failed(verdict: Verdict) -> set[str]:
    return {c.name for c in verdict.checks if not c.passed}


# -- crafting, with the project's own encoders -----------------------------------------------------

def segments(node_dir: Path) -> list[Path]:
    return sorted((node_dir / TXNLOG_DIR).glob("log.*"))


def read_segment(path: Path) -> tuple[int, list[Txn]]:
    buf = path.read_bytes()
    first, prev = decode_segment_header(buf)
    return prev, scan_records(buf, SEGMENT_HEADER_BYTES).txns


def write_segment(path: Path, prev: int, txns: list[Txn]) -> Path:
    """Rewrite a segment (valid header and CRCs) holding `txns`; renamed if its first zxid changed."""
    path.unlink()
    target = path.with_name(segment_name(txns[0].zxid))
    target.write_bytes(encode_segment_header(txns[0].zxid, prev) + b"".join(encode_record(t) for t in txns))
    return target


def node_txns(node_dir: Path) -> list[Txn]:
    return [t for s in segments(node_dir) for t in read_segment(s)[1]]


def edit_log(node_dir: Path, edit) -> None:  # noqa: ANN001 - list[Txn] -> list[Txn]
    """Apply `edit` to the node's newest segment's records and write it back."""
    newest = segments(node_dir)[-1]
    prev, txns = read_segment(newest)
    write_segment(newest, prev, edit(txns))


def epoch_change(txns: list[Txn]) -> int:
    """Index of the first record of the second epoch in `txns`."""
    return next(i for i, t in enumerate(txns) if Z.epoch_of(t.zxid) != Z.epoch_of(txns[0].zxid))


# -- the tests ------------------------------------------------------------------------------------

def test_logs_of_a_real_run_with_a_leader_sigkill_pass_every_check(spark, real_run: Path):
    dirs = {n: real_run / f"node{n}" for n in NODES}
    verdict = run_verify(dirs)
    assert [c.name for c in verdict.checks] == list(CHECK_NAMES)
    assert verdict.passed, verdict.to_json()
    assert "in 2 epoch(s)" in verdict.facts["committed history"] or "in 3 epoch(s)" in verdict.facts["committed history"]
    assert all(list((d / SNAPSHOT_DIR).glob("snapshot.*")) for d in dirs.values()), "the run took no snapshot"
    assert verdict.check(REPLAY).checked >= 6  # snapshot digests and replayed ones, compared
    # The pure checker the multi-process tests use agrees: same bytes per zxid, gap-free logs.
    check_logs_agree({n: node_txns(d) for n, d in dirs.items()})


def test_the_files_read_as_spark_data_sources_and_from_sql(spark, real_run: Path):
    # The formats build_session registers: the same rows as the verifiers' own reads.
    path = ",".join(str(real_run / f"node{n}") for n in NODES)
    zab = spark.read.format("quire-zab").load(path)
    frames = read_zab(spark, parse_dirs([str(real_run / f"node{n}") for n in NODES]))
    try:
        assert zab.count() == frames.records.count() > WRITES
        assert zab.where("checksum = 'ok'").count() == frames.valid.count()
        mine = {tuple(r) for r in zab.select("node", "zxid", "hash_hi", "hash_lo").where("checksum = 'ok'").collect()}
        theirs = {tuple(r) for r in frames.valid.select("node", "zxid", "hash_hi", "hash_lo").collect()}
        assert mine == theirs
    finally:
        frames.unpersist()
    zab.createOrReplaceTempView("quire_zab")
    per_node = spark.sql("SELECT node, max(zxid) AS top FROM quire_zab WHERE checksum = 'ok' GROUP BY node").collect()
    assert sorted(r["node"] for r in per_node) == list(NODES)
    snapshots = spark.read.format("quire-snapshot").load(path).collect()
    assert snapshots and all(r["status"] == "ok" for r in snapshots)
    entries, _, _ = read_entries(spark, parse_dirs([str(real_run / f"node{n}") for n in NODES]))
    for kind, fmt in (("journal", "quire-journal"), ("entrylogs", "quire-entrylog")):
        assert spark.read.format(fmt).load(path).count() == entries.where(f"source = '{kind}'").count()
    entries.unpersist()


def test_spark_submit_chooses_the_master_when_the_command_does_not(real_run: Path):
    # As Spark users expect of a job: `spark-submit --master URL replay/verify_zab.py DIRS` runs
    # on that master (here local[1], which no default of ours would pick), not on local[*].
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**ENV, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([str(submit), "--master", "local[1]", str(REPO / "replay" / "verify_zab.py"),
                           *(str(real_run / f"node{n}") for n in NODES), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout[done.stdout.index("{\n"):])  # after what Spark's launcher prints
    assert verdict["facts"]["spark master"] == "local[1]" and verdict["passed"], done.stdout[:500]


def test_different_bytes_for_one_zxid_on_one_node_break_agreement(spark, dirs):
    victim = {}

    def swap(txns: list[Txn]) -> list[Txn]:
        i = len(txns) // 2
        victim["zxid"] = txns[i].zxid  # same zxid, another (valid) transaction's bytes
        txns[i] = Txn(txns[i].zxid, txns[i].session_id, txns[i].cxid, txns[i + 1].data)
        return txns
    edit_log(dirs[2], swap)
    verdict = run_verify(dirs)
    agreement = verdict.check(AGREEMENT)
    assert agreement.violations == 1 and Z.fmt(victim["zxid"]) in agreement.examples[0]
    assert {AGREEMENT, REPLAY} >= failed(verdict) >= {AGREEMENT}


def test_a_gap_in_one_log_breaks_epoch_order_and_prefix_consistency(spark, dirs):
    edit_log(dirs[3], lambda txns: txns[:40] + txns[41:])
    verdict = run_verify(dirs)
    assert "gap" in verdict.check(EPOCH_ORDER).examples[0]
    assert verdict.check(PREFIX).violations >= 1 and "node 3" in verdict.check(PREFIX).examples[0]
    assert {EPOCH_ORDER, PREFIX} <= failed(verdict)


def test_an_epoch_going_backwards_breaks_epoch_order(spark, dirs):
    def backwards(txns: list[Txn]) -> list[Txn]:
        i = epoch_change(txns) + 5
        old_epoch = Z.epoch_of(txns[0].zxid)
        txns[i] = Txn(Z.make(old_epoch, 900000), txns[i].session_id, txns[i].cxid, txns[i].data)
        return txns
    edit_log(dirs[1], backwards)
    verdict = run_verify(dirs)
    order = verdict.check(EPOCH_ORDER)
    assert any("epoch_backwards" in e for e in order.examples), order.examples
    assert EPOCH_ORDER in failed(verdict)


def test_a_truncated_proposal_inside_committed_history_is_caught(spark, dirs):
    inserted = {}

    def insert(txns: list[Txn]) -> list[Txn]:
        i = epoch_change(txns)
        last_old = txns[i - 1]
        # A proposal of the old epoch that the new leader never had: TRUNC should have removed it.
        ghost = Txn(last_old.zxid + 1, last_old.session_id, last_old.cxid + 1, last_old.data)
        inserted["zxid"] = ghost.zxid
        return txns[:i] + [ghost] + txns[i:]
    edit_log(dirs[3], insert)
    verdict = run_verify(dirs)
    skipped = verdict.check(SKIPPED)
    assert skipped.violations == 1 and Z.fmt(inserted["zxid"]) in skipped.examples[0]
    assert verdict.check(EPOCH_ORDER).passed  # each step of that log is a legal one: only other logs tell
    assert SKIPPED in failed(verdict) and PREFIX in failed(verdict)


def test_an_uncommitted_tail_of_an_old_epoch_is_not_a_violation(spark, dirs):
    cut = {}

    def abandon(txns: list[Txn]) -> list[Txn]:
        i = epoch_change(txns)
        cut["zxid"] = txns[i - 1].zxid
        return txns[:i] + [Txn(txns[i - 1].zxid + 1, 0, 0, txns[i - 1].data)]
    edit_log(dirs[3], abandon)  # node 3 stopped before the new epoch, holding a proposal nobody else took
    for zxid, path in SnapshotStore(dirs[3] / SNAPSHOT_DIR).files():
        if zxid > cut["zxid"]:
            path.unlink()
    verdict = run_verify(dirs)
    assert verdict.passed, verdict.to_json()
    assert any("node 3: 1 record(s) past its committed history" in n for n in verdict.check(SKIPPED).notes)


def test_a_snapshot_with_another_tree_breaks_replay(spark, dirs):
    store = SnapshotStore(dirs[1] / SNAPSHOT_DIR)
    zxid, path = store.files()[-1]
    tree = decode_snapshot(path.read_bytes()[32:])
    data, stat = tree.get("/v/counter")
    tree.set_data("/v/counter", b"forged", stat.version + 1, zxid, 0)
    store.write(zxid, encode_tree(tree))  # valid CRCs and a self-consistent digest: only replay can tell
    verdict = run_verify(dirs)
    replay = verdict.check(REPLAY)
    assert failed(verdict) == {REPLAY}
    assert any(f"digests differ at {Z.fmt(zxid)}" in e and "node 1 snapshot" in e for e in replay.examples)


def test_a_bad_crc_inside_a_log_breaks_checksums_but_a_torn_tail_does_not(spark, dirs):
    newest = segments(dirs[2])[-1]
    buf = bytearray(newest.read_bytes())
    _, txns = read_segment(newest)
    offsets = scan_records(bytes(buf), SEGMENT_HEADER_BYTES).offsets
    buf[offsets[10] + 40] ^= 0xFF  # a data byte of the 11th record, CRC left as it was
    newest.write_bytes(bytes(buf))
    verdict = run_verify(dirs)
    checksums = verdict.check(CHECKSUMS)
    assert checksums.violations == 1 and f"offset {offsets[10]}: corrupt" in checksums.examples[0]
    buf[offsets[10] + 40] ^= 0xFF
    buf[offsets[-1] + 40] ^= 0xFF  # now only the last record: a crash's torn tail
    newest.write_bytes(bytes(buf))
    verdict = run_verify(dirs)
    assert verdict.check(CHECKSUMS).passed and "damaged tail" in verdict.check(CHECKSUMS).notes[0]


def test_committed_txns_held_by_one_node_only_break_quorum_presence(spark, dirs):
    newest_snapshot = max(z for z, _ in SnapshotStore(dirs[1] / SNAPSHOT_DIR).files())
    cut = newest_snapshot - 30  # below node 1's snapshot: committed, since node 1 delivered it
    for n in (2, 3):
        with TxnLog.open(dirs[n] / TXNLOG_DIR) as log:
            log.truncate_after(cut)
        for zxid, path in SnapshotStore(dirs[n] / SNAPSHOT_DIR).files():
            if zxid > cut:
                path.unlink()
    verdict = run_verify(dirs)
    quorum = verdict.check(QUORUM)
    assert QUORUM in failed(verdict) and quorum.violations >= 30
    assert "only nodes [1] hold it" in quorum.examples[0]


def test_command_line_json_and_exit_status(spark, dirs, capsys):
    assert verify_main([*(str(d) for d in dirs.values()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and [c["name"] for c in out["checks"]] == list(CHECK_NAMES)
    edit_log(dirs[3], lambda txns: txns[:40] + txns[41:])
    assert verify_main([str(d) for d in dirs.values()]) == 1
    table = capsys.readouterr().out
    assert "EpochOrder                    FAIL" in table and "verdict: FAIL" in table
    assert verify_main([str(dirs[1].parent)]) == 2  # not a node directory: refused before Spark


def test_a_replay_starts_at_the_chunk_holding_its_first_zxid_and_reads_the_same_txns(tmp_path):
    from replay.spark_replay import log_txns
    from replay.verify_decode import walk_segment
    first = Z.make(1, 1)
    segment = tmp_path / segment_name(first)
    segment.write_bytes(encode_segment_header(first, 0) + b"".join(
        encode_record(Txn(zxid=Z.make(1, i), session_id=1, cxid=i, data=b"x" * i)) for i in range(1, 101)))
    starts = tuple(c.start for c in walk_segment(segment.read_bytes(), chunk_records=7).chunks)
    assert len(starts) == 15
    for after in (0, first, Z.make(1, 6), Z.make(1, 7), Z.make(1, 50), Z.make(1, 100), Z.make(2, 0)):
        whole = [t.zxid for t in log_txns((str(segment),)) if t.zxid > after]
        assert [t.zxid for t in log_txns((str(segment),), after, (starts,)) if t.zxid > after] == whole
        for until in (after, after + 1, Z.make(1, 7), Z.make(1, 8), Z.make(1, 60), Z.make(1, 99), Z.make(3, 0)):
            # Read up to a chunk boundary past `until` at least: every txn in (after, until] comes out.
            bounded = [t.zxid for t in log_txns((str(segment),), after, (starts,), until) if after < t.zxid <= until]
            assert bounded == [z for z in whole if z <= until]
    # Nothing at or below `after` is decoded: a record damaged there is never reached (its CRC
    # is not checked), and the first txn is the one after `after`.
    raw = bytearray(segment.read_bytes())
    raw[starts[2] - 5] ^= 0xFF  # inside the last record of the second chunk
    segment.write_bytes(bytes(raw))
    assert next(log_txns((str(segment),), Z.make(1, 50), (starts,))).zxid == Z.make(1, 51)
    assert next(log_txns((str(segment),), Z.make(1, 10))).zxid == Z.make(1, 11)
    assert Z.make(1, 14) not in [t.zxid for t in log_txns((str(segment),), Z.make(1, 13))]  # damaged: dropped


def test_zero_fill_after_the_last_record_ends_a_walk_cleanly_and_anything_after_it_stops_it():
    from replay.verify_decode import walk_segment
    first = Z.make(1, 1)
    records = b"".join(encode_record(Txn(zxid=Z.make(1, i), session_id=1, cxid=i, data=b"x")) for i in range(1, 6))
    body = encode_segment_header(first, 0) + records
    layout = walk_segment(body + bytes(4096))  # a preallocated newest segment
    assert (layout.records, layout.stop_offset, layout.stop_reason) == (5, None, None)
    layout = walk_segment(body + bytes(4096) + b"\x07")
    assert (layout.records, layout.stop_offset, layout.stop_reason) == (5, len(body), "torn")
