"""Bytes of the metastore: the ZooKeeper client protocol (jute), the envelope a node hands Zab, the transaction and snapshot codecs."""
