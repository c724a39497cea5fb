"""A simulated disk for one node: what survives a crash is what was made durable.

Log appends are queued for the node's single log writer; a flush applies the
queued writes in order and fsyncs once (group commit). A crash loses the
queue, except that a random prefix of queued appends may already have reached
the platter unsynced (as written-but-not-fsynced pages can): the node must
cope with either. Epoch files and snapshots are written by rename, so they
are either wholly there or not. A SNAP being received is kept in `receiving`
piece by piece, as the real edge appends it to a temporary file (SnapBegin,
SnapWrite), until InstallSnapshot makes it the snapshot; a crash loses it, as
the real node removes its temporary file at start.

Tail faults: the log holds whole records as `Txn`s, and `tail` holds the bytes
the newest segment has past its last whole record, in the real record format
(zab.storage.record). A crash may leave there the append that was in flight,
torn (its records cut at a byte) or garbled (garbage where it was going).
`recover()` applies the real txn log's rules to those bytes: whole valid records
are kept, a torn or corrupt tail is cut, and a corrupt record followed by a valid
one refuses to start (LogCorruptError). Only bytes that were never fsynced are
ever damaged here: damage to synced data is another failure (the node refuses).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from replay.invariants import check_epochs, check_log
from zab.core.ensemble import Ensemble
from zab.core.peer import DiskState
from zab.core.txn import Txn
from zab.storage.record import encode_record, scan_records, valid_record_follows
from zab.storage.storage_errors import LogCorruptError, RecordReason

TAIL_FAULTS = ("torn", "corrupt")


@dataclass
class SimDisk:
    node: int
    log: list[Txn] = field(default_factory=list)
    snapshots: list[tuple[int, bytes]] = field(default_factory=list)
    accepted_epoch: int = 0
    current_epoch: int = 0
    fsyncs: int = 0
    tail: bytes = b""  # the newest segment's bytes past its last whole record (never fsynced)
    cuts: list[tuple[str, int]] = field(default_factory=list)  # (reason, bytes dropped) per repaired tail
    receiving: tuple[int, list[bytes]] | None = None  # (zxid, pieces) of a SNAP not yet installed
    ensemble: Ensemble | None = None  # the committed ensemble, persisted at once (EnsembleChanged)

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

    def snap_begin(self, zxid: int) -> None:
        self.receiving = (zxid, [])

    def snap_write(self, data: bytes) -> None:
        assert self.receiving is not None, f"node {self.node}: SnapWrite without SnapBegin"
        self.receiving[1].append(data)

    def snap_discard(self) -> None:
        self.receiving = None

    def install_snapshot(self, zxid: int) -> None:
        assert self.receiving is not None and self.receiving[0] == zxid, \
            f"node {self.node}: InstallSnapshot({zxid:#x}) without its SnapBegin"
        state, self.receiving = b"".join(self.receiving[1]), None
        self.truncate_after(zxid)
        self.snapshots = [(zxid, state)]
        self.log = []

    def take_snapshot(self, zxid: int, state: bytes) -> None:
        self.snapshots.append((zxid, state))
        self.snapshots = self.snapshots[-3:]

    def damage_tail(self, txns: tuple[Txn, ...], kind: str, rng: random.Random) -> None:
        """Leave the unsynced append of `txns`, lost in a crash, as a damaged tail: "torn"
        (its records' bytes cut inside one record, then the zero fill of preallocation) or
        "corrupt" (random garbage where its records were going)."""
        encoded = b"".join(encode_record(t) for t in txns)
        if kind == "torn":
            # Cut strictly inside a record: a cut at a boundary is the plain lost-suffix case.
            starts = [0]
            for t in txns[:-1]:
                starts.append(starts[-1] + len(encode_record(t)))
            k = rng.randrange(len(txns))
            end = starts[k + 1] if k + 1 < len(txns) else len(encoded)
            cut = rng.randint(starts[k] + 1, end - 1)
            self.tail = encoded[:cut] + bytes(rng.randint(0, 64))
        elif kind == "corrupt":
            self.tail = rng.randbytes(rng.randint(1, len(encoded)))
        else:
            raise ValueError(f"unknown tail fault {kind!r}")

    def check(self) -> None:
        check_log(self.node, [t.zxid for t in self.log])
        check_epochs(self.node, self.accepted_epoch, self.current_epoch)

    def repair_tail(self) -> None:
        """The real txn log's open() on the newest segment's tail: keep the whole valid
        records, cut the first bad one and everything after it; raise LogCorruptError
        when a corrupt record is followed by a valid one (damage inside history)."""
        if not self.tail:
            return
        scan = scan_records(self.tail)
        if scan.stop is RecordReason.CORRUPT and valid_record_follows(self.tail, scan.valid_end):
            raise LogCorruptError(f"node {self.node}: corrupt record at tail offset {scan.valid_end} "
                                  f"is followed by a valid one ({scan.detail})")
        self.log.extend(scan.txns)
        self.cuts.append((str(scan.stop or "zero fill"), len(self.tail) - scan.valid_end))
        self.tail = b""
        self.check()

    def recover(self):
        self.receiving = None  # a partial SNAP's temporary file is removed at start
        self.repair_tail()
        snap_zxid, state = self.snapshots[-1] if self.snapshots else (0, None)
        return DiskState(self.accepted_epoch, self.current_epoch, snap_zxid, state,
                         tuple(t for t in self.log if t.zxid > snap_zxid))


