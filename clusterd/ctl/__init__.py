"""`clusterctl`: the operator's commands (cluster, znodes, bookies, ledgers, recovery, TLS, verify)."""
