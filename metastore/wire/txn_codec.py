"""The byte encoding of metastore transactions (metastore/core/txn.py's records): what the
leader proposes and every node logs and decodes.

Layouts (docs/metastore_tree.md): big-endian; strings u32 length + UTF-8; byte strings
u32 length + bytes; znode data the same, or the length 0xFFFFFFFF alone for null data.
`decode_txn` raises DecodeError on anything malformed, never another error (fuzzed in
tests/test_metastore_txn_fuzz.py). Pure: no I/O.
"""

from __future__ import annotations

import struct

from metastore.core import paths
from metastore.core.acl import ACL, Id, encode_acl
from metastore.errors import BadArguments, DecodeError
from metastore.core.ephemeral_owner import ephemeral_type, is_session_id
from metastore.core.txn import (FORMAT_VERSION, Body, Check, CloseSession, Create, CreateSession, Delete, Error, Multi,
                           Reconfig, SetACL, SetData, Transaction)
from zab.core.ensemble import EnsembleError, parse_spec


# -- byte primitives -----------------------------------------------------------------

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">Bq")          # format version, time_ms
_TAG = struct.Struct(">b")
RECONFIG_TAG = 16  # ZooKeeper's OpCode.reconfig


def _blob(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def _text(value: str) -> bytes:
    return _blob(value.encode())


# Znode data's length when the data is null (ZooKeeper's buffer of length -1). No real length
# comes near it (data is at most 1 MiB), so a decoder that predates it refuses the transaction
# (its length runs past the end) instead of reading null as empty: the format version stays 1.
NULL_DATA_LENGTH = 0xFFFF_FFFF
_NULL_DATA = _U32.pack(NULL_DATA_LENGTH)


def _data(value: bytes | None) -> bytes:
    return _NULL_DATA if value is None else _blob(value)


# Decoded ACL lists by their bytes: a pure memo (same bytes, same value), bounded.
_ACL_CACHE: dict[bytes, tuple[ACL, ...]] = {}
_ACL_CACHE_MAX = 1024


class Reader:
    """Reads a buffer front to back; DecodeError on anything short, long or malformed."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = bytes(buf)
        self.pos = 0

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def unpack(self, st: struct.Struct) -> tuple:
        if self.pos + st.size > len(self.buf):
            raise DecodeError(f"truncated at byte {self.pos}")
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise DecodeError(f"length {n} at byte {self.pos} runs past the end")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def blob(self) -> bytes:
        return self.take(self.unpack(_U32)[0])

    def data(self) -> bytes | None:
        """Znode data: a blob, or None for the null marker."""
        n = self.unpack(_U32)[0]
        return None if n == NULL_DATA_LENGTH else self.take(n)

    def text(self) -> str:
        try:
            return self.blob().decode()
        except UnicodeDecodeError as e:
            raise DecodeError(f"string is not UTF-8: {e}") from None

    def path(self) -> str:
        value = self.text()
        try:
            paths.validate_path(value)
        except BadArguments as e:
            raise DecodeError(f"invalid path: {e}") from None
        return value

    def count(self, min_item_bytes: int) -> int:
        """A u32 element count, refused if the rest of the buffer cannot hold that many."""
        n = self.unpack(_U32)[0]
        if n * min_item_bytes > self.remaining():
            raise DecodeError(f"count {n} at byte {self.pos - 4} cannot fit in the rest")
        return n

    def acl(self) -> tuple[ACL, ...]:
        """An ACL list; the same bytes give the same (shared) tuple, as most znodes share a few ACLs."""
        start = self.pos
        n = self.count(12)
        for _ in range(n):  # find the span first: a cache hit then costs no objects
            self.pos += 4
            self.take(self.unpack(_U32)[0])
            self.take(self.unpack(_U32)[0])
        raw = self.buf[start:self.pos]
        cached = _ACL_CACHE.get(raw)
        if cached is None:
            self.pos = start + 4
            cached = tuple(ACL(self.unpack(_I32)[0], Id(self.text(), self.text())) for _ in range(n))
            if len(_ACL_CACHE) >= _ACL_CACHE_MAX:
                _ACL_CACHE.clear()
            _ACL_CACHE[raw] = cached
        return cached

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise DecodeError(f"{self.remaining()} trailing bytes")


# -- transaction codec ---------------------------------------------------------------
# Tags are ZooKeeper's OpCodes: create 1, delete 2, setData 5, setACL 7, check 13,
# multi 14, createSession -10, closeSession -11, error -1.

_CREATE_TAIL = struct.Struct(">Qi")   # ephemeral owner, parent cversion
_SESSION = struct.Struct(">Qi")       # session id, timeout_ms
_U64 = struct.Struct(">Q")


def _encode_body(body: Body) -> bytes:
    if isinstance(body, Create):
        return (b"\x01" + _text(body.path) + _data(body.data) + encode_acl(body.acl)
                + _CREATE_TAIL.pack(body.ephemeral_owner, body.parent_cversion))
    if isinstance(body, Delete):
        return b"\x02" + _text(body.path)
    if isinstance(body, SetData):
        return b"\x05" + _text(body.path) + _data(body.data) + _I32.pack(body.version)
    if isinstance(body, SetACL):
        return b"\x07" + _text(body.path) + encode_acl(body.acl) + _I32.pack(body.version)
    if isinstance(body, Check):
        return b"\x0d" + _text(body.path) + _I32.pack(body.version)
    if isinstance(body, Multi):
        return b"\x0e" + _U32.pack(len(body.ops)) + b"".join(_encode_body(o) for o in body.ops)
    if isinstance(body, CreateSession):
        return _TAG.pack(-10) + _SESSION.pack(body.session_id, body.timeout_ms)
    if isinstance(body, CloseSession):
        return (_TAG.pack(-11) + _U64.pack(body.session_id) + _U32.pack(len(body.ephemerals))
                + b"".join(_text(p) for p in body.ephemerals))
    if isinstance(body, Error):
        return _TAG.pack(-1) + _I32.pack(body.code)
    if isinstance(body, Reconfig):
        return _TAG.pack(RECONFIG_TAG) + _blob(body.spec)
    raise TypeError(f"not a transaction body: {body!r}")


def encode_txn(txn: Transaction) -> bytes:
    """The canonical bytes of a transaction (struct.error if a field is out of range)."""
    return _HEAD.pack(FORMAT_VERSION, txn.time_ms) + _encode_body(txn.body)


def decode_txn(data: bytes | bytearray | memoryview) -> Transaction:
    """The transaction `data` encodes; DecodeError (only) if it is not a valid one."""
    reader = Reader(data)
    version, time_ms = reader.unpack(_HEAD)
    if version != FORMAT_VERSION:
        raise DecodeError(f"unknown transaction format version {version}")
    body = _decode_body(reader, nested=False)
    reader.end()
    if isinstance(body, Error) and body.code == 0:
        raise DecodeError("an Error transaction needs a non-zero code")
    return Transaction(time_ms, body)


def _decode_create(r: Reader) -> Create:
    path, data, acl = r.path(), r.data(), r.acl()
    owner, parent_cversion = r.unpack(_CREATE_TAIL)
    if path == paths.ROOT:
        raise DecodeError("cannot create the root")
    try:
        ephemeral_type(owner)
    except ValueError as e:
        raise DecodeError(str(e)) from None
    return Create(path, data, acl, owner, parent_cversion)


def _decode_close_session(r: Reader) -> CloseSession:
    session_id = r.unpack(_U64)[0]
    ephemerals = tuple(r.path() for _ in range(r.count(4)))
    if not is_session_id(session_id):
        raise DecodeError(f"{session_id:#x} is not a session id")
    if any(a >= b for a, b in zip(ephemerals, ephemerals[1:])):
        raise DecodeError("closeSession ephemerals must be sorted and distinct")
    return CloseSession(session_id, ephemerals)


def _decode_create_session(r: Reader) -> CreateSession:
    session_id, timeout_ms = r.unpack(_SESSION)
    if not is_session_id(session_id) or timeout_ms <= 0:
        raise DecodeError(f"invalid session {session_id:#x} with timeout {timeout_ms}")
    return CreateSession(session_id, timeout_ms)


def _decode_reconfig(r: Reader) -> Reconfig:
    spec = r.blob()
    try:
        parse_spec(spec)
    except EnsembleError as e:
        raise DecodeError(f"reconfig: {e}") from None
    return Reconfig(spec)


def reconfig_spec(data: bytes) -> bytes | None:
    """The server lines of a reconfig transaction, None for any other (one byte compared for
    those); DecodeError if it claims to be one and is not."""
    if len(data) <= _HEAD.size or data[_HEAD.size] != RECONFIG_TAG:
        return None
    body = decode_txn(data).body
    return body.spec if isinstance(body, Reconfig) else None


def _decode_multi(r: Reader) -> Multi:
    ops = tuple(_decode_body(r, nested=True) for _ in range(r.count(5)))
    errors = sum(isinstance(o, Error) for o in ops)
    if errors not in (0, len(ops)):
        raise DecodeError("a multi is either all ops or all errors")
    return Multi(ops)  # type: ignore[arg-type]


def _decode_body(r: Reader, *, nested: bool) -> Body:
    tag = r.unpack(_TAG)[0]
    if tag == 1:
        return _decode_create(r)
    if tag == 2:
        path = r.path()
        if path == paths.ROOT:
            raise DecodeError("cannot delete the root")
        return Delete(path)
    if tag == 5:
        return SetData(r.path(), r.data(), r.unpack(_I32)[0])
    if tag == -1:
        return Error(r.unpack(_I32)[0])
    if tag == 13 and nested:
        return Check(r.path(), r.unpack(_I32)[0])
    if not nested:
        if tag == 7:
            return SetACL(r.path(), r.acl(), r.unpack(_I32)[0])
        if tag == 14:
            return _decode_multi(r)
        if tag == -10:
            return _decode_create_session(r)
        if tag == -11:
            return _decode_close_session(r)
        if tag == RECONFIG_TAG:
            return _decode_reconfig(r)
    raise DecodeError(f"unknown {'multi op' if nested else 'transaction'} tag {tag}")
