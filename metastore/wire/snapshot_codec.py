"""The byte encoding of a metastore tree snapshot: what a node writes as its snapshot
and a leader sends in a SNAP sync (zab's opaque state bytes for the metastore).

Deterministic (the same tree gives the same bytes on every node) and checked on the way
in: a snapshot whose content does not add up to its digest, or breaks the tree's
invariants, is a DecodeError. Layout: docs/metastore_tree.md. Pure: no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from metastore.core import paths
from metastore.core.acl import ACL, encode_acl
from metastore.errors import BadArguments, DecodeError
from metastore.core.tree import DataTree, Node, NodeRecord, ephemeral_type
from metastore.wire.txn_codec import _SESSION, _U32, Reader, _blob, _text


# -- snapshot codec --------------------------------------------------------------------

SNAPSHOT_MAGIC = b"QZNT"
SNAPSHOT_VERSION = 1
_SNAP_HEAD = struct.Struct(">4sBQQ")         # magic, version, last_zxid, digest
_NODE = struct.Struct(">IQQQqqiiiQ")         # acl index, czxid, mzxid, pzxid, ctime, mtime,
                                             # version, cversion (internal), aversion, owner
_NODE_MIN_BYTES = 8 + _NODE.size


def encode_snapshot(last_zxid: int, nodes: dict[str, Node], sessions: dict[int, int], digest: int) -> bytes:
    """Deterministic snapshot bytes: the same tree gives the same bytes on every node."""
    acl_index: dict[tuple[ACL, ...], int] = {}
    acl_parts: list[bytes] = []
    node_parts: list[bytes] = []
    ordered = sorted(p for p in nodes if p != paths.CONFIG)
    for path in ordered:
        node = nodes[path]
        index = acl_index.get(node.acl)
        if index is None:
            index = acl_index[node.acl] = len(acl_parts)
            acl_parts.append(encode_acl(node.acl))
        node_parts += [_text(path), _blob(node.data), _NODE.pack(
            index, node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime,
            node.version, node.cversion, node.aversion, node.owner)]
    session_parts = [_SESSION.pack(s, sessions[s]) for s in sorted(sessions)]
    return b"".join([_SNAP_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, last_zxid, digest),
                     _U32.pack(len(acl_parts)), *acl_parts,
                     _U32.pack(len(session_parts)), *session_parts,
                     _U32.pack(len(ordered)), *node_parts])


def decode_snapshot(data: bytes | bytearray | memoryview) -> DataTree:
    """The tree a snapshot holds; DecodeError if malformed, inconsistent, or its digest is wrong."""
    r = Reader(data)
    magic, version, last_zxid, digest = r.unpack(_SNAP_HEAD)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise DecodeError(f"not a version {SNAPSHOT_VERSION} tree snapshot")
    acls = [r.acl() for _ in range(r.count(4))]
    sessions: dict[int, int] = {}
    for _ in range(r.count(_SESSION.size)):
        session_id, timeout_ms = r.unpack(_SESSION)
        if session_id in sessions or timeout_ms <= 0:
            raise DecodeError(f"duplicate or invalid session {session_id:#x}")
        sessions[session_id] = timeout_ms
    records = [_read_node(r, acls) for _ in range(r.count(_NODE_MIN_BYTES))]
    r.end()
    try:
        tree = DataTree.assemble(last_zxid, sessions, records)
    except (ValueError, BadArguments, KeyError) as e:
        raise DecodeError(f"inconsistent snapshot: {e}") from None
    if tree.digest() != digest:
        raise DecodeError(f"snapshot digest {digest:#x} != content digest {tree.digest():#x}")
    return tree


def _read_node(r: Reader, acls: list[tuple[ACL, ...]]) -> NodeRecord:
    path, data = r.text(), r.blob()
    index, *fields = r.unpack(_NODE)
    if index >= len(acls):
        raise DecodeError(f"{path!r}: ACL index {index} out of range")
    try:
        ephemeral_type(fields[-1])
    except ValueError as e:
        raise DecodeError(str(e)) from None
    return (path, data, acls[index], *fields)  # type: ignore[return-value]


def encode_tree(tree: DataTree) -> bytes:
    """The snapshot of `tree` at its last_zxid."""
    return encode_snapshot(*tree.contents())


@dataclass(frozen=True, slots=True)
class FrozenTree:
    """zab's Frozen for the metastore: a tree's copy-on-write view at `zxid` (DataTree.freeze),
    encoded later and elsewhere (the log writer's thread, a SNAP sync)."""

    zxid: int
    nodes: dict[str, Node]
    sessions: dict[int, int]
    digest: int

    @classmethod
    def of(cls, tree: DataTree) -> FrozenTree:
        return cls(*tree.freeze())

    def to_bytes(self) -> bytes:
        return encode_snapshot(self.zxid, self.nodes, self.sessions, self.digest)
