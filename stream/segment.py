"""A log segment's metadata (seed 004): one ledger of a named log, in progress while its writer
appends to it, completed once closed with its totals. Stored as the JSON of one znode per
segment (stream/log_metadata.py has the paths); checked field by field when read."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from stream import metadata_json as mj
from stream.errors import CorruptMetadata
from stream.position import Position


class SegmentState(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


_FIELDS = {"seq", "ledger_id", "state", "first_txid", "last_txid", "last_entry", "last_slot", "records",
           "bytes", "created_ms", "completed_ms"}


@dataclass(frozen=True, slots=True)
class Segment:
    """`seq` from 1 in the order of the log; the record totals, txids and last position are known
    once it is completed (-1 where it holds no record). A completed segment's records are exactly
    the first `records` records of its ledger, the last at (seq, last_entry, last_slot)."""

    seq: int
    ledger_id: int
    state: SegmentState
    created_ms: int
    first_txid: int = -1
    last_txid: int = -1
    last_entry: int = -1
    last_slot: int = -1
    records: int = 0
    bytes: int = 0
    completed_ms: int = 0

    @property
    def completed(self) -> bool:
        return self.state is SegmentState.COMPLETED

    @property
    def last_position(self) -> Position | None:
        """The position of its last record, once completed with at least one."""
        return Position(self.seq, self.last_entry, self.last_slot) if self.completed and self.records else None

    def complete(self, *, first_txid: int, last_txid: int, last_entry: int, last_slot: int, records: int,
                 size: int, now_ms: int) -> Segment:
        return replace(self, state=SegmentState.COMPLETED, first_txid=first_txid, last_txid=last_txid,
                       last_entry=last_entry, last_slot=last_slot, records=records, bytes=size, completed_ms=now_ms)

    def encode(self) -> bytes:
        return mj.dumps({"seq": self.seq, "ledger_id": self.ledger_id, "state": self.state.value,
                         "first_txid": self.first_txid, "last_txid": self.last_txid, "last_entry": self.last_entry,
                         "last_slot": self.last_slot, "records": self.records, "bytes": self.bytes,
                         "created_ms": self.created_ms, "completed_ms": self.completed_ms})

    @classmethod
    def decode(cls, data: bytes, what: str = "segment") -> Segment:
        f = mj.loads(data, what, _FIELDS)
        state = SegmentState(mj.choice(f, "state", what, tuple(s.value for s in SegmentState)))
        segment = cls(seq=mj.integer(f, "seq", what, 1), ledger_id=mj.integer(f, "ledger_id", what), state=state,
                      created_ms=mj.integer(f, "created_ms", what), first_txid=mj.integer(f, "first_txid", what, -1),
                      last_txid=mj.integer(f, "last_txid", what, -1), last_entry=mj.integer(f, "last_entry", what, -1),
                      last_slot=mj.integer(f, "last_slot", what, -1), records=mj.integer(f, "records", what),
                      bytes=mj.integer(f, "bytes", what), completed_ms=mj.integer(f, "completed_ms", what))
        segment.check(what)
        return segment

    def check(self, what: str) -> None:
        """CorruptMetadata unless the fields agree with each other."""
        empty = (self.first_txid, self.last_txid, self.last_entry, self.last_slot, self.records, self.bytes) == \
            (-1, -1, -1, -1, 0, 0)
        if not self.completed:
            if not empty or self.completed_ms:
                raise CorruptMetadata(f"{what}: an in-progress segment has no totals yet")
        elif not empty and not (0 <= self.first_txid <= self.last_txid and self.last_entry >= 0
                                and self.last_slot >= 0 and self.records >= 1):
            raise CorruptMetadata(f"{what}: a completed segment's totals do not agree")
