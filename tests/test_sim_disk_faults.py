"""Torn and corrupt log tails in the simulated disk (sim/disk.py) and in the simulated ensemble.

A crash may leave the log append that was in flight torn (cut inside a record) or
garbled (garbage where it was going). The simulated recovery applies the real txn
log's rules (zab/storage/txnlog.py) to those bytes: whole valid records stay, the
damaged tail is cut, damage followed by a valid record refuses to start. Nothing
fsynced is ever lost and nothing damaged is ever trusted; acknowledged writes survive.
"""

from __future__ import annotations

import random

import pytest

from sim.cluster import SimCluster
from sim.disk import SimDisk
from zab.core.actions import LogAppend
from zab.core.txn import Txn
from zab.storage.record import encode_record
from zab.storage.storage_errors import LogCorruptError

SYNCED = [Txn(0x100000000 + i, 7, i, b"synced %d" % i) for i in range(1, 4)]
IN_FLIGHT = tuple(Txn(0x100000000 + i, 7, i, b"in flight %d" % i * (i % 3 + 1)) for i in range(4, 9))


def _disk() -> SimDisk:
    disk = SimDisk(1)
    disk.append(tuple(SYNCED))
    return disk


@pytest.mark.parametrize("seed", range(200))
def test_a_torn_tail_keeps_whole_records_before_the_tear_and_cuts_the_rest(seed: int) -> None:
    disk = _disk()
    disk.damage_tail(IN_FLIGHT, "torn", random.Random(seed))
    state = disk.recover()
    kept = disk.log[len(SYNCED):]
    assert disk.log[:len(SYNCED)] == SYNCED, "a synced record was lost"
    # A torn append's whole leading records are indistinguishable from good ones (the real log keeps
    # them too); the record the tear is in, and everything after it, never comes back.
    assert kept == list(IN_FLIGHT[:len(kept)]) and len(kept) < len(IN_FLIGHT)
    assert disk.tail == b"" and len(disk.cuts) == 1
    assert [t.zxid for t in state.txns] == [t.zxid for t in disk.log]


@pytest.mark.parametrize("seed", range(200))
def test_a_corrupt_tail_is_cut_back_to_the_synced_records(seed: int) -> None:
    disk = _disk()
    disk.damage_tail(IN_FLIGHT, "corrupt", random.Random(seed))
    disk.recover()
    assert disk.log == SYNCED and disk.tail == b""
    assert disk.cuts[0][1] > 0 or disk.cuts[0][0] == "zero fill"


def test_damage_followed_by_a_valid_record_refuses_to_start() -> None:
    """txnlog's rule: a checksum failure with an intact record behind it is damage inside history,
    which truncation would destroy; the node refuses rather than guess."""
    disk = _disk()
    bad = bytearray(encode_record(IN_FLIGHT[0]))
    bad[-1] ^= 0xFF  # its data no longer matches its checksum
    disk.tail = bytes(bad) + encode_record(IN_FLIGHT[1])
    with pytest.raises(LogCorruptError):
        disk.recover()


def test_a_clean_crash_leaves_no_tail() -> None:
    disk = _disk()
    disk.recover()
    assert disk.log == SYNCED and disk.cuts == []


def _crash_mid_write(kind: str, victim_role: str, seed: int) -> None:
    c = SimCluster(3, seed=seed, crash_keeps_unsynced=False)
    assert c.run_until(c.converged, 10_000)
    leader = c.leader()
    acked = [c.create(leader, f"acked{i}", "v") for i in range(5)]
    assert c.run_until(lambda: all(op.status == "acked" for op in acked), 10_000)
    victim = leader if victim_role == "leader" else next(i for i in c.alive() if i != leader)
    more = [c.create(leader, f"more{i}", "v") for i in range(5)]
    assert c.run_until(lambda: any(isinstance(a, LogAppend) for a in c.nodes[victim].queue), 1_000)
    durable = list(c.nodes[victim].disk.log)
    c.crash(victim, tail=kind)
    assert c.nodes[victim].disk.tail, "the append in flight left a damaged tail"
    c.restart(victim)
    assert c.nodes[victim].disk.tail == b"" and c.nodes[victim].disk.cuts
    assert c.nodes[victim].disk.log[:len(durable)] == durable, "recovery lost a synced record"
    assert c.run_until(c.converged, 60_000)
    c.run(2_000)
    c.check_final()
    for op in acked + [op for op in more if op.status == "acked"]:
        assert all(c.read(i, op.key) == ("v", 0) for i in c.alive()), f"acknowledged {op.key} lost"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("victim", ["leader", "follower"])
@pytest.mark.parametrize("kind", ["torn", "corrupt"])
def test_a_crash_with_a_damaged_tail_loses_only_unsynced_writes(kind: str, victim: str, seed: int) -> None:
    """Story: 3 voters commit five writes; five more are in flight when `victim` crashes with
    its log append half on disk. It restarts, cuts the tail, and rejoins: every acknowledged
    write is on every node, the ensemble agrees, and no synced record of the victim is gone."""
    _crash_mid_write(kind, victim, seed)
