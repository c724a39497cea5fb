"""SIGKILL a process that is acknowledging adds; every acknowledged entry must survive.

The child opens BookieStorage with small journal segments, entry logs and checkpoint
trigger (so rotations, checkpoints and journal trims happen while it is killed), runs
concurrent adders on several ledgers and prints `ledger entry` after each add returns.
The parent kills it at a seeded random moment, reopens the directory and reads every
printed entry back byte for byte. A second round on the same directory starts from the
state the first crash left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from bookie.storage import BookieStorage, BookieStorageConfig

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, trio
from pathlib import Path
from bookie.entry import Digester, DigestType, master_key
from bookie.storage import AddRequest, BookieStorage, BookieStorageConfig

DIRECTORY, FIRST = Path(sys.argv[1]), int(sys.argv[2])
JOURNAL = Path(sys.argv[3]) if len(sys.argv) > 3 else None  # the journal in a directory of its own
KEY = master_key(b"pw")
DIGESTER = Digester(DigestType.CRC32C, b"pw")
CONFIG = BookieStorageConfig(journal_segment_bytes=16384, entry_log_bytes=32768, checkpoint_every_bytes=65536,
                             checkpoint_interval_ms=50)

def payload(ledger, entry):
    return (f"{ledger}:{entry}:".encode() * 200)[: (entry * 7919 + ledger) % 900 + 1]

async def adder(storage, ledger):
    entry = FIRST
    while True:
        data = DIGESTER.package(ledger, entry, entry - 1, 0, payload(ledger, entry))
        await storage.add(AddRequest(ledger, entry, KEY, data))
        sys.stdout.write(f"{ledger} {entry}\n")
        sys.stdout.flush()
        entry += 1

async def main():
    storage = await BookieStorage.open(DIRECTORY, 1, CONFIG, journal_directory=JOURNAL)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        for ledger in range(1, 9):
            nursery.start_soon(adder, storage, ledger)

trio.run(main)
"""


def _payload(ledger: int, entry: int) -> bytes:
    return (f"{ledger}:{entry}:".encode() * 200)[: (entry * 7919 + ledger) % 900 + 1]


def _run_and_kill(directory: Path, first: int, rng: random.Random,
                  journal: Path | None = None, after_checkpoint: bool = False) -> list[tuple[int, int]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [str(directory), str(first)] + ([str(journal)] if journal else [])
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Wait until it acknowledges something, then let it run a random while.
        first_line = child.stdout.readline()
        assert first_line, child.stderr.read().decode()
        if after_checkpoint:
            # A loaded machine may take longer than the random while to write the first checkpoint, and
            # the crash must find one (recovery from a checkpoint plus the journal after it is the point).
            deadline = time.monotonic() + 60
            while not (directory / "checkpoint").exists():
                assert child.poll() is None, child.stderr.read().decode()
                assert time.monotonic() < deadline, "the child wrote no checkpoint in 60 s"
                time.sleep(0.01)
        time.sleep(rng.uniform(0.05, 0.6))
    finally:
        child.send_signal(signal.SIGKILL)
    rest, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # Only newline-terminated lines were printed whole; a kill mid-write leaves a partial last one.
    *lines, _partial = (first_line + rest).decode().split("\n")
    return [(int(ledger), int(entry)) for ledger, entry in (line.split() for line in lines)]


async def _check(directory: Path, acked: list[tuple[int, int]], journal: Path | None = None) -> None:
    from bookie.entry import Digester, DigestType

    digester = Digester(DigestType.CRC32C, b"pw")
    storage = await BookieStorage.open(directory, 1, BookieStorageConfig(), journal_directory=journal)
    for ledger, entry in acked:
        assert digester.verify(storage.read(ledger, entry)).payload == _payload(ledger, entry), (ledger, entry)
    await storage.close(checkpoint=False)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_acknowledged_add_survives_sigkill(tmp_path, seed):
    rng = random.Random(seed)
    acked = _run_and_kill(tmp_path, 0, rng, after_checkpoint=True)
    assert len(acked) > 10, "the child acknowledged too little to test anything"
    assert (tmp_path / "checkpoint").exists(), "the child should have checkpointed while adding"
    trio.run(_check, tmp_path, acked)
    # Recovery after recovery: kill it again on the directory the first crash left.
    acked += _run_and_kill(tmp_path, 1_000_000, rng)
    trio.run(_check, tmp_path, acked)


def test_every_acknowledged_add_survives_sigkill_with_the_journal_in_a_directory_of_its_own(tmp_path):
    # What an operator does to give the journal its own device (docs/bookie_storage.md, "Directory").
    rng = random.Random(4)
    directory, journal = tmp_path / "bookie", tmp_path / "journal-device" / "journal"
    acked = _run_and_kill(directory, 0, rng, journal, after_checkpoint=True)
    assert len(acked) > 10, "the child acknowledged too little to test anything"
    assert (directory / "journal").is_symlink() and list(journal.glob("journal.*"))
    assert (directory / "checkpoint").exists(), "the child should have checkpointed while adding"
    trio.run(_check, directory, acked, journal)
    acked += _run_and_kill(directory, 1_000_000, rng, journal)
    trio.run(_check, directory, acked)  # the link alone finds the journal
