"""The daemon, `clusterd --id N`: one node's services wired in one trio nursery, its admin port and TLS."""
