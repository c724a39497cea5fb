"""The index checkpoint file's byte layout (pure: no I/O).

`<bookie dir>/checkpoint` holds the whole index and per-ledger state as of a
journal position: replaying the journal segments from `journal_seq` on over
it gives the bookie's current state. Written tmp + fsync + rename, so the file
under its final name is always complete. Integers big-endian:

    header (24 bytes): b"QBCP", u32 version 1, u64 body_length, u32 body_crc, u32 header_crc
    body:
      u64 journal_seq           replay journal segments with seq >= this
      u64 next_log_id           the id the next new entry log gets
      u32 n_logs, then n_logs x (u64 log_id, u64 size, u64 live_bytes)
                                the entry logs and their valid length; any other
                                entry log file, and bytes past `size`, came after
      u32 n_deleted, then n_deleted x u64 ledger id
      u32 n_ledgers, then per ledger:
        u64 ledger_id, u8 flags (1 = fenced, 2 = has master key), 32-byte key (zeros if none),
        i64 explicit_lac, i64 max_lac, i64 last_entry,
        u64 base, u32 n_dense, n_dense x u64 position, n_dense x u32 length,
        u32 n_sparse, n_sparse x (u64 entry_id, u64 position, u32 length)

A position is `log_id << 40 | record offset`; 0 marks an empty dense slot.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

from bookie.errors import StorageError
from bookie.index import Index, LedgerEntries, LedgerState
from bookie.storage_config import MASTER_KEY_BYTES

MAGIC = b"QBCP"
VERSION = 1
_HEADER = struct.Struct(">4sIQII")
HEADER_BYTES = _HEADER.size  # 24
_LEDGER = struct.Struct(">QB32sqqqQI")
_LOG = struct.Struct(">QQQ")
_SPARSE = struct.Struct(">QQI")
_FENCED, _HAS_KEY = 1, 2
_SWAP = sys.byteorder == "little"


class CheckpointCorrupt(StorageError):
    """The checkpoint file fails its checks."""


@dataclass
class Checkpoint:
    """The durable image of a bookie's index as of journal segment `journal_seq`."""

    journal_seq: int
    next_log_id: int
    logs: dict[int, tuple[int, int]] = field(default_factory=dict)  # log id -> (size, live bytes)
    index: Index = field(default_factory=Index)


def _big_endian(values: array) -> bytes:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _from_big_endian(typecode: str, raw: bytes | memoryview) -> array:
    values = array(typecode)
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return values


CHUNK_SLOTS = 1 << 16  # dense slots per chunk written: 512 KiB of positions, 256 KiB of lengths


def encode_checkpoint(checkpoint: Checkpoint) -> Iterator[bytes]:
    """The file's bytes as chunks (header first), generated as they are written.

    The header holds the body's length and checksum, so the body is generated twice: once to
    sum them, once to write. Memory holds one chunk (at most CHUNK_SLOTS slots of one ledger),
    never the image, which is as large as the index (12 bytes a slot). `checkpoint.index` must
    not change meanwhile (it is a copy-on-write snapshot: Index.snapshot)."""
    crc = length = 0
    for chunk in _body(checkpoint):
        crc = crc32c(chunk, crc)
        length += len(chunk)
    head = _HEADER.pack(MAGIC, VERSION, length, crc, 0)[:-4]
    yield head + struct.pack(">I", crc32c(head))
    yield from _body(checkpoint)


def _body(checkpoint: Checkpoint) -> Iterator[bytes]:
    index = checkpoint.index
    yield struct.pack(">QQI", checkpoint.journal_seq, checkpoint.next_log_id, len(checkpoint.logs))
    yield b"".join(_LOG.pack(log_id, size, live) for log_id, (size, live) in sorted(checkpoint.logs.items()))
    yield struct.pack(">I", len(index.deleted))
    deleted = sorted(index.deleted)
    for i in range(0, len(deleted), CHUNK_SLOTS):
        yield b"".join(struct.pack(">Q", ledger_id) for ledger_id in deleted[i:i + CHUNK_SLOTS])
    yield struct.pack(">I", len(index.ledgers))
    for ledger_id in sorted(index.ledgers):
        yield from _encode_ledger(ledger_id, index.ledgers[ledger_id])


