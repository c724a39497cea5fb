"""A tablespace's tables, as every replica holds them: what applying its log's changes in order
gives. Pure. Each table maps keys to (value, version), kept sorted by key for scans.

A checkpoint is this state encoded (`encode_chunks`, `CheckpointDecoder`): u8 format (1), then per
key, in table then key order: u16 table length, table, u32 key length, key, u32 value length, value,
u64 version; then a u16 0xFFFF end mark and the u64 key count. Its digest (`digest`), the same on
every replica that applied the same changes, is a SHA-256 of the same bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

from sortedcontainers import SortedDict

from tablespace.change import Delete, Effect, Put
from tablespace.errors import CorruptChange

FORMAT = 1
_END = 0xFFFF
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class TableState:
    """Tables of a tablespace, by name: key -> (value, version)."""

    def __init__(self) -> None:
        self.tables: dict[str, SortedDict] = {}
        self.keys = 0

    def get(self, table: str, key: bytes) -> tuple[bytes, int] | None:
        t = self.tables.get(table)
        return None if t is None else t.get(key)

    def scan(self, table: str, start: bytes = b"", end: bytes | None = None, limit: int | None = None
             ) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, version) for start <= key < end (no end: to the last key), in key order."""
        t = self.tables.get(table)
        if t is None:
            return
        for n, key in enumerate(t.irange(start, end, inclusive=(True, False))):
            if limit is not None and n >= limit:
                return
            value, version = t[key]
            yield key, value, version

    def apply(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Put):
                t = self.tables.get(e.table)
                if t is None:
                    t = self.tables[e.table] = SortedDict()
                self.keys += e.key not in t
                t[e.key] = (e.value, e.version)
            else:
                assert isinstance(e, Delete)
                t = self.tables.get(e.table)
                if t is not None and t.pop(e.key, None) is not None:
                    self.keys -= 1
                    if not t:
                        del self.tables[e.table]

    def encode_chunks(self, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The checkpoint in pieces of about `chunk_bytes` (a key larger than that makes a larger one)."""
        parts, size = [bytes([FORMAT])], 1
        for name in sorted(self.tables):
            table = name.encode()
            for key, (value, version) in self.tables[name].items():
                record = (_U16.pack(len(table)), table, _U32.pack(len(key)), key, _U32.pack(len(value)), value,
                          _U64.pack(version))
                parts += record
                size += 18 + len(table) + len(key) + len(value)
                if size >= chunk_bytes:
                    yield b"".join(parts)
                    parts, size = [], 0
        parts += (_U16.pack(_END), _U64.pack(self.keys))
        yield b"".join(parts)

    def digest(self) -> str:
        h = hashlib.sha256()
        for chunk in self.encode_chunks():
            h.update(chunk)
        return h.hexdigest()


class CheckpointDecoder:
    """Feed a checkpoint's bytes in pieces of any size; `finish` returns the state. CorruptChange
    for anything malformed, truncated, trailing, or out of order."""

    def __init__(self) -> None:
        self.state = TableState()
        self._buf = bytearray()
        self._started = self._done = False
        self._last: tuple[str, bytes] | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data
        if self._done and self._buf:
            raise CorruptChange("bytes after the checkpoint's end")
        buf, at = self._buf, 0
        try:
            if not self._started and buf:
                if buf[0] != FORMAT:
                    raise CorruptChange(f"checkpoint format {buf[0]} is not {FORMAT}")
                at, self._started = 1, True
            while not self._done and at + 2 <= len(buf):
                (n,) = _U16.unpack_from(buf, at)
                if n == _END:
                    if at + 10 > len(buf):
                        break
                    (count,) = _U64.unpack_from(buf, at + 2)
                    if count != self.state.keys:
                        raise CorruptChange(f"the checkpoint says {count} keys, holds {self.state.keys}")
                    at, self._done = at + 10, True
                    break
                record = self._record(buf, at, n)
                if record is None:
                    break
                at = record
        except (struct.error, UnicodeDecodeError) as e:
            raise CorruptChange(f"malformed checkpoint: {e}") from None
        del self._buf[:at]
        if self._done and self._buf:
            raise CorruptChange("bytes after the checkpoint's end")

    def _record(self, buf: bytearray, at: int, table_len: int) -> int | None:
        p = at + 2 + table_len
        if p + 4 > len(buf):
            return None
        (key_len,) = _U32.unpack_from(buf, p)
        k = p + 4
        if k + key_len + 4 > len(buf):
            return None
        (value_len,) = _U32.unpack_from(buf, k + key_len)
        v = k + key_len + 4
        if v + value_len + 8 > len(buf):
            return None
        table, key = bytes(buf[at + 2:p]).decode(), bytes(buf[k:k + key_len])
        if self._last is not None and (table, key) <= self._last:
            raise CorruptChange(f"checkpoint keys out of order at {table}/{key!r}")
        self._last = (table, key)
        (version,) = _U64.unpack_from(buf, v + value_len)
        self.state.apply([Put(table, key, bytes(buf[v:v + value_len]), version)])
        return v + value_len + 8

    def finish(self) -> TableState:
        if not self._done:
            raise CorruptChange("truncated checkpoint")
        return self.state
