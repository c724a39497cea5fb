"""The add hot path of BookieStorage, without per-entry objects (pure: no I/O).

`admit_adds` checks a socket read's worth of adds and encodes the journal
records of the accepted ones in one pass; `encode_entry_records` lays out their
entry log records in one buffer. Both write exactly the bytes of
storage_codec.encode_journal_record / encode_entry_record (the formats of
docs/bookie_storage.md); they only avoid building a JournalRecord, an
EntryHeader, a Location or an AddRequest per entry. Anything unusual (a header
that does not parse, an unbound or deleted ledger, another master key, a
fenced ledger) goes to the caller's slow path, which gives the same answer it
always did.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable

from crc32c import crc32c

from bookie.entry import HEADER, HEADER_BYTES, DigestType
from bookie.index import OFFSET_BITS, Index
from bookie.storage_codec import ENTRY_RECORD_HEADER_BYTES, Kind

_IDS = struct.Struct(">QQ")
_FRAME = struct.Struct(">II")
_ENTRY_FRAME = struct.Struct(">II")
_ADD_KIND = bytes((Kind.ADD,))
_MIN_ADD_BODY = 1 + 16  # kind, ledger id, entry id
_DIGEST_BYTES = {t.value: t.size for t in DigestType}
_MAX_ID = 2**63 - 1

# One add as the service hands it over: (ledger_id, entry_id, master_key, packaged entry, recovery).
AddFields = tuple[int, int, bytes, bytes, bool]
# One accepted add: (ledger_id, entry_id, packaged entry, its LAC field).
Admitted = tuple[int, int, bytes, int]


def admit_adds(index: Index, adds: list[AddFields], max_entry_bytes: int, journal: list[bytes],
               admitted: list[Admitted], slow: Callable[[AddFields], object]) -> list:
    """One outcome per add (None: accepted or already stored), appending the accepted adds' journal
    records (as chunks) to `journal` and the adds to `admitted`. `slow(add)` decides every add the
    fast checks do not clear, with the same effects (it may append records itself)."""
    results: list = []
    ledgers = index.ledgers
    last_ledger = last_key = state = None
    for add in adds:
        ledger_id, entry_id, key, data, recovery = add
        n = len(data)
        if n < HEADER_BYTES or n > max_entry_bytes:
            results.append(slow(add))
            continue
        h_ledger, h_entry, lac, _, digest_type = HEADER.unpack_from(data)
        size = _DIGEST_BYTES.get(digest_type)
        if (size is None or n < HEADER_BYTES + size or h_ledger != ledger_id or h_entry != entry_id
                or entry_id > _MAX_ID or ledger_id > _MAX_ID or not -1 <= lac < entry_id):
            results.append(slow(add))
            continue
        if ledger_id != last_ledger or not hmac.compare_digest(key, last_key):
            state = ledgers.get(ledger_id)
            if (state is None or state.master_key is None or len(key) != len(state.master_key)
                    or not hmac.compare_digest(state.master_key, key) or ledger_id in index.deleted):
                last_ledger = None  # unbound, deleted or another key: the slow path binds or refuses
                results.append(slow(add))
                continue
            last_ledger, last_key = ledger_id, key
        if state.fenced and not recovery:
            results.append(slow(add))
            continue
        results.append(None)
        if state.entries.get(entry_id) is not None:
            continue  # already stored and durable (indexed only after its fsync)
        ids = _IDS.pack(ledger_id, entry_id)
        head = _ADD_KIND + ids
        journal.append(_FRAME.pack(_MIN_ADD_BODY + n, crc32c(data, crc32c(head))) + head)
        journal.append(data)
        admitted.append((ledger_id, entry_id, data, lac))
    return results


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
