"""The clean end of a preallocated segment file (the txn log's and the bookie journal's newest
segment): zero bytes after the last record, never a record. Pure: the readers of those files
(zab/storage/record.py, bookie/storage_codec.py, the verifiers) share it.
"""

from __future__ import annotations


def is_zero_fill(view: bytes | bytearray | memoryview) -> bool:
    """Whether `view` holds only zero bytes: what preallocation leaves after the last record."""
    return not bytes(view).strip(b"\0")
