"""The bytes of a znode that holds a record (ledger metadata, a log's metadata and segments, a
tablespace checkpoint), read from a replayed tree for the verifiers' decoders.

A znode's data may be null (a ZooKeeper client's create or setData with no payload, which the
tree keeps apart from b"": docs/metastore_tree.md); no record is null, so such a znode is one
the verifiers report as broken, with its path, rather than a crash of the decoder.
"""

from __future__ import annotations

from metastore.core.tree import DataTree


class NullZnodeData(ValueError):
    """A znode that should hold a record holds null data (a ValueError, as every decoder's refusal)."""


def record_bytes(tree: DataTree, path: str) -> bytes:
    """The data of the znode at `path`; NullZnodeData if it is null, NoNode if there is none."""
    data = tree.get(path)[0]
    if data is None:
        raise NullZnodeData(f"{path} holds null data, not a record: a client wrote it with no payload "
                            "(create or setData with None); rewrite it or delete it")
    return data
