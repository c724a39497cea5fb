"""Records packed into one ledger entry: DistributedLog's record set (seed 004).

A writer packs the records an application writes into entries, bounded in bytes, so that a
ledger append (a quorum round to the bookies) carries many small records. Each record keeps
its application transaction id; each entry also says how many records and payload bytes its
segment held before it, so that the last entry of a segment gives the segment's totals (a new
owner recovering a segment reads only that one). Layout (big-endian, docs/streams.md):

    u8 version = 1, u32 count >= 1, u64 records_before, u64 bytes_before,
    then count x (u64 txid, u32 length, length bytes), txids strictly increasing.

Pure: no I/O. The ledger entry around it carries the digest that checks these bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import islice
from operator import lt

from stream.errors import CorruptRecordSet, RecordTooLarge, TxidOutOfOrder

VERSION = 1
_HEAD = struct.Struct(">BIQQ")
_RECORD = struct.Struct(">QI")
HEAD_BYTES = _HEAD.size
RECORD_OVERHEAD = _RECORD.size
MAX_TXID = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class RecordSet:
    """One entry's records: `txids[i]` and `payloads[i]` are the record in slot i."""

    records_before: int
    bytes_before: int
    txids: list[int]
    payloads: list[bytes]

    @property
    def count(self) -> int:
        return len(self.txids)

    @property
    def payload_bytes(self) -> int:
        return sum(map(len, self.payloads))


class RecordSetBuilder:
    """Packs records into one entry of at most `max_bytes`; `encode(...)` when full or due (where
    the set lands, and so what its segment held before it, is known only then)."""

    def __init__(self, max_bytes: int, last_txid: int = -1) -> None:
        if max_bytes < HEAD_BYTES + RECORD_OVERHEAD + 1:
            raise ValueError(f"a record set of {max_bytes} bytes cannot hold a record")
        self.max_bytes = max_bytes
        self.last_txid = last_txid
        self.first_txid = -1
        self.size = HEAD_BYTES
        self.payload_bytes = 0
        self._parts: list[bytes] = []
        self.count = 0

    def fits(self, payload_bytes: int) -> bool:
        return self.size + RECORD_OVERHEAD + payload_bytes <= self.max_bytes

    def add(self, txid: int, payload: bytes) -> int:
        """Add a record; its slot. TxidOutOfOrder unless txid > the last one; RecordTooLarge if no
        record set could hold it; ValueError if this one is too full (check `fits` first)."""
        if not self.last_txid < txid <= MAX_TXID:
            raise TxidOutOfOrder(f"transaction id {txid} is not greater than the previous record's "
                                 f"({self.last_txid}); give each record a larger one than the last")
        if HEAD_BYTES + RECORD_OVERHEAD + len(payload) > self.max_bytes:
            raise RecordTooLarge(f"a record of {len(payload)} bytes does not fit an entry of {self.max_bytes} "
                                 "bytes; split it, or raise the log's max_entry_bytes")
        if not self.fits(len(payload)):
            raise ValueError("the record set is full: encode it and start the next one")
        self._parts += (_RECORD.pack(txid, len(payload)), payload)
        self.size += RECORD_OVERHEAD + len(payload)
        self.payload_bytes += len(payload)
        if not self.count:
            self.first_txid = txid
        self.last_txid = txid
        self.count += 1
        return self.count - 1

    def encode(self, records_before: int, bytes_before: int) -> bytes:
        """The entry, for a place in a segment after `records_before` records of `bytes_before` bytes."""
        if not self.count:
            raise ValueError("an empty record set is never written")
        return _HEAD.pack(VERSION, self.count, records_before, bytes_before) + b"".join(self._parts)


def decode(data: bytes | memoryview) -> RecordSet:
    """The record set an entry holds; CorruptRecordSet if the bytes are not exactly one."""
    if len(data) < HEAD_BYTES:
        raise CorruptRecordSet(f"an entry of {len(data)} bytes is shorter than a record set's header")
    version, count, records_before, bytes_before = _HEAD.unpack_from(data, 0)
    if version != VERSION:
        raise CorruptRecordSet(f"record set version {version}, this Quire reads version {VERSION}")
    if count == 0 or count > (len(data) - HEAD_BYTES) // RECORD_OVERHEAD:
        raise CorruptRecordSet(f"a record set of {len(data)} bytes cannot hold {count} records")
    if records_before > MAX_TXID or bytes_before > MAX_TXID:
        raise CorruptRecordSet("a record set's counts before it are out of range")
    if isinstance(data, memoryview):
        data = bytes(data)  # so that each payload is a slice of bytes: one copy of the entry, not one per record
    # The loop only splits; the order of the txids is checked after it, in bulk (half the time of
    # a check per record, which matters for catch-up reads of small records).
    unpack, end = _RECORD.unpack_from, len(data)
    txids: list[int] = []
    payloads: list[bytes] = []
    add_txid, add_payload = txids.append, payloads.append
    at = HEAD_BYTES
    for _ in range(count):
        if at + RECORD_OVERHEAD > end:
            raise CorruptRecordSet("a record set ends inside a record's header")
        txid, length = unpack(data, at)
        at += RECORD_OVERHEAD
        stop = at + length
        if stop > end:
            raise CorruptRecordSet("a record set ends inside a record's payload")
        add_txid(txid)
        add_payload(data[at:stop])
        at = stop
    if count > 1 and not all(map(lt, txids, islice(txids, 1, None))):
        i = next(i for i in range(1, count) if txids[i] <= txids[i - 1])
        raise CorruptRecordSet(f"transaction id {txids[i]} after {txids[i - 1]} in one record set")
    if txids[-1] > MAX_TXID:
        raise CorruptRecordSet(f"transaction id {txids[-1]} is out of range")
    if at != len(data):
        raise CorruptRecordSet(f"{len(data) - at} bytes after a record set's last record")
    return RecordSet(records_before, bytes_before, txids, payloads)
