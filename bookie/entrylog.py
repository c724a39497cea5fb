"""Entry log files: where entries live once journaled (edge).

Entries are appended to the current entry log (`entrylog.<id as 16 hex>`,
records in the bookie.storage_codec format) without an fsync per add: the
journal already made them durable. A checkpoint fsyncs every log with
unsynced bytes and records each log's length; on open, bytes past that
length and logs the checkpoint does not list are what came after it, and
are dropped, because replaying the journal writes them again.

Writes happen in BookieStorage's worker thread; reads (pread on a separate
descriptor) and file removal happen on the event loop, so a read never races
a removal. A checkpoint fsyncs the logs in a thread of its own while adds go
on: it takes a `cut` (each log's size and write count) between two batches,
and then fsyncs what the cut names; writes after the cut are counted for the
next checkpoint, never marked durable by this one.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from bookie.errors import EntryCorrupt, StorageError
from bookie.index import Location, record_size
from bookie.storage_batch import Admitted, encode_entry_records
from bookie.storage_codec import (ENTRY_LOG_MAGIC, FILE_HEADER_BYTES, CorruptRecord, TornRecord, decode_entry_record,
                                  decode_file_header, encode_entry_record, encode_file_header)
from edge.files import FILE_MODE, ensure_directory, fsync_directory, write_all
from edge.segments import fsync_file, truncate_durably

_log = logging.getLogger("quire.bookie.entrylog")
_NAME = re.compile(r"entrylog\.([0-9a-f]{16})")


def log_name(log_id: int) -> str:
    return f"entrylog.{log_id:016x}"


@dataclass
class _Log:
    log_id: int
    path: Path
    size: int
    # Writes appended (by the one thread writing at a time) and writes a checkpoint's fsync covered:
    # counts, not a dirty flag, because a checkpoint fsyncs while later writes go on.
    writes: int = 0
    synced: int = 0
    read_fd: int | None = None


@dataclass(frozen=True)
class Cut:
    """The entry logs as a checkpoint saw them between two batches: what its fsync must cover."""

    logs: tuple[tuple[_Log, int, int], ...]  # (log, its writes then, its size then)
    next_log_id: int

    def sizes(self) -> dict[int, int]:
        return {log.log_id: size for log, _, size in self.logs}


class EntryLogs:
    """The entry log files of one bookie. Use EntryLogs.open()."""

    def __init__(self, directory: Path, logs: dict[int, _Log], next_log_id: int, rotate_bytes: int) -> None:
        self.directory = directory
        self._logs = logs
        self._next_log_id = next_log_id
        self._rotate_bytes = rotate_bytes
        self._current: _Log | None = None
        self._write_fd: int | None = None

    @classmethod
    def open(cls, directory: Path, listed: dict[int, int], next_log_id: int, rotate_bytes: int) -> EntryLogs:
        """Open with the checkpoint's view: `listed` maps each log id to its checkpointed length."""
        ensure_directory(directory)
        logs: dict[int, _Log] = {}
        removed = False
        for name in sorted(os.listdir(directory)):
            match = _NAME.fullmatch(name)
            if not match:
                continue
            log_id, path = int(match.group(1), 16), directory / name
            if log_id not in listed:
                _log.info("entry log %s: removing, written after the last checkpoint", path)
                path.unlink()
                removed = True
                continue
            logs[log_id] = _open_listed(log_id, path, listed[log_id])
        missing = set(listed) - set(logs)
        if missing:
            raise StorageError(f"{directory}: entry logs {sorted(missing)} named by the checkpoint are missing; "
                               "entries this bookie acknowledged are gone: wipe the bookie directory and "
                               "decommission its identity")
        if removed:
            fsync_directory(directory)
        return cls(directory, logs, next_log_id, rotate_bytes)

    @property
    def next_log_id(self) -> int:
        return self._next_log_id

    def sizes(self) -> dict[int, int]:
        # list(): one C-level copy, so a rotation in the writing thread cannot change the dict mid-loop
        return {log_id: log.size for log_id, log in list(self._logs.items())}

    def current_id(self) -> int | None:
        return self._current.log_id if self._current else None

    def append(self, items: list[tuple[int, int, bytes]]) -> list[Location]:
        """Append (ledger, entry, packaged entry) records, one write per log touched; not fsynced."""
        locations: list[Location] = []
        chunks: list[bytes] = []
        for ledger_id, entry_id, data in items:
            if self._current is None or self._current.size >= self._rotate_bytes:
                self._write(chunks)
                chunks = []
                self._rotate()
            record = encode_entry_record(ledger_id, entry_id, data)
            locations.append(Location(self._current.log_id, self._current.size, len(data)))
            self._current.size += len(record)
            chunks.append(record)
        self._write(chunks)
        return locations

    def append_admitted(self, entries: list[Admitted]) -> list[int]:
        """The add hot path of append(): records of (ledger, entry, packaged entry, LAC) tuples, one
        write per log touched, not fsynced; returns their packed positions (index.pack_position)."""
        positions: list[int] = []
        start = 0
        while start < len(entries):
            if self._current is None or self._current.size >= self._rotate_bytes:
                self._rotate()
            chunks: list[bytes] = []
            start, self._current.size = encode_entry_records(entries, start, self._current.log_id, self._current.size,
                                                             self._rotate_bytes, chunks, positions)
            self._write(chunks)
        return positions

    def _write(self, chunks: list[bytes]) -> None:
        if chunks:
            write_all(self._writer(), b"".join(chunks))
            self._current.writes += 1

    def _writer(self) -> int:
        if self._write_fd is None:
            self._write_fd = os.open(self._current.path, os.O_WRONLY | os.O_APPEND)
        return self._write_fd

    def _rotate(self) -> None:
        """Start a new log. The old one is fsynced at the next checkpoint with the others."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        log_id = self._next_log_id
        assert log_id not in self._logs, log_id
        self._next_log_id += 1
        path = self.directory / log_name(log_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, FILE_MODE)
        try:
            write_all(fd, encode_file_header(ENTRY_LOG_MAGIC, log_id))
        finally:
            os.close(fd)
        self._current = self._logs[log_id] = _Log(log_id, path, FILE_HEADER_BYTES, writes=1)

    def cut(self) -> Cut:
        """Each log's size and write count now (on the event loop, with no write in flight)."""
        return Cut(tuple((log, log.writes, log.size) for log in self._logs.values()), self._next_log_id)

    def sync(self, cut: Cut) -> dict[int, int]:
        """Fsync every log with writes the cut counts and no fsync covered yet, and the directory;
        return each log's length at the cut, now durable. Safe while later writes go on (only one
        sync at a time)."""
        for log, writes, _ in cut.logs:
            if writes > log.synced:
                fsync_file(log.path)
                log.synced = writes
        fsync_directory(self.directory)
        return cut.sizes()

    def read(self, where: Location, ledger_id: int, entry_id: int) -> bytes:
        """The packaged entry at `where`; raises EntryCorrupt if its record fails its checks."""
        log = self._logs.get(where.log_id)
        if log is None:
            raise StorageError(f"entry log {where.log_id} of ledger {ledger_id} entry {entry_id} is gone; "
                               "restart the bookie")
        if log.read_fd is None:
            log.read_fd = os.open(log.path, os.O_RDONLY)
        buf = os.pread(log.read_fd, record_size(where.length), where.offset)
        try:
            found_ledger, found_entry, data, _ = decode_entry_record(buf)
        except (TornRecord, CorruptRecord) as err:
            raise EntryCorrupt(f"ledger {ledger_id} entry {entry_id}: stored copy in {log.path} at offset "
                               f"{where.offset} is damaged ({err}); read it from another bookie") from None
        if (found_ledger, found_entry, len(data)) != (ledger_id, entry_id, where.length):
            raise EntryCorrupt(f"ledger {ledger_id} entry {entry_id}: {log.path} at offset {where.offset} holds "
                               f"ledger {found_ledger} entry {found_entry}; read it from another bookie")
        return data

    def read_whole(self, log_id: int) -> tuple[Path, bytes]:
        """A log's bytes up to its known length (for compaction, in the worker thread)."""
        log = self._logs[log_id]
        with open(log.path, "rb") as file:
            return log.path, file.read(log.size)

    def remove(self, log_ids: list[int]) -> None:
        """Delete logs whose entries all moved (after a checkpoint made the move durable)."""
        for log_id in log_ids:
            assert self._current is None or log_id != self._current.log_id, log_id
            log = self._logs.pop(log_id)
            if log.read_fd is not None:
                os.close(log.read_fd)
            log.path.unlink()
        if log_ids:
            fsync_directory(self.directory)

    def close(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        for log in self._logs.values():
            if log.read_fd is not None:
                os.close(log.read_fd)
                log.read_fd = None


def _open_listed(log_id: int, path: Path, size: int) -> _Log:
    with open(path, "rb") as file:
        header = file.read(FILE_HEADER_BYTES)
    actual = path.stat().st_size
    if decode_file_header(header, ENTRY_LOG_MAGIC) != log_id or actual < size:
        raise StorageError(f"{path}: header invalid or shorter ({actual} bytes) than its checkpointed length "
                           f"{size}: acknowledged entries are gone; wipe the bookie directory and decommission "
                           "its identity")
    if actual > size:
        truncate_durably(path, size)  # appended after the checkpoint: the journal replays those entries again
    return _Log(log_id, path, size)
