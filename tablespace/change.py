"""A tablespace change: the record a leader appends to the tablespace's log for one transaction,
and what every replica applies. It holds the transaction's effects, not its conditions: the
leader checked them (stream order makes every replica apply the same effects in the same order).

Layout (big-endian): u8 format (1), u32 op count, then per op: u8 kind (1 put, 2 delete),
u16 table length, table (UTF-8), u32 key length, key, then for a put u32 value length, value,
u64 the key's new version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tablespace.errors import CorruptChange

FORMAT = 1
PUT, DELETE = 1, 2
MAX_TABLE_NAME = 255
_HEAD = struct.Struct(">BI")
_OP = struct.Struct(">BH")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Put:
    table: str
    key: bytes
    value: bytes
    version: int  # the key's version after this put: 0 when created, one more at each put


@dataclass(frozen=True, slots=True)
class Delete:
    table: str
    key: bytes


Effect = Put | Delete


def encode(effects: list[Effect] | tuple[Effect, ...]) -> bytes:
    out = [_HEAD.pack(FORMAT, len(effects))]
    for e in effects:
        table = e.table.encode()
        out += (_OP.pack(PUT if isinstance(e, Put) else DELETE, len(table)), table, _U32.pack(len(e.key)), e.key)
        if isinstance(e, Put):
            out += (_U32.pack(len(e.value)), e.value, _U64.pack(e.version))
    return b"".join(out)


def size_bound(ops: list) -> int:
    """At least the size of the change a transaction of `ops` (tablespace/leading.py's Op) makes,
    known before it is decided: each op as a put of its value."""
    return _HEAD.size + sum(_OP.size + 4 + 4 + 8 + len(op.table.encode()) + len(op.key) + len(op.value) for op in ops)


def decode(data: bytes) -> list[Effect]:
    """The effects of a change record; CorruptChange if it is not one, whole and nothing after."""
    view = memoryview(data)
    try:
        fmt, count = _HEAD.unpack_from(view, 0)
        if fmt != FORMAT:
            raise CorruptChange(f"change format {fmt} is not {FORMAT}")
        if count > len(data):  # every op takes several bytes: a count past that is no change's
            raise CorruptChange(f"a change of {len(data)} bytes cannot hold {count} ops")
        at, effects = _HEAD.size, []
        for _ in range(count):
            kind, table_len = _OP.unpack_from(view, at)
            at += _OP.size
            table = _take(view, at, table_len).decode()
            at += table_len
            key, at = _bytes(view, at)
            if kind == PUT:
                value, at = _bytes(view, at)
                (version,) = _U64.unpack_from(view, at)
                at += 8
                effects.append(Put(table, key, value, version))
            elif kind == DELETE:
                effects.append(Delete(table, key))
            else:
                raise CorruptChange(f"unknown op kind {kind}")
    except (struct.error, UnicodeDecodeError) as e:
        raise CorruptChange(f"truncated or malformed change: {e}") from None
    if at != len(data):
        raise CorruptChange(f"{len(data) - at} bytes after the change's last op")
    return effects


def _take(view: memoryview, at: int, n: int) -> bytes:
    if at + n > len(view):
        raise CorruptChange(f"a field of {n} bytes runs past the end of the change")
    return bytes(view[at:at + n])


def _bytes(view: memoryview, at: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(view, at)
    return _take(view, at + 4, n), at + 4 + n