def _encode_ledger(ledger_id: int, state: LedgerState) -> Iterator[bytes]:
    flags = (_FENCED if state.fenced else 0) | (_HAS_KEY if state.master_key is not None else 0)
    entries = state.entries
    yield _LEDGER.pack(ledger_id, flags, state.master_key or bytes(MASTER_KEY_BYTES), state.explicit_lac,
                       state.max_lac, state.last_entry, entries.base, len(entries.positions))
    for values in (entries.positions, entries.lengths):
        for i in range(0, len(values), CHUNK_SLOTS):
            yield _big_endian(values[i:i + CHUNK_SLOTS])
    yield struct.pack(">I", len(entries.sparse))
    yield b"".join(_SPARSE.pack(e, p, n) for e, (p, n) in sorted(entries.sparse.items()))


class _Reader:
    """Bounds-checked reads over the body: every count is checked against the bytes left."""

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.pos = 0

    def take(self, size: int, what: str) -> memoryview:
        if size > len(self.body) - self.pos:
            raise CheckpointCorrupt(f"checkpoint ends inside {what} ({size} bytes needed at {self.pos})")
        chunk = self.body[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        return fmt.unpack(self.take(fmt.size, what))

    def count(self, item_bytes: int, what: str) -> int:
        (n,) = struct.unpack(">I", self.take(4, what))
        if n * item_bytes > len(self.body) - self.pos:
            raise CheckpointCorrupt(f"checkpoint announces {n} {what}, more than its remaining bytes hold")
        return n


def decode_checkpoint(buf: bytes | memoryview) -> Checkpoint:
    """Check and decode a whole checkpoint file; raises CheckpointCorrupt for any defect."""
    view = memoryview(buf)
    if len(view) < HEADER_BYTES:
        raise CheckpointCorrupt(f"checkpoint of {len(view)} bytes is shorter than its header")
    magic, version, length, body_crc, header_crc = _HEADER.unpack_from(view)
    if crc32c(view[: HEADER_BYTES - 4]) != header_crc or magic != MAGIC or version != VERSION:
        raise CheckpointCorrupt("checkpoint header is invalid (checksum, magic or version)")
    if length != len(view) - HEADER_BYTES or crc32c(view[HEADER_BYTES:]) != body_crc:
        raise CheckpointCorrupt("checkpoint body length or checksum mismatch")
    reader = _Reader(view[HEADER_BYTES:])
    journal_seq, next_log_id = reader.unpack(struct.Struct(">QQ"), "the journal position")
    checkpoint = Checkpoint(journal_seq, next_log_id)
    for _ in range(reader.count(_LOG.size, "entry logs")):
        log_id, size, live = reader.unpack(_LOG, "an entry log")
        checkpoint.logs[log_id] = (size, live)
        checkpoint.index.live_bytes[log_id] = live
    for _ in range(reader.count(8, "deleted ledgers")):
        checkpoint.index.deleted.add(reader.unpack(struct.Struct(">Q"), "a deleted ledger")[0])
    for _ in range(reader.count(_LEDGER.size, "ledgers")):
        ledger_id, state = _decode_ledger(reader)
        checkpoint.index.ledgers[ledger_id] = state
    if reader.pos != len(reader.body):
        raise CheckpointCorrupt(f"checkpoint has {len(reader.body) - reader.pos} bytes after its last ledger")
    return checkpoint


def _decode_ledger(reader: _Reader) -> tuple[int, LedgerState]:
    ledger_id, flags, key, explicit_lac, max_lac, last_entry, base, n_dense = reader.unpack(_LEDGER, "a ledger")
    if n_dense * 12 > len(reader.body) - reader.pos:
        raise CheckpointCorrupt(f"ledger {ledger_id} announces {n_dense} slots, more than the file holds")
    positions = _from_big_endian("Q", reader.take(n_dense * 8, "positions"))
    lengths = _from_big_endian("I", reader.take(n_dense * 4, "lengths"))
    sparse = {}
    for _ in range(reader.count(_SPARSE.size, "sparse entries")):
        entry_id, position, length = reader.unpack(_SPARSE, "a sparse entry")
        sparse[entry_id] = (position, length)
    entries = LedgerEntries(base, positions, lengths, sparse)
    master_key = bytes(key) if flags & _HAS_KEY else None
    return ledger_id, LedgerState(master_key, bool(flags & _FENCED), explicit_lac, max_lac, last_entry, entries)
