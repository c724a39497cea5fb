"""The metastore's tree snapshot as a stream of bounded pieces (issue 19: streamed snapshots).

`encode_chunks` yields the snapshot of a frozen view (DataTree.freeze) in chunks of at most
`chunk_bytes`, and `SnapshotDecoder` takes the bytes back in pieces of any size, rebuilding the
tree znode by znode (metastore/core/tree_assembly.py). `b"".join(encode_chunks(...))` equals
`encode_snapshot(...)`. The encoder writes format version 4 (docs/metastore_tree.md, "Snapshot
encoding"): each znode's lengths and fixed fields in one header before its path and data (one
pack per znode; versions 2 and 3 have that too, version 1 three pieces), a data length of
0xFFFFFFFF for null data (version 4 only: versions 1 to 3 are version 4 without null data), and
the znodes in the order the tree holds them, the order they were created in, every parent before
its children (versions 1 and 2 sort them by path). The decoder reads all four, so a node's older
snapshot files and a SNAP from a leader that writes an older version still load.

What each side holds beyond the tree itself: the encoder, an index of the ACL table, plus one
chunk and one znode record; the decoder, the bytes of at most one chunk plus the one record that
straddles it. Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from metastore.core import paths
from metastore.core.acl import ACL
from metastore.core.ephemeral_owner import ephemeral_type
from metastore.core.tree import DataTree, Node
from metastore.core.tree_assembly import TreeAssembler
from metastore.errors import BadArguments, DecodeError
from metastore.wire.txn_codec import _SESSION, _U32, Reader

SNAPSHOT_MAGIC = b"QZNT"
SNAPSHOT_VERSION = 4  # what the encoder writes; the decoder also reads versions 1 to 3
# Version 4's data length of a znode with null data (no data bytes follow). Versions 1 to 3 could
# not hold null data: their znodes restore with the data they wrote, b"" where a client sent null.
NULL_DATA_LENGTH = 0xFFFF_FFFF
_SNAP_HEAD = struct.Struct(">4sBQQ")         # magic, version, last_zxid, digest
# Version 2's and 3's znode record: path length, data length, acl index, czxid, mzxid, pzxid, ctime,
# mtime, version, cversion (internal), aversion, owner; then the path and the data.
_RECORD = struct.Struct(">IIIQQQqqiiiQ")
# Version 1's: u32 path length, path, u32 data length, data, then these fixed fields.
_NODE_V1 = struct.Struct(">IQQQqqiiiQ")


# -- encoding ----------------------------------------------------------------------------

def encode_chunks(last_zxid: int, nodes: dict[str, Node], sessions: dict[int, int], digest: int,
                  acls: list[tuple[bytes, tuple[ACL, ...]]], chunk_bytes: int) -> Iterator[bytes]:
    """The snapshot in chunks of at most `chunk_bytes`, each encoded when it is taken; their
    concatenation is encode_snapshot's. `acls` is the tree's ACL table (DataTree.contents), whose
    lists are the very objects its znodes hold: each znode's index is found by the object, since
    hashing a tuple of ACLs per znode was a third of the encoding. The znodes go in the dict's
    order, the order of their creation, which is also where their objects lie in memory: walking
    them by sorted path instead (versions 1 and 2) missed the cache at every znode of a tree that
    clients built, and took twice as long (a million znodes: 2.8 s against 1.4 s).

    Chunks are cut at record boundaries when the next record does not fit (so most are nearly,
    not exactly, full), and a record larger than a chunk is cut across several: every byte is
    copied once into its chunk, and one pack and three list items are all a small znode costs
    (a snapshot of a million znodes is a second of Python, on the snapshotter's thread beside the
    event loop, or in pieces on the leader's loop for a SNAP)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    acl_index = {id(acl): index for index, (_, acl) in enumerate(acls)}
    head = [_SNAP_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, last_zxid, digest), _U32.pack(len(acls)),
            *(encoded for encoded, _ in acls), _U32.pack(len(sessions))]
    head += [_SESSION.pack(s, sessions[s]) for s in sorted(sessions)]
    head.append(_U32.pack(len(nodes) - (paths.CONFIG in nodes)))  # /zookeeper/config is no snapshot's

    parts: list[bytes] = []
    size = 0
    for piece in head:  # small pieces; only a huge session table fills chunks here
        if size + len(piece) > chunk_bytes and parts:
            yield b"".join(parts)
            parts, size = [], 0
        if len(piece) > chunk_bytes:
            yield from _cut(piece, chunk_bytes)
            continue
        parts.append(piece)
        size += len(piece)

    pack, overhead, config = _RECORD.pack, _RECORD.size, paths.CONFIG
    for path, node in nodes.items():
        if path == config:
            continue
        name, data = path.encode(), node.data
        if data is None:
            data, data_len = b"", NULL_DATA_LENGTH
        else:
            data_len = len(data)
        n = len(name) + len(data) + overhead
        if size + n > chunk_bytes and parts:
            yield b"".join(parts)
            parts, size = [], 0
        record = (pack(len(name), data_len, acl_index[id(node.acl)], node.czxid, node.mzxid, node.pzxid,
                       node.ctime, node.mtime, node.version, node.cversion, node.aversion, node.owner),
                  name, data)
        if n > chunk_bytes:
            yield from _cut(b"".join(record), chunk_bytes)
            continue
        parts += record
        size += n
    if parts:
        yield b"".join(parts)


