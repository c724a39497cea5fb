"""A simulated disk for one node: what survives a crash is what was made durable.

Log appends are queued for the node's single log writer; a flush applies the
queued writes in order and fsyncs once (group commit). A crash loses the
queue, except that a random prefix of queued appends may already have reached
the platter unsynced (as written-but-not-fsynced pages can): the node must
cope with either. Epoch files and snapshots are written by rename, so they
are either wholly there or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.invariants import check_epochs, check_log
from zab.core.peer import DiskState
from zab.core.txn import Txn


@dataclass
class SimDisk:
    node: int
    log: list[Txn] = field(default_factory=list)
    snapshots: list[tuple[int, bytes]] = field(default_factory=list)
    accepted_epoch: int = 0
    current_epoch: int = 0
    fsyncs: int = 0

    def persist_epoch(self, accepted: int | None, current: int | None) -> None:
        if accepted is not None:
            self.accepted_epoch = accepted
        if current is not None:
            self.current_epoch = current
        check_epochs(self.node, self.accepted_epoch, self.current_epoch)

    def append(self, txns: tuple[Txn, ...]) -> None:
        self.log.extend(txns)

    def truncate_after(self, zxid: int) -> None:
        self.log = [t for t in self.log if t.zxid <= zxid]

    def install_snapshot(self, zxid: int, state: bytes) -> None:
        self.truncate_after(zxid)
        self.snapshots = [(zxid, state)]
        self.log = []

    def take_snapshot(self, zxid: int, state: bytes) -> None:
        self.snapshots.append((zxid, state))
        self.snapshots = self.snapshots[-3:]

    def check(self) -> None:
        check_log(self.node, [t.zxid for t in self.log])
        check_epochs(self.node, self.accepted_epoch, self.current_epoch)

    def recover(self):
        snap_zxid, state = self.snapshots[-1] if self.snapshots else (0, None)
        return DiskState(self.accepted_epoch, self.current_epoch, snap_zxid, state,
                         tuple(t for t in self.log if t.zxid > snap_zxid))
