"""SIGKILL durability: a writer killed at a random moment loses nothing it reported synced.

A child process appends batches to a txn log and prints the last zxid after each
sync(), as a Zab follower would send an ACK. The parent kills it with SIGKILL
mid-stream, reopens the log, and checks that every reported zxid is there, with
zxids strictly increasing and no gap. Several rounds share one log, so each
child also restarts from whatever torn tail the previous one left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from zab.storage.txnlog import TxnLog

REPO_ROOT = Path(__file__).resolve().parent.parent
SEGMENT_MAX = 16 * 1024  # small, so that kills also land around segment rolls

CHILD = """
import random, sys
from pathlib import Path
from zab.core.txn import Txn
from zab.storage.txnlog import TxnLog

directory, seed, segment_max = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
log = TxnLog.open(directory, segment_max_bytes=segment_max)
zxid = log.last_zxid
while True:
    batch = []
    for _ in range(rng.randint(1, 40)):
        zxid += 1
        batch.append(Txn(zxid, rng.getrandbits(63), zxid, rng.randbytes(rng.randint(0, 600))))
    log.append(batch)
    log.sync()
    print(zxid, flush=True)
"""


def run_and_kill(directory: Path, seed: int) -> int:
    """Run one writer, kill it mid-stream; return the highest zxid it reported synced."""
    rng = random.Random(seed)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(seed), str(SEGMENT_MAX)],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    reported = 0
    try:
        for _ in range(rng.randint(1, 30)):
            line = child.stdout.readline()
            assert line, f"writer exited early (seed {seed}), code {child.poll()}"
            reported = int(line)
        time.sleep(rng.uniform(0, 0.01))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        # Lines already in the pipe were printed after a completed sync() too.
        for line in child.stdout.read().split():
            reported = int(line)
    finally:
        child.kill()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return reported


def test_every_reported_sync_survives_sigkill(tmp_path):
    directory = tmp_path / "txnlog"
    base_seed = random.randrange(1 << 30)
    previously_reported = 0
    for round_number in range(6):
        seed = base_seed + round_number
        reported = run_and_kill(directory, seed)
        assert reported > previously_reported, f"seed {seed}: writer made no progress"
        with TxnLog.open(directory, segment_max_bytes=SEGMENT_MAX) as log:
            zxids = [txn.zxid for txn in log.read_after(0)]
        assert zxids == list(range(1, len(zxids) + 1)), f"seed {seed}: gap or disorder"
        assert zxids[-1] >= reported, f"seed {seed}: lost synced zxid {reported}, log ends at {zxids[-1]}"
        previously_reported = reported
