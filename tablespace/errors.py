"""The table service's errors: each says what to do."""

from __future__ import annotations


class TableError(Exception):
    """Base of the table service's errors."""


class VersionMismatch(TableError):
    """A compare-and-set's expected version is not the key's: read it again and retry."""


class NotLeader(TableError):
    """This replica does not lead the tablespace: send the request to `leader` (None: unknown yet)."""

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class OutcomeUnknown(TableError):
    """The leader lost the tablespace while the change was being written: it may or may not have
    been applied. Read the keys to find out before retrying a compare-and-set."""


class CorruptChange(TableError):
    """A change record or a checkpoint that does not decode: the log or the checkpoint ledger holds
    bytes no leader wrote."""


class BadRequest(TableError):
    """A malformed request: its message says which field."""
