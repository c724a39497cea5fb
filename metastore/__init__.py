"""metastore: a znode tree replicated by Zab, spoken over ZooKeeper's client protocol.

`core/` is the pure state machine (the tree, transactions and their preparation, sessions,
watches, ACLs, SASL mechanisms, reconfig), `wire/` the bytes (jute, the envelope, the txn and
snapshot codecs), `edge/` the client port clusterd serves (connections, the input guard, SASL,
four-letter words), `client/` Quire's trio client MetaClient and its recipes (Lock,
LeaderElection, IdGenerator). Docs: docs/metastore.md, docs/metastore_client.md,
docs/metastore_wire.md.
"""
