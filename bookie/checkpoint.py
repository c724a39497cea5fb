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

Both ways stream (issue 19), since the file is about as large as the index (12 bytes a slot,
gigabytes on a big bookie): encode_checkpoint yields it in chunks, and decode_checkpoint_from
pulls it through a `read` function in pieces of PIECE_BYTES, building the index as they come.
"""

from __future__ import annotations

import io
import struct
import sys
from array import array
from collections.abc import Callable, Iterator
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


PIECE_BYTES = 1 << 20  # what a load reads at a time: beside the index it builds, memory holds one piece


class _Body:
    """The body, pulled through `read` in pieces of at most `piece_bytes` (never past the header's
    body length) and summed (CRC-32C) as they arrive; decoding takes its fields from the piece at
    hand. Memory: a piece and its decoded copy on the way into the index. Every count is
    checked against the body bytes left, and arrays grow piece by piece, so neither a damaged count
    nor a header announcing more than the file holds makes a load allocate more than it read."""

    def __init__(self, read: Callable[[int], bytes], length: int, crc: int, piece_bytes: int) -> None:
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be positive, got {piece_bytes}")
        self._read, self.length, self._crc, self._piece_bytes = read, length, crc, piece_bytes
        self._buf = b""
        self._at = 0  # taken up to here in _buf
        self.pos = 0  # body bytes taken
        self.fetched = 0  # body bytes read
        self.crc = 0

    def left(self) -> int:
        return self.length - self.pos

    def take(self, size: int, what: str) -> memoryview:
        at = self._claim(size, what)
        return memoryview(self._buf)[at : at + size]

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        at = self._claim(fmt.size, what)  # first: it may replace the buffer
        return fmt.unpack_from(self._buf, at)

    def _claim(self, size: int, what: str) -> int:
        """Where in the buffer the next `size` body bytes start, reading a piece if they are not there."""
        if size > self.length - self.pos:
            raise CheckpointCorrupt(f"checkpoint ends inside {what} ({size} bytes needed at {self.pos})")
        if len(self._buf) - self._at < size:
            self._fetch(size, what)
        at = self._at
        self._at += size
        self.pos += size
        return at

    def _fetch(self, size: int, what: str) -> None:
        rest = self._buf[self._at :]  # the few bytes of a record that straddles two pieces
        while len(rest) < size:
            piece = self._read_piece(max(self._piece_bytes, size - len(rest)))
            if not piece:
                raise CheckpointCorrupt(f"checkpoint file ends inside {what}: it holds {self.fetched} of the "
                                        f"{self.length} body bytes its header announces (truncated)")
            rest = rest + piece if rest else piece
        self._buf, self._at = rest, 0

    def _read_piece(self, size: int) -> bytes:
        piece = self._read(min(size, self.length - self.fetched)) if self.fetched < self.length else b""
        self.crc = crc32c(piece, self.crc)
        self.fetched += len(piece)
        return piece

    def count(self, item_bytes: int, what: str) -> int:
        (n,) = struct.unpack(">I", self.take(4, what))
        if n * item_bytes > self.length - self.pos:
            raise CheckpointCorrupt(f"checkpoint announces {n} {what}, more than its remaining bytes hold")
        return n

    def values(self, typecode: str, n: int, what: str) -> array:
        """`n` big-endian integers, taken a piece at a time (the caller checked they fit the body)."""
        values = array(typecode)
        step = max(1, self._piece_bytes // values.itemsize)
        for start in range(0, n, step):
            values.extend(_from_big_endian(typecode, self.take(min(step, n - start) * values.itemsize, what)))
        return values

    def defect(self) -> str | None:
        """Read what is left of the file: why its body is not the one its header describes, or None."""
        while self.fetched < self.length:
            if not self._read_piece(self._piece_bytes):
                return f"file is truncated: it holds {self.fetched} of its {self.length} body bytes"
        if self._read(1):
            return f"file is longer than the {self.length} body bytes its header announces"
        if self.crc != self._crc:
            return "body checksum mismatch"
        return None


def decode_checkpoint(buf: bytes | memoryview) -> Checkpoint:
    """Check and decode a checkpoint image held whole in memory (tests, tools); raises
    CheckpointCorrupt for any defect. A bookie loads its file with decode_checkpoint_from."""
    return decode_checkpoint_from(io.BytesIO(buf).read)


def decode_checkpoint_from(read: Callable[[int], bytes], piece_bytes: int = PIECE_BYTES) -> Checkpoint:
    """Check and decode the checkpoint that `read(n)` (a binary file's read: fewer than `n` bytes only
    at its end) yields, taking at most `piece_bytes` at a time and building the index as they come.

    The body's CRC is summed on the way and checked at the end, so a damaged file is refused only
    once it is read whole (CheckpointCorrupt), after the index was built: drop the result. A
    defect that shows earlier is reported as the checksum mismatch or truncation that caused it, if
    one did (the rest of the file is read to tell), so the message says what happened to the file."""
    head = read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise CheckpointCorrupt(f"checkpoint of {len(head)} bytes is shorter than its header")
    magic, version, length, body_crc, header_crc = _HEADER.unpack(head)
    if crc32c(head[: HEADER_BYTES - 4]) != header_crc or magic != MAGIC or version != VERSION:
        raise CheckpointCorrupt("checkpoint header is invalid (checksum, magic or version)")
    body = _Body(read, length, body_crc, piece_bytes)
    try:
        checkpoint = _decode_body(body)
    except CheckpointCorrupt as err:
        if (cause := body.defect()) is not None:
            raise CheckpointCorrupt(f"checkpoint {cause}") from err
        raise
    if (cause := body.defect()) is not None:
        raise CheckpointCorrupt(f"checkpoint {cause}")
    return checkpoint


def _decode_body(body: _Body) -> Checkpoint:
    journal_seq, next_log_id = body.unpack(struct.Struct(">QQ"), "the journal position")
    checkpoint = Checkpoint(journal_seq, next_log_id)
    for _ in range(body.count(_LOG.size, "entry logs")):
        log_id, size, live = body.unpack(_LOG, "an entry log")
        checkpoint.logs[log_id] = (size, live)
        checkpoint.index.live_bytes[log_id] = live
    for _ in range(body.count(8, "deleted ledgers")):
        checkpoint.index.deleted.add(body.unpack(struct.Struct(">Q"), "a deleted ledger")[0])
    for _ in range(body.count(_LEDGER.size, "ledgers")):
        ledger_id, state = _decode_ledger(body)
        checkpoint.index.ledgers[ledger_id] = state
    if body.left():
        raise CheckpointCorrupt(f"checkpoint has {body.left()} bytes after its last ledger")
    return checkpoint


def _decode_ledger(body: _Body) -> tuple[int, LedgerState]:
    ledger_id, flags, key, explicit_lac, max_lac, last_entry, base, n_dense = body.unpack(_LEDGER, "a ledger")
    if n_dense * 12 > body.left():
        raise CheckpointCorrupt(f"ledger {ledger_id} announces {n_dense} slots, more than the file holds")
    positions = body.values("Q", n_dense, "positions")
    lengths = body.values("I", n_dense, "lengths")
    sparse = {}
    for _ in range(body.count(_SPARSE.size, "sparse entries")):
        entry_id, position, length = body.unpack(_SPARSE, "a sparse entry")
        sparse[entry_id] = (position, length)
    entries = LedgerEntries(base, positions, lengths, sparse)
    master_key = bytes(key) if flags & _HAS_KEY else None
    return ledger_id, LedgerState(master_key, bool(flags & _FENCED), explicit_lac, max_lac, last_entry, entries)
