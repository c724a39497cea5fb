"""What a named log's operations raise: each message says what happened and what to do."""

from __future__ import annotations


class StreamError(Exception):
    """Base of the named logs' errors."""


class LogNotFound(StreamError):
    """No log of that name in the namespace."""


class LogExists(StreamError):
    """A log of that name exists already."""


class LogFenced(StreamError):
    """This writer no longer owns the log: another writer took it over (and fenced this one's
    segment), or its ownership lapsed. Nothing it writes from here on becomes visible; records
    whose writes failed with this error may or may not be in the log (read it to find out)."""


class OwnershipTaken(StreamError):
    """Another writer owns the log and `wait` was not asked for."""


class TxidOutOfOrder(StreamError):
    """A record's transaction id must be greater than the previous record's."""


class RecordTooLarge(StreamError):
    """A record larger than a record set (an entry) can hold."""


class PositionTruncated(StreamError):
    """The position asked for was truncated away: open the reader at the head instead."""


class CorruptMetadata(StreamError):
    """A log's metadata in the metastore is not what this version of Quire writes (written by
    something else, or damaged): the operation refuses it rather than guess."""


class CorruptRecordSet(StreamError):
    """An entry of a segment is not a record set (the ledger was written by something else)."""
