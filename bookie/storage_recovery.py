"""Opening a bookie directory: cookie, checkpoint, entry logs, journal replay (edge, synchronous).

BookieStorage.open() runs recover() in a worker thread. Layout of the bookie
directory (docs/bookie_storage.md):

    cookie          the directory's identity (bookie/cookie.py)
    checkpoint      the index image and the journal position it covers (bookie/checkpoint.py)
    journal/        journal.<seq>: adds, keys, fences, LACs, deletions since then, and a copy
                    of the cookie; a directory, or a link to one elsewhere (place_journal)
    entrylogs/      entrylog.<id>: the entries themselves
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bookie.checkpoint import PIECE_BYTES, Checkpoint, decode_checkpoint_from, encode_checkpoint
from bookie.cookie import Cookie, check_cookie, decode_cookie, encode_cookie
from bookie.entry import parse_header
from bookie.entrylog import EntryLogs
from bookie.errors import CookieMismatch, StorageError
from bookie.index import Index, record_size
from bookie.journal import Journal
from bookie.ledger_rules import LedgerRules
from bookie.storage_codec import JournalRecord, Kind
from bookie.storage_config import BookieStorageConfig
from edge.files import ensure_directory, fsync_directory, write_atomically

_log = logging.getLogger("quire.bookie.storage")
COOKIE = "cookie"
CHECKPOINT = "checkpoint"
JOURNAL_DIR = "journal"
ENTRYLOG_DIR = "entrylogs"
_REPLAY_CHUNK = 1024


@dataclass
class Recovered:
    cookie: Cookie
    index: Index
    journal: Journal
    entrylogs: EntryLogs
    replayed_records: int


def recover(directory: Path, bookie_id: int, config: BookieStorageConfig, instance_id: str | None,
            cluster: str | None, journal_directory: Path | None = None) -> Recovered:
    """Check the cookie (creating it on a fresh directory), load the checkpoint, replay the journal.
    With `journal_directory`, the journal lives there (place_journal)."""
    ensure_directory(directory)
    cookie = _open_cookie(directory, bookie_id, instance_id, cluster)
    checkpointed = (directory / CHECKPOINT).exists()
    if journal_directory is not None:
        place_journal(directory, journal_directory)
    _check_journal_cookie(directory, cookie, holds_data=checkpointed or any((directory / ENTRYLOG_DIR).glob("*")))
    checkpoint = read_checkpoint(directory / CHECKPOINT)
    entrylogs = EntryLogs.open(directory / ENTRYLOG_DIR, {k: v[0] for k, v in checkpoint.logs.items()},
                               checkpoint.next_log_id, config.entry_log_bytes)
    try:
        journal = Journal.open(directory / JOURNAL_DIR, from_seq=checkpoint.journal_seq,
                               segment_bytes=config.journal_segment_bytes, checkpointed=checkpointed)
    except BaseException:
        entrylogs.close()
        raise
    index = checkpoint.index
    replayed = replay(journal, index, entrylogs)
    _log.info("bookie storage %s: checkpoint at journal segment %d, replayed %d journal records, %d ledgers",
              directory, checkpoint.journal_seq, replayed, len(index.ledgers))
    return Recovered(cookie, index, journal, entrylogs, replayed)


def precheck_cookie(directory: Path, bookie_id: int, cluster: str | None) -> None:
    """What can be refused before the metastore says which instance is registered: a cookie that
    does not decode, another bookie's or another cluster's, another layout, data without a cookie.
    Raises as recover() would (CookieMismatch, StorageError); writes nothing."""
    path = directory / COOKIE
    found = decode_cookie(path.read_bytes()) if path.exists() else None
    has_data = any((directory / name).exists() for name in (CHECKPOINT, JOURNAL_DIR, ENTRYLOG_DIR))
    check_cookie(found, bookie_id=bookie_id, instance_id=None, cluster=cluster, has_data=has_data,
                 where=str(directory))


def _open_cookie(directory: Path, bookie_id: int, instance_id: str | None, cluster: str | None) -> Cookie:
    path = directory / COOKIE
    found = decode_cookie(path.read_bytes()) if path.exists() else None
    has_data = any((directory / name).exists() for name in (CHECKPOINT, JOURNAL_DIR, ENTRYLOG_DIR))
    check_cookie(found, bookie_id=bookie_id, instance_id=instance_id, cluster=cluster, has_data=has_data,
                 where=str(directory))
    if found is not None:
        return found
    cookie = Cookie(bookie_id, secrets.token_hex(16), cluster or "")
    # Written before anything else, so a directory with data and no cookie is never ours.
    write_atomically(path, [encode_cookie(cookie)])
    return cookie


def place_journal(directory: Path, journal_directory: Path) -> None:
    """Make `<directory>/journal` a symbolic link to `journal_directory` (created if need be), so the
    journal can have a device of its own (BookKeeper's journalDirectories): a bookie writes every
    entry twice, to the journal and to an entry log. Whatever reads the journal follows the link.
    Refuses (StorageError) a journal already in place elsewhere: a real `journal` directory that
    holds files, a link to another directory, or a target with journal files and no cookie."""
    link, target = directory / JOURNAL_DIR, journal_directory.resolve()
    if link.is_symlink():
        if link.resolve() != target:
            raise StorageError(f"{link} links to {link.resolve()}, not to the configured journal directory "
                               f"{target}: move the journal there and relink it, or configure {link.resolve()}")
        return
    if link.exists():
        if any(link.iterdir()):
            raise StorageError(f"{link} holds this bookie's journal, but the journal is configured at {target}: "
                               f"stop the bookie, move {link}'s files to {target}, remove {link}, and start it")
        link.rmdir()
    ensure_directory(target)
    if not (target / COOKIE).exists() and any(target.iterdir()):
        raise StorageError(f"{target} is not empty and has no bookie cookie: give the journal an empty directory")
    link.symlink_to(target, target_is_directory=True)
    fsync_directory(directory)


def _check_journal_cookie(directory: Path, cookie: Cookie, *, holds_data: bool) -> None:
    """The journal directory carries a copy of the bookie's cookie, so a journal that is another
    bookie's or another instance's (swapped or restored devices) is refused, not replayed; and a
    linked one without it while the bookie directory holds data was wiped, replaced or not
    mounted. A journal inside the bookie directory gets its copy on first open (older layouts)."""
    journal = directory / JOURNAL_DIR
    path = journal / COOKIE
    if path.exists():
        found = decode_cookie(path.read_bytes())
        if (found.bookie_id, found.instance_id) != (cookie.bookie_id, cookie.instance_id):
            raise CookieMismatch(f"{journal} holds the journal of bookie {found.bookie_id} instance "
                                 f"{found.instance_id}, not of bookie {cookie.bookie_id} instance "
                                 f"{cookie.instance_id}: the journal directories were swapped; point each bookie "
                                 "at its own")
        return
    if journal.is_symlink() and holds_data:
        raise CookieMismatch(f"{journal} (linked to {journal.resolve()}) has no cookie while {directory} holds "
                             "bookie data: the journal's device was wiped, replaced or is not mounted, and adds "
                             "this bookie acknowledged may be gone. Mount the right device, or decommission the "
                             "bookie's identity and wipe both directories")
    ensure_directory(journal.resolve())
    write_atomically(path, [encode_cookie(cookie)])


def read_checkpoint(path: Path, piece_bytes: int = PIECE_BYTES) -> Checkpoint:
    """The checkpoint file, or the empty state of a fresh directory (journal from segment 1).

    Streamed (decode_checkpoint_from): the file is read `piece_bytes` at a time and the index built
    as it comes, so loading costs the index plus one piece, never the file's bytes whole."""
    for leftover in path.parent.glob(path.name + ".tmp"):
        leftover.unlink()
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return Checkpoint(journal_seq=1, next_log_id=1)
    try:
        with file:
            return decode_checkpoint_from(file.read, piece_bytes)
    except StorageError as err:
        raise StorageError(f"{path}: {err}; the journal before it is trimmed, so the index cannot be rebuilt "
                           "here: wipe the bookie directory and decommission its identity") from None


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> int:
    """tmp + fsync + rename + directory fsync, streamed (encode_checkpoint); returns the file's size."""
    written = [0]

    def counted() -> Iterator[bytes]:
        for chunk in encode_checkpoint(checkpoint):
            written[0] += len(chunk)
            yield chunk

    write_atomically(path, counted())
    return written[0]


def replay(journal: Journal, index: Index, entrylogs: EntryLogs) -> int:
    """Apply the journal after the checkpoint; ADDs missing from the index go to the entry logs again.

    What each record means is bookie/ledger_rules.py's (`LedgerRules.replay`, `needs_entry`).
    Idempotent over a checkpoint that already holds some effects (a fence is
    set in memory before its record is written, and may be in the image).
    """
    rules = LedgerRules(index)
    count = 0
    pending: list[JournalRecord] = []
    for record in journal.records():
        count += 1
        if record.kind is Kind.ADD:
            pending.append(record)
            if len(pending) >= _REPLAY_CHUNK:
                _replay_adds(pending, rules, entrylogs)
                pending = []
            continue
        _replay_adds(pending, rules, entrylogs)
        pending = []
        rules.replay(record)
    _replay_adds(pending, rules, entrylogs)
    return count


def _replay_adds(records: list[JournalRecord], rules: LedgerRules, entrylogs: EntryLogs) -> None:
    todo = [r for r in records if rules.needs_entry(r.ledger_id, r.value)]
    if not todo:
        return
    locations = entrylogs.append([(r.ledger_id, r.value, r.data) for r in todo])
    for record, where in zip(todo, locations):
        rules.index.put(record.ledger_id, record.value, parse_header(record.data).lac, where,
                        record_size(len(record.data)))


def disk_usage_fraction(directory: Path) -> float:
    """The fraction in use of the fuller of the filesystems holding the bookie directory and its
    journal (the same one unless the journal is linked elsewhere), by shutil.disk_usage."""
    journal = directory / JOURNAL_DIR
    fractions = []
    for place in (directory, journal) if journal.is_symlink() and journal.exists() else (directory,):
        usage = shutil.disk_usage(place)
        fractions.append(usage.used / usage.total if usage.total else 1.0)
    return max(fractions)


def read_only_reason(disk_usage: float, index_bytes: int, config: BookieStorageConfig) -> str | None:
    """Why adds are refused (the disk above disk_usage_threshold, or the index's memory above
    max_index_bytes: docs/operations.md, "Memory bounds"), or None: the bookie is writable."""
    if disk_usage > config.disk_usage_threshold:
        return (f"bookie disk is {disk_usage:.1%} full (threshold {config.disk_usage_threshold:.0%}): it refuses "
                "adds; write elsewhere")
    if index_bytes > config.max_index_bytes:
        return (f"bookie index holds {index_bytes} bytes in memory, above bookie_max_index_bytes "
                f"{config.max_index_bytes}: it refuses adds; write elsewhere, delete ledgers or raise the bound")
    return None
