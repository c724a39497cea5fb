"""Named logs on ledgers (seed 004, DistributedLog): an endless, named stream of records that
survives its writer's crashes and can be truncated, stored as a list of segments, one ledger each.

Pure parts: positions (`position.py`), the records packed into an entry (`record_set.py`), a
segment's and a log's metadata and the operations on the segment list (`segment.py`,
`log_metadata.py`, `segment_list.py`). Edge: the namespace of logs in the metastore
(`namespace.py`), the single writer with its ownership and fencing (`writer.py`), readers
(`reader.py`). docs/streams.md describes the layout, the protocol and the guarantees.
"""