def _cut(piece: bytes, chunk_bytes: int) -> Iterator[bytes]:
    for at in range(0, len(piece), chunk_bytes):
        yield piece[at:at + chunk_bytes]


# -- decoding ----------------------------------------------------------------------------

_HEAD, _ACLS, _SESSIONS, _NODES, _DONE = range(5)


class SnapshotDecoder:
    """Feed a snapshot's bytes in pieces of any size; `finish` returns the tree. DecodeError, as
    soon as it shows, for anything malformed, inconsistent, truncated, trailing or (when verified)
    whose digest is wrong. Only the unparsed tail of what was fed is kept, never what was already
    turned into znodes."""

    def __init__(self, *, verify_digest: bool = True) -> None:
        """`verify_digest=False` takes the snapshot's digest as the tree's without hashing every
        znode, for bytes whose integrity a CRC or a SHA-256 of the whole checks (a node's own
        snapshot file, a SNAP transfer): a third of a restore's time. True also recomputes it."""
        self._verify = verify_digest
        self._buf = bytearray()
        self._pos = 0            # parsed up to here in _buf
        self._stage = _HEAD
        self._left = -1          # items of the current section still to come (-1: its count is next)
        self._acls: list[tuple[ACL, ...]] = []
        self._acl_entries: list[list] = []  # the assembler's interned entry for each of _acls
        self._sessions: dict[int, int] = {}
        self._assembler: TreeAssembler | None = None
        self._zxid = self._digest = self._version = 0
        self._last_acl = b""     # the ACL table's previous entry, encoded
        self.fed = 0

    @property
    def last_zxid(self) -> int | None:
        """The snapshot's zxid, once its header arrived."""
        return None if self._stage == _HEAD else self._zxid

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[:self._pos]  # keep only what is not parsed yet
            self._pos = 0
        self._buf += data
        self.fed += len(data)
        if self._stage == _DONE:
            if self._buf:
                raise DecodeError(f"{len(self._buf)} trailing bytes")
            return
        try:
            while self._step():
                pass
        except (ValueError, BadArguments, KeyError) as e:  # the assembler's refusals
            raise DecodeError(f"inconsistent snapshot: {e}") from None

    def finish(self) -> DataTree:
        if self._stage != _DONE:
            raise DecodeError(f"truncated snapshot: it ends after {self.fed} bytes, inside a record")
        if self._pos != len(self._buf):
            raise DecodeError(f"{len(self._buf) - self._pos} trailing bytes")
        assert self._assembler is not None
        try:
            tree = self._assembler.finish(None if self._verify else self._digest)
        except (ValueError, BadArguments, KeyError) as e:
            raise DecodeError(f"inconsistent snapshot: {e}") from None
        if tree.digest() != self._digest:
            raise DecodeError(f"snapshot digest {self._digest:#x} != content digest {tree.digest():#x}")
        return tree

    def _available(self) -> int:
        return len(self._buf) - self._pos

    def _count(self) -> bool:
        """Read the current section's u32 count if it is next; False if its bytes are not here."""
        if self._left >= 0:
            return True
        if self._available() < 4:
            return False
        (self._left,) = _U32.unpack_from(self._buf, self._pos)
        self._pos += 4
        return True

    def _step(self) -> bool:
        """Parse what the buffer holds of the current section; True if the next section began."""
        if self._stage == _HEAD:
            return self._head()
        if not self._count():
            return False
        if self._stage == _ACLS:
            self._take_acls()
        elif self._stage == _SESSIONS:
            self._take_sessions()
        else:
            self._take_nodes()
        if self._left:
            return False
        self._stage += 1
        self._left = -1
        if self._stage == _NODES:
            self._assembler = TreeAssembler(self._zxid, self._sessions, path_order=self._version < 3)
            self._acl_entries = [self._assembler.acl_entry(acl) for acl in self._acls]
        return self._stage != _DONE

    def _head(self) -> bool:
        if self._available() < _SNAP_HEAD.size:
            return False
        magic, self._version, self._zxid, self._digest = _SNAP_HEAD.unpack_from(self._buf, self._pos)
        if magic != SNAPSHOT_MAGIC or self._version not in (1, 2, 3, SNAPSHOT_VERSION):
            raise DecodeError(f"not a version 1 to {SNAPSHOT_VERSION} tree snapshot")
        self._pos += _SNAP_HEAD.size
        self._stage = _ACLS
        return True

    def _take_acls(self) -> None:
        while self._left:
            end = _acl_end(self._buf, self._pos)
            if end is None:
                return
            encoded = bytes(self._buf[self._pos:end])
            if self._version > 1 and encoded <= self._last_acl:  # one table per tree: sorted, no repeats
                raise DecodeError("the ACL table is not in order of its encodings")
            self._acls.append(Reader(encoded).acl())
            self._pos, self._left, self._last_acl = end, self._left - 1, encoded

    def _take_sessions(self) -> None:
        buf, sessions = self._buf, self._sessions
        while self._left and self._available() >= _SESSION.size:
            session_id, timeout_ms = _SESSION.unpack_from(buf, self._pos)
            if session_id in sessions or timeout_ms <= 0:
                raise DecodeError(f"duplicate or invalid session {session_id:#x}")
            sessions[session_id] = timeout_ms
            self._pos, self._left = self._pos + _SESSION.size, self._left - 1

    def _take_nodes(self) -> None:
        buf, pos, end, left = self._buf, self._pos, len(self._buf), self._left
        add, acls = self._assembler.add_fields, self._acl_entries  # type: ignore[union-attr]
        unpack, head, v1 = _RECORD.unpack_from, _RECORD.size, self._version == 1
        null_marker = NULL_DATA_LENGTH if self._version >= 4 else None  # a length below 4: just a length
        view = memoryview(buf)
        try:
            while left:
                if v1:
                    layout = _v1_layout(buf, pos, end)
                    if layout is None:
                        break
                    path_at, path_end, data_at, data_end, index, czxid, mzxid, pzxid, ctime, mtime, version, \
                        cversion, aversion, owner = layout
                    next_at = data_end + _NODE_V1.size
                    null = False
                else:
                    if pos + head > end:
                        break
                    path_len, data_len, index, czxid, mzxid, pzxid, ctime, mtime, version, cversion, aversion, \
                        owner = unpack(buf, pos)
                    path_at = pos + head
                    path_end = data_at = path_at + path_len
                    null = data_len == null_marker
                    next_at = data_end = data_at + (0 if null else data_len)
                    if next_at > end:
                        break
                try:
                    path = str(view[path_at:path_end], "utf-8")
                except UnicodeDecodeError as e:
                    raise DecodeError(f"string is not UTF-8: {e}") from None
                if index >= len(acls):
                    raise DecodeError(f"{path!r}: ACL index {index} out of range")
                if owner:
                    try:
                        ephemeral_type(owner)
                    except ValueError as e:
                        raise DecodeError(str(e)) from None
                data = None if null else bytes(view[data_at:data_end])
                add(path, data, acls[index], czxid, mzxid, pzxid, ctime, mtime,
                    version, cversion, aversion, owner)
                pos, left = next_at, left - 1
        finally:
            view.release()  # the buffer must be resizable again at the next feed
            self._pos, self._left = pos, left


