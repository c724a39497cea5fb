"""Bookie files and ledger metadata for the ledger verifier: pure functions over bytes and trees.

Every byte goes through the bookie's own codecs (bookie/storage_codec.py: journal and entry
log records, bookie/entry.py: packaged entry headers and CRC32C digests) and the ledger
metadata through ledger/metadata.py. Entries of HMAC ledgers cannot be checked without the
password: their digest status is "unchecked".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bookie.entry import EntryFormatError, crc32c_digest_ok, parse_header
from bookie.storage_codec import (ENTRY_LOG_MAGIC, FILE_HEADER_BYTES, JOURNAL_MAGIC, Kind, decode_file_header,
                                  scan_entry_log, scan_journal)
from ledger.metadata import LedgerMetadata, LedgerMetadataError, decode, ledger_id_from_path
from metastore.core.tree import DataTree
from replay.znode_data import record_bytes

DIGEST_OK, DIGEST_BAD, DIGEST_UNCHECKED = "ok", "bad", "unchecked"
# One stored entry: (ledger, entry, lac, length, digest status, offset or -1) or a damaged record.
EntryRow = tuple[int, int, int, int, str, int]


@dataclass
class BookieFile:
    """What one journal segment or entry log holds: entries, deletions, and where a scan stopped."""

    entries: list[EntryRow]
    deleted: list[int]
    header_ok: bool
    stop: str


def _entry(ledger_id: int, entry_id: int, data: bytes | memoryview, offset: int) -> EntryRow:
    try:
        header = parse_header(data)
        ok = crc32c_digest_ok(bytes(data))
    except EntryFormatError:
        return (ledger_id, entry_id, -1, -1, DIGEST_BAD, offset)
    if header.ledger_id != ledger_id or header.entry_id != entry_id:
        return (ledger_id, entry_id, header.lac, header.length, DIGEST_BAD, offset)
    status = DIGEST_UNCHECKED if ok is None else DIGEST_OK if ok else DIGEST_BAD
    return (ledger_id, entry_id, header.lac, header.length, status, offset)


def journal_file(buf: bytes) -> BookieFile:
    """The ADDs (and DELETEs) of a journal segment."""
    header_ok = decode_file_header(buf, JOURNAL_MAGIC) is not None
    scan = scan_journal(buf, FILE_HEADER_BYTES)
    entries = [_entry(r.ledger_id, r.value, r.data, -1) for r in scan.records if r.kind == Kind.ADD]
    deleted = [r.ledger_id for r in scan.records if r.kind == Kind.DELETE]
    return BookieFile(entries, deleted, header_ok, str(scan.stop) if scan.stop else "")


def entry_log_file(buf: bytes) -> BookieFile:
    """The entries of an entry log (record CRCs checked by the codec, digests here)."""
    header_ok = decode_file_header(buf, ENTRY_LOG_MAGIC) is not None
    found, _, stop = scan_entry_log(buf, FILE_HEADER_BYTES)
    view = memoryview(buf)
    entries = [_entry(ledger, entry, view[offset + 24: offset + 24 + length], offset)
               for ledger, entry, offset, length in found]
    return BookieFile(entries, [], header_ok, str(stop) if stop else "")


def stored_entries(buf: bytes, kind: str) -> Iterator[tuple[int, int, memoryview]]:
    """(ledger, entry, packaged entry) of every ADD in a journal segment ("journal") or entry
    in an entry log ("entrylogs"), as the bookie's codec reads them."""
    if kind == "journal":
        for r in scan_journal(buf, FILE_HEADER_BYTES).records:
            if r.kind == Kind.ADD:
                yield r.ledger_id, r.value, memoryview(r.data)
        return
    found, _, _ = scan_entry_log(buf, FILE_HEADER_BYTES)
    view = memoryview(buf)
    for ledger, entry, offset, length in found:
        yield ledger, entry, view[offset + 24: offset + 24 + length]


def ledgers_in(tree: DataTree, root: str) -> tuple[list[LedgerMetadata], list[str]]:
    """Every ledger's metadata under `root` in a metastore tree, and the znodes that do not decode."""
    found: list[LedgerMetadata] = []
    broken: list[str] = []
    if tree.node(root) is None:
        return found, broken
    stack = [root]
    while stack:
        path = stack.pop()
        children = tree.children(path)
        stack.extend(f"{path}/{c}" for c in children)
        try:
            ledger_id_from_path(root, path)
        except LedgerMetadataError:
            continue  # a folder level, or an owned ledger's guard child (ledger/manager.py)
        try:
            found.append(decode(record_bytes(tree, path)))
        except (LedgerMetadataError, ValueError, KeyError) as err:
            broken.append(f"{path}: {err}")
    return sorted(found, key=lambda m: m.ledger_id), broken
