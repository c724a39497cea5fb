"""The shared edge layer: I/O every edge of Quire does the same way, written once (files,
sockets, the TLS stream, a trio loop in a thread). Below zab/, metastore/ and bookie/; it
imports none of them (docs/architecture.md, "The shared edge layer")."""
