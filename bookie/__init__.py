"""bookie: one node's ledger entry store and its server, as BookKeeper's bookie.

Pure: `ledger_rules.py` (every decision on adds, fences, LACs and deletes: state + request ->
outcome + journal records), `protocol.py` (the wire codec), `storage_codec.py`, `index.py`,
`checkpoint.py`, `cookie.py` (the data directory's identity), `gc.py`. Edge: `storage.py`
(BookieStorage over `journal.py` and `entrylog.py`, recovered by `storage_recovery.py`),
`service.py` (the trio server), `client.py` (BookieClient, BookiePool), `registration.py`
(the bookie's znodes in the metastore). clusterd runs it on nodes with the bookie role
(clusterd/daemon/bookie_node.py). Docs: docs/bookie_storage.md, docs/bookie_wire.md.
"""
