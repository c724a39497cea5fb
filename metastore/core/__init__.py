"""The znode tree and its rules (pure): transactions and their application, request preparation, sessions, watches, ACLs and authentication mechanisms."""
