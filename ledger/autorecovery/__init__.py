"""AutoRecovery: the pure repair planning and the auditor and replication workers that carry it out."""
