"""The metastore's tree snapshot as a stream of bounded pieces (issue 19: streamed snapshots).

`encode_chunks` yields the snapshot of a frozen view (DataTree.freeze) in chunks of at most
`chunk_bytes`, and `SnapshotDecoder` takes the bytes back in pieces of any size, rebuilding the
tree znode by znode (metastore/core/tree_assembly.py). The bytes are format version 1 exactly
as the whole-buffer codec always wrote them (docs/metastore_tree.md, "Snapshot encoding"), so
old snapshot files load and `b"".join(encode_chunks(...))` equals `encode_snapshot(...)`.

What each side holds beyond the tree itself: the encoder, the sorted list of paths (references)
and the table of distinct ACLs, plus one chunk and one znode record; the decoder, the bytes of
at most one chunk plus the one record that straddles it. Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from metastore.core import paths
from metastore.core.acl import ACL, encode_acl
from metastore.core.tree import DataTree, Node, ephemeral_type
from metastore.core.tree_assembly import TreeAssembler
from metastore.errors import BadArguments, DecodeError
from metastore.wire.txn_codec import _SESSION, _U32, Reader

SNAPSHOT_MAGIC = b"QZNT"
SNAPSHOT_VERSION = 1
_SNAP_HEAD = struct.Struct(">4sBQQ")         # magic, version, last_zxid, digest
SORT_RUN = 1 << 15  # paths sorted by one call: tens of milliseconds with the GIL held
_NODE = struct.Struct(">IQQQqqiiiQ")         # acl index, czxid, mzxid, pzxid, ctime, mtime,
                                             # version, cversion (internal), aversion, owner


# -- encoding ----------------------------------------------------------------------------

# A znode record's bytes beyond its path and data: the two length prefixes and the fixed fields.
_RECORD_OVERHEAD = 4 + 4 + _NODE.size


def encode_chunks(last_zxid: int, nodes: dict[str, Node], sessions: dict[int, int], digest: int,
                  chunk_bytes: int) -> Iterator[bytes]:
    """The snapshot in chunks of at most `chunk_bytes`, each encoded when it is taken; their
    concatenation is encode_snapshot's.

    Chunks are cut at record boundaries when the next record does not fit (so most are nearly,
    not exactly, full), and a record larger than a chunk is cut across several: every byte is
    copied once into its chunk, and about one list append per field is all a small znode costs
    (a snapshot of a million znodes is seconds of Python, on the snapshotter's thread beside the
    event loop)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    ordered = sorted_paths(nodes)
    records = [nodes[path] for path in ordered]
    # The ACL table comes first in the format: a pass to collect it (few lists). Looked up by the
    # list object (the tree interns them) before its value: hashing a tuple of ACLs per znode
    # was a third of the encoding.
    acl_index: dict[tuple[ACL, ...], int] = {}
    by_object: dict[int, int] = {}
    acl_parts: list[bytes] = []
    indexes = []
    for node in records:
        index = by_object.get(id(node.acl))
        if index is None:
            index = acl_index.get(node.acl)
            if index is None:
                index = acl_index[node.acl] = len(acl_parts)
                acl_parts.append(encode_acl(node.acl))
            by_object[id(node.acl)] = index
        indexes.append(index)
    head = [_SNAP_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, last_zxid, digest), _U32.pack(len(acl_parts)),
            *acl_parts, _U32.pack(len(sessions))]
    head += [_SESSION.pack(s, sessions[s]) for s in sorted(sessions)]
    head.append(_U32.pack(len(ordered)))

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

    pack_len, pack_node = _U32.pack, _NODE.pack
    for path, node, acl in zip(ordered, records, indexes):
        name, data = path.encode(), node.data
        n = len(name) + len(data) + _RECORD_OVERHEAD
        if size + n > chunk_bytes and parts:
            yield b"".join(parts)
            parts, size = [], 0
        record = (pack_len(len(name)), name, pack_len(len(data)), data, pack_node(
            acl, node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime,
            node.version, node.cversion, node.aversion, node.owner))
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


def sorted_paths(nodes: dict[str, Node]) -> list[str]:
    """The snapshot's paths in order, sorted in runs of SORT_RUN and then merged by one sort of
    the whole, which finds the runs and only merges them: one sort of a million paths in the
    order clients created them is a single call that holds the GIL for about a second, and the
    snapshot is encoded on a thread beside the event loop, whose followers then give up on it
    after sync_limit_ticks (bench/large_tree.py saw the leader go quiet that long). A restored
    tree's paths come in order already, and each sort then only checks them."""
    keys = [p for p in nodes if p != paths.CONFIG]
    for at in range(0, len(keys), SORT_RUN):
        keys[at:at + SORT_RUN] = sorted(keys[at:at + SORT_RUN])
    keys.sort()  # n log(runs) comparisons at most: a fraction of a sort of disordered paths
    return keys


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
        self._zxid = self._digest = 0
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
            self._assembler = TreeAssembler(self._zxid, self._sessions)
            self._acl_entries = [self._assembler.acl_entry(acl) for acl in self._acls]
        return self._stage != _DONE

    def _head(self) -> bool:
        if self._available() < _SNAP_HEAD.size:
            return False
        magic, version, self._zxid, self._digest = _SNAP_HEAD.unpack_from(self._buf, self._pos)
        if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
            raise DecodeError(f"not a version {SNAPSHOT_VERSION} tree snapshot")
        self._pos += _SNAP_HEAD.size
        self._stage = _ACLS
        return True

    def _take_acls(self) -> None:
        while self._left:
            end = _acl_end(self._buf, self._pos)
            if end is None:
                return
            self._acls.append(Reader(self._buf[self._pos:end]).acl())
            self._pos, self._left = end, self._left - 1

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
        add, acls, u32, node = self._assembler.add_fields, self._acl_entries, _U32.unpack_from, _NODE  # type: ignore[union-attr]
        unpack_node = node.unpack_from
        view = memoryview(buf)
        try:
            while left and pos + 4 <= end:
                data_at = pos + 4 + u32(buf, pos)[0]
                if data_at + 4 > end:
                    break
                fixed_at = data_at + 4 + u32(buf, data_at)[0]
                if fixed_at + node.size > end:
                    break
                try:
                    path = str(view[pos + 4:data_at], "utf-8")
                except UnicodeDecodeError as e:
                    raise DecodeError(f"string is not UTF-8: {e}") from None
                index, czxid, mzxid, pzxid, ctime, mtime, version, cversion, aversion, owner = \
                    unpack_node(buf, fixed_at)
                if index >= len(acls):
                    raise DecodeError(f"{path!r}: ACL index {index} out of range")
                if owner:
                    try:
                        ephemeral_type(owner)
                    except ValueError as e:
                        raise DecodeError(str(e)) from None
                add(path, bytes(view[data_at + 4:fixed_at]), acls[index], czxid, mzxid, pzxid, ctime, mtime,
                    version, cversion, aversion, owner)
                pos, left = fixed_at + node.size, left - 1
        finally:
            view.release()  # the buffer must be resizable again at the next feed
            self._pos, self._left = pos, left


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