def _v1_layout(buf: bytearray, pos: int, end: int) -> tuple[int, ...] | None:
    """A version 1 record at `pos`: where its path begins and ends, where its data begins and
    ends, then its fixed fields; None if its bytes have not all arrived."""
    if pos + 4 > end:
        return None
    path_end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    if path_end + 4 > end:
        return None
    data_end = path_end + 4 + _U32.unpack_from(buf, path_end)[0]
    if data_end + _NODE_V1.size > end:
        return None
    return (pos + 4, path_end, path_end + 4, data_end, *_NODE_V1.unpack_from(buf, data_end))


def _acl_end(buf: bytearray, pos: int) -> int | None:
    """Where the ACL list at `pos` ends, or None if its bytes have not all arrived."""
    end = len(buf)
    if pos + 4 > end:
        return None
    (n,) = _U32.unpack_from(buf, pos)
    at = pos + 4
    for _ in range(n):  # perms, scheme, id: each entry is at least 12 bytes, so this ends
        at += 4
        for _ in range(2):
            if at + 4 > end:
                return None
            at += 4 + _U32.unpack_from(buf, at)[0]
        if at > end:
            return None
    return at


def decode_chunks(chunks: Iterable[bytes]) -> DataTree:
    """The tree a snapshot in pieces holds; DecodeError as SnapshotDecoder raises it."""
    decoder = SnapshotDecoder()
    for chunk in chunks:
        decoder.feed(chunk)
    return decoder.finish()
