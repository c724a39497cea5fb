"""metastore: a znode tree replicated by Zab, spoken over the ZooKeeper client protocol.

Being built (issue 3): see docs/metastore.md for what exists so far.
"""
