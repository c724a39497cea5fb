"""The byte encoding of a metastore tree snapshot: what a node writes as its snapshot
and a leader sends in a SNAP sync (zab's opaque state bytes for the metastore).

Deterministic (a tree, its znodes in the same order, gives the same bytes wherever it is
encoded) and checked on the way in: a snapshot whose content does not add up to its digest, or breaks the tree's
invariants, is a DecodeError. Layout: docs/metastore_tree.md. Pure: no I/O. The encoder and
decoder work in pieces (metastore/wire/snapshot_stream.py); this module has their whole forms.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from metastore.core.acl import ACL
from metastore.core.tree import DataTree, Node
from metastore.wire.snapshot_stream import SNAPSHOT_MAGIC, SNAPSHOT_VERSION, decode_chunks, encode_chunks  # noqa: F401


# -- snapshot codec --------------------------------------------------------------------
# The format's one implementation is metastore/wire/snapshot_stream.py's, in pieces; these are
# its whole-buffer forms.

WHOLE_CHUNK_BYTES = 1 << 20  # the pieces joined into a whole snapshot


def encode_snapshot(last_zxid: int, nodes: dict[str, Node], sessions: dict[int, int], digest: int,
                    acls: list[tuple[bytes, tuple[ACL, ...]]]) -> bytes:
    """Deterministic snapshot bytes (the arguments are DataTree.contents()'s)."""
    return b"".join(encode_chunks(last_zxid, nodes, sessions, digest, acls, WHOLE_CHUNK_BYTES))


def decode_snapshot(data: bytes | bytearray | memoryview) -> DataTree:
    """The tree a snapshot holds; DecodeError if malformed, inconsistent, or its digest is wrong."""
    return decode_chunks((data,))


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
    acls: list[tuple[bytes, tuple[ACL, ...]]]  # the ACL table (DataTree.contents)

    @classmethod
    def of(cls, tree: DataTree) -> FrozenTree:
        return cls(*tree.freeze())

    def to_bytes(self) -> bytes:
        """The whole snapshot at once: for small trees and tests; a SNAP and a snapshot file use chunks()."""
        return encode_snapshot(self.zxid, self.nodes, self.sessions, self.digest, self.acls)

    def chunks(self, chunk_bytes: int) -> Iterator[bytes]:
        """The snapshot in pieces of at most `chunk_bytes`, encoded as they are taken (their
        concatenation is to_bytes()); the view never changes, so the tree goes on meanwhile."""
        return encode_chunks(self.zxid, self.nodes, self.sessions, self.digest, self.acls, chunk_bytes)
