"""ledger: BookKeeper-style ledgers striped over bookies, their metadata in the metastore.

Pure, one object per operation: `writer.py` (appends, the ack rule, ensemble changes, close),
`read_op.py`, `recovery_op.py`, `close_op.py`, with `quorum.py`, `metadata.py` and
`placement.py`. Edge: `driver.py` (runs the operations over the bookie pool), `manager.py`
(metadata by CAS through MetaClient), `handles.py` and `client.py` (the SDK: LedgerClient,
WriteHandle, ReadHandle), `client_sync.py`. `autorecovery/` re-replicates the ledgers of a lost
or decommissioned bookie (auditor and replication workers). Docs: docs/ledger.md,
docs/autorecovery.md.
"""
