"""The tree digest's hashes (docs/metastore_tree.md, "Digest"): one 64-bit hash per znode and per
session, whose sum mod 2^64 is DataTree.digest(). BLAKE2b rather than ZooKeeper's CRC32, and the
sessions included; a znode's data is hashed apart (128 bits, cached on the znode) so that a change
to a znode's counters does not rehash its data.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

from metastore.core import paths

if TYPE_CHECKING:
    from metastore.core.tree import Node

_HASH_STAT = struct.Struct(">QQQqqiiiQI")
_SESSION = struct.Struct(">Qi")
_LEN = struct.Struct(">I")


# Null data is not empty data (ZooKeeper keeps them apart, and so does the tree), so it hashes apart:
# a replica that lost the difference must show a different digest. ZooKeeper's DigestCalculator
# skips null data, making the two equal; every digest of a tree without null data is unchanged.
_NULL_DATA_HASH = hashlib.blake2b(b"", digest_size=16, person=b"quire:null-data").digest()


ZnodeData = bytes | None  # a znode's data: None is null data (ZooKeeper's buffer of length -1)


def data_hash(data: ZnodeData) -> bytes:
    """A znode's data, hashed for its node_hash (None, null data, has a hash of its own)."""
    if data is None:
        return _NULL_DATA_HASH
    return hashlib.blake2b(data, digest_size=16).digest()


def node_hash(path: str, node: Node, acl_bytes: bytes, hashed_data: bytes) -> int:
    """One znode's share of the digest: its path, data hash, ACL bytes, stat and number of
    children; 0 for /zookeeper/config, which is each node's own and outside the digest."""
    if path == paths.CONFIG:
        return 0
    fixed = _HASH_STAT.pack(node.czxid, node.mzxid, node.pzxid, node.ctime, node.mtime, node.version,
                            node.cversion, node.aversion, node.owner, len(node.children))
    raw_path = path.encode()
    payload = b"N" + _LEN.pack(len(raw_path)) + raw_path + hashed_data + acl_bytes + fixed
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


def session_hash(session_id: int, timeout_ms: int) -> int:
    """One session's share of the digest."""
    payload = b"S" + _SESSION.pack(session_id, timeout_ms)
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")
