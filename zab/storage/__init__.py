"""The txn log, snapshots and epoch files on disk: formats, recovery, and their writers."""
