"""The bookie's typed errors: each is one per-request status on the wire (bookie/protocol.py).

A bookie answers a request it cannot serve with one of these; the ledger SDK
raises the same class on its side, so code on both ends names the outcome the
same way (BookKeeper's return codes, as exceptions).
"""

from __future__ import annotations


class BookieError(Exception):
    """Base of every per-request outcome a bookie can report."""


class NoSuchLedger(BookieError):
    """This bookie holds nothing of the ledger (never written here, or deleted)."""


class NoSuchEntry(BookieError):
    """This bookie has the ledger but not the entry: an explicit "not here", unlike a timeout."""


class LedgerFenced(BookieError):
    """The ledger is fenced on this bookie: a recoverer took it over. For a writer the add's
    outcome is unknown until recovery closes the ledger (seed 001): treat it as a timeout."""


class Unauthorized(BookieError):
    """The request's master key differs from the one the ledger was first written with: wrong password."""


class EntryTooLarge(BookieError):
    """The entry exceeds the bookie's max_entry_bytes."""


class BookieReadOnly(BookieError):
    """The bookie's disk passed its fullness threshold: it serves reads but refuses adds."""


class Overloaded(BookieError):
    """The bookie has too many requests in flight; retry later or elsewhere."""


class BadRequest(BookieError):
    """The request was malformed; the connection is closed after this answer."""


class EntryCorrupt(BookieError):
    """This bookie's stored copy of the entry fails its on-disk checksum (bit rot, a disk that lied).
    Read the entry from another bookie of its write quorum; the operator should check this disk."""


class BookieUnavailable(BookieError):
    """Client side only: no answer from the bookie (connection refused, lost or timed out)."""


class StorageError(Exception):
    """The bookie's data directory cannot be used; the message says what to do. Not a per-request error."""


class JournalWriteFailed(StorageError):
    """Writing or fsyncing the journal failed while the bookie ran (no space, an I/O error). The
    node stops (fail-stop): after a failed fsync the kernel may have dropped the pages, so no later
    add may be acknowledged. What the bookie acknowledged before is on disk."""


# What the operator does about JournalWriteFailed.
FIX_THE_JOURNAL_DISK = (
    "the node stopped rather than acknowledge what it may not have written. Fix the disk (free "
    "space, its errors in the kernel log), then start the node again: the bookie replays its journal")


class CookieMismatch(StorageError):
    """The data directory does not belong to this bookie (wiped, swapped or another cluster's)."""
