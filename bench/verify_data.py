"""Synthetic Zab data directories for the verifier benchmark, written by the project's own
txn log writer and snapshot store: real files, as a 3-node metastore ensemble leaves them.

One history is generated: 1000 znodes created under the root, then setData on them
round-robin (the tree stays small, so snapshots stay small), in `epochs` epochs whose
counters restart at 1, each transaction applied to a MetastoreStateMachine as it is
generated (so every one of them applies on replay) and a snapshot written every
`snapshot_every` transactions. node1 is written; the other nodes are copies of it,
as a converged ensemble's logs are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.state_machine import MetastoreStateMachine
from metastore.core.txn import Create, SetData, Transaction
from metastore.wire.txn_codec import encode_txn
from zab.core import zxid as Z
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR
from zab.storage.snapshot import SnapshotStore
from zab.core.txn import Txn
from zab.storage.txnlog import TxnLog

ZNODES = 1000
BATCH = 10000
SESSION = 0x100000000001
_DONE = "generated.ok"


def _body(sm: MetastoreStateMachine, i: int) -> Create | SetData:
    path = f"/b{i % ZNODES}"
    if i < ZNODES:
        root = sm.tree.node("/")
        return Create(path, b"v" * 32, OPEN_ACL_UNSAFE, 0, root.cversion + 1)
    return SetData(path, i.to_bytes(8, "big") * 4, sm.tree.node(path).version + 1)


def generate(folder: Path, records: int, *, nodes: int = 3, epochs: int = 2, snapshot_every: int = 50_000) -> list[Path]:
    """Data directories node1..node<nodes> holding `records` log records in all; reused if present."""
    folder = Path(folder)
    dirs = [folder / f"node{n}" for n in range(1, nodes + 1)]
    if (folder / _DONE).exists():
        return dirs
    shutil.rmtree(folder, ignore_errors=True)
    per_node = records // nodes
    sm = MetastoreStateMachine()
    store = SnapshotStore(dirs[0] / SNAPSHOT_DIR)
    with TxnLog.open(dirs[0] / TXNLOG_DIR) as log:
        batch: list[Txn] = []
        epoch, counter = 1, 0
        for i in range(per_node):
            if i and i % -(-per_node // epochs) == 0:
                epoch, counter = epoch + 1, 0  # a new leader: counters restart at 1
            counter += 1
            zxid = Z.make(epoch, counter)
            data = encode_txn(Transaction(i, _body(sm, i)))
            sm.apply(zxid, data)
            batch.append(Txn(zxid, SESSION, i, data))
            if len(batch) == BATCH:
                log.append(batch)
                batch = []
            if (i + 1) % snapshot_every == 0:
                log.append(batch)
                batch = []
                log.sync()
                store.write_chunks(zxid, sm.freeze().chunks(1 << 20))
        log.append(batch)
        log.sync()
    for d in dirs[1:]:
        shutil.copytree(dirs[0], d)
    (folder / _DONE).write_text(f"{records}\n")
    return dirs
