"""Entry log records a batch at a time, without per-entry objects (pure: no I/O).

`encode_entry_records` lays out the entry log records of a batch's accepted adds in one
buffer, exactly the bytes of storage_codec.encode_entry_record (the format of
docs/bookie_storage.md), without building a Location per entry. Which adds are accepted, and
their journal records, is bookie/ledger_rules.py's (`LedgerRules.admit_adds`).
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from bookie.index import OFFSET_BITS
from bookie.ledger_rules import Admitted
from bookie.storage_codec import ENTRY_RECORD_HEADER_BYTES

_IDS = struct.Struct(">QQ")
_ENTRY_FRAME = struct.Struct(">II")


def encode_entry_records(entries: list[Admitted], start: int, log_id: int, offset: int, max_offset: int,
                         chunks: list[bytes], positions: list[int]) -> tuple[int, int]:
    """Lay out the entry log records of entries[start:] in log `log_id` from `offset` on: their bytes
    join `chunks`, their packed positions (index.pack_position) join `positions`. Stops before a
    record that would start at or past `max_offset` (the log rotates). Returns (the index of the
    first entry not laid out, the offset after the last one)."""
    end = len(entries)
    high = log_id << OFFSET_BITS
    while start < end and offset < max_offset:
        ledger_id, entry_id, data, _ = entries[start]
        ids = _IDS.pack(ledger_id, entry_id)
        chunks.append(_ENTRY_FRAME.pack(len(data), crc32c(data, crc32c(ids))) + ids)
        chunks.append(data)
        positions.append(high | offset)
        offset += ENTRY_RECORD_HEADER_BYTES + len(data)
        start += 1
    return start, offset
