"""Snapshot files of the state machine.

A snapshot file `<data_dir>/snapshots/snapshot.<zxid as 16 lowercase hex>` holds
the state machine's opaque state after applying every txn up to `zxid`.
Layout, integers big-endian (see docs/formats.md, "Snapshots"):

    offset  size  field
    0       4     magic         b"QSNP"
    4       4     version       u32, 1
    8       8     zxid          u64, must equal the zxid in the file name
    16      8     body_length   u64, must equal file size - 32
    24      4     body_crc      u32, CRC-32C of the body
    28      4     header_crc    u32, CRC-32C of bytes 0..27
    32      n     body          the state, body_length bytes

Files are written to `<name>.tmp`, fsynced, renamed and the directory fsynced,
so a crash leaves either the old set of snapshots or the new one, never a torn
file under a final name. A file that fails its checks anyway (bit rot, a disk
that lied) is skipped by newest_valid() with a WARNING (ZOOKEEPER-2325).

Snapshots are written and read in pieces (issue 19): SnapshotFile appends the body as it comes
(a local snapshot's encoder, a leader's SNAPCHUNKs) behind a placeholder header, which is
written last, with the length and CRC-32C of what was appended; read_body yields the body in
pieces of READ_CHUNK_BYTES and checks its CRC at the end. No whole snapshot is ever in memory.
A SNAP being received is `snapshot.<zxid>.receiving.tmp` until it is verified and installed.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from edge.files import FILE_MODE, TMP_SUFFIX, ensure_directory, fsync_directory, write_all
from zab.storage.storage_errors import WIPE_ZAB_STATE, SnapshotCorruptError

_log = logging.getLogger("quire.snapshot")

MAGIC = b"QSNP"
VERSION = 1
_HEADER = struct.Struct(">4sIQQII")
HEADER_BYTES = _HEADER.size  # 32
_NAME = re.compile(r"snapshot\.([0-9a-f]{16})")
READ_CHUNK_BYTES = 1 << 20
RECEIVING_SUFFIX = ".receiving" + TMP_SUFFIX  # a SNAP in transfer: removed at start like any *.tmp


def snapshot_name(zxid: int) -> str:
    """The file name of the snapshot at `zxid`; sorts in zxid order."""
    return f"snapshot.{zxid:016x}"


def encode_snapshot_header(zxid: int, state: bytes) -> bytes:
    """The 32-byte header of a snapshot of `state` at `zxid`."""
    return _header(zxid, len(state), crc32c(state))


def _header(zxid: int, body_length: int, body_crc: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, zxid, body_length, body_crc, 0)
    return head[:-4] + struct.pack(">I", crc32c(head[:-4]))


def decode_snapshot(buf: bytes | memoryview, *, source: str = "snapshot") -> tuple[int, bytes]:
    """Check a whole snapshot file's bytes; return (zxid, state).

    Raises SnapshotCorruptError (naming `source`) for any defect.
    """
    zxid, _, body_crc = _check_header(buf, len(buf), source)
    body = bytes(memoryview(buf)[HEADER_BYTES:])
    if crc32c(body) != body_crc:
        raise _corrupt(source, "body checksum mismatch")
    return zxid, body


def _check_header(head: bytes | memoryview, file_size: int, source: str) -> tuple[int, int, int]:
    """(zxid, body_length, body_crc) of a file of `file_size` bytes that starts with `head`."""
    if file_size < HEADER_BYTES or len(head) < HEADER_BYTES:
        raise _corrupt(source, f"{file_size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, zxid, body_length, body_crc, header_crc = _HEADER.unpack_from(head)
    if crc32c(memoryview(head)[: HEADER_BYTES - 4]) != header_crc:
        raise _corrupt(source, "header checksum mismatch")
    if magic != MAGIC or version != VERSION:
        raise _corrupt(source, f"unknown magic {magic!r} / version {version}")
    if body_length != file_size - HEADER_BYTES:
        raise _corrupt(source, f"header says {body_length} body bytes, file has {file_size - HEADER_BYTES}")
    return zxid, body_length, body_crc


def _check_name(path: Path, zxid: int) -> None:
    match = _NAME.fullmatch(Path(path).name)
    if match and int(match.group(1), 16) != zxid:
        raise _corrupt(str(path), f"header zxid {zxid:#x} differs from the file name")


def read_body(path: Path, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """The body of the snapshot file at `path`, in pieces of `chunk_bytes`, read as they are taken;
    SnapshotCorruptError (before the first piece for a bad header, after the last for a bad body
    CRC, e.g. a file changed since it was verified). The file stays open until the end."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the generator's own with below
    except OSError as err:
        raise _corrupt(str(path), f"unreadable: {err}") from err
    with f:
        zxid, _, body_crc = _check_header(f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size, str(path))
        _check_name(path, zxid)
        crc = 0
        while piece := f.read(chunk_bytes):
            crc = crc32c(piece, crc)
            yield piece
        if crc != body_crc:
            raise _corrupt(str(path), "body checksum mismatch")


def verify_snapshot(path: Path) -> int:
    """The zxid of the snapshot file at `path` after checking it whole, read in bounded pieces;
    SnapshotCorruptError for any defect."""
    for _ in read_body(path):
        pass
    return snapshot_zxid(path)


def snapshot_zxid(path: Path) -> int:
    """The zxid in the header of the snapshot file at `path` (the header alone is checked)."""
    try:
        with open(path, "rb") as f:
            head, size = f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size
    except OSError as err:
        raise _corrupt(str(path), f"unreadable: {err}") from err
    zxid = _check_header(head, size, str(path))[0]
    _check_name(path, zxid)
    return zxid


def read_snapshot(path: Path) -> tuple[int, bytes]:
    """Read and verify one snapshot file; return (zxid, state).

    Raises SnapshotCorruptError when the file cannot be read or fails a check,
    including a header zxid that differs from the one in a snapshot.* file name.
    """
    try:
        # The read is bounded by the file's size, never by a length field.
        buf = Path(path).read_bytes()
    except OSError as err:
        raise _corrupt(str(path), f"unreadable: {err}") from err
    zxid, state = decode_snapshot(buf, source=str(path))
    _check_name(path, zxid)
    return zxid, state


def _corrupt(source: str, what: str) -> SnapshotCorruptError:
    return SnapshotCorruptError(
        f"snapshot {source} is invalid ({what}); it will be ignored. If no valid "
        "snapshot and no complete log remain, " + WIPE_ZAB_STATE
    )


class SnapshotFile:
    """One snapshot file written in pieces under a temporary name: `write` the body as it comes,
    then `commit` (fsync, header, rename, directory fsync) or `abort` (the temporary file goes).
    Holds nothing of the body: a running length and CRC-32C."""

    def __init__(self, path: Path, zxid: int, suffix: str = TMP_SUFFIX) -> None:
        if not 0 <= zxid < 1 << 64:
            raise ValueError(f"zxid {zxid} does not fit an unsigned 64-bit field")
        self.path, self.zxid = Path(path), zxid
        self.tmp = self.path.with_name(self.path.name + suffix)
        self.body_length = 0
        self._crc = 0
        self._fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        # A placeholder, replaced at commit: zeros never pass the header check.
        self._append(bytes(HEADER_BYTES))

    def write(self, data: bytes) -> None:
        """Append `data` to the body (page cache only: commit fsyncs once)."""
        self._append(data)
        self._crc = crc32c(data, self._crc)
        self.body_length += len(data)

    def _append(self, data: bytes) -> None:
        assert self._fd is not None, f"{self.tmp} was committed or aborted"
        try:
            write_all(self._fd, data)
        except BaseException:
            self.abort()
            raise

    def commit(self) -> Path:
        """Make the file durable under its final name; return that path."""
        assert self._fd is not None, f"{self.tmp} was committed or aborted"
        try:
            head = _header(self.zxid, self.body_length, self._crc)
            if os.pwrite(self._fd, head, 0) != len(head):
                raise OSError(f"short write of the header of {self.tmp}")
            os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = None
        os.replace(self.tmp, self.path)
        fsync_directory(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (nothing under the final name changes)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.tmp.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class PurgePlan:
    """What a purge deletes: `remove`, the snapshot files older than `oldest_kept`, the oldest of
    the valid ones it keeps (None: no valid snapshot, nothing may go, the log included)."""
    remove: list[Path]
    oldest_kept: int | None


class SnapshotStore:
    """The snapshot files of one node, in `directory` (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        ensure_directory(self.directory)

    def path_for(self, zxid: int) -> Path:
        return self.directory / snapshot_name(zxid)

    def write(self, zxid: int, state: bytes) -> Path:
        """Durably store `state` as the snapshot at `zxid`; return its path."""
        return self.write_chunks(zxid, (state,)).path

    def write_chunks(self, zxid: int, chunks: Iterable[bytes]) -> SnapshotFile:
        """Durably store the state in `chunks` (taken one at a time) as the snapshot at `zxid`;
        return the committed file (its path and body_length)."""
        file = self.begin(zxid)
        try:
            for chunk in chunks:
                file.write(chunk)
        except BaseException:
            file.abort()
            raise
        file.commit()
        return file

    def begin(self, zxid: int, suffix: str = TMP_SUFFIX) -> SnapshotFile:
        """A snapshot file at `zxid` to write in pieces (`suffix`: its temporary name's)."""
        return SnapshotFile(self.path_for(zxid), zxid, suffix)

    def files(self) -> list[tuple[int, Path]]:
        """Every snapshot file by its name, valid or not, oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            match = _NAME.fullmatch(entry.name)
            if match:
                found.append((int(match.group(1), 16), Path(entry.path)))
        return sorted(found)

    def newest_valid_file(self) -> tuple[int, Path] | None:
        """(zxid, path) of the newest snapshot that verifies (read in bounded pieces), or None;
        newer invalid files are skipped with a WARNING, as newest_valid does."""
        for _, path in reversed(self.files()):
            try:
                return verify_snapshot(path), path
            except SnapshotCorruptError as err:
                _log.warning("skipping invalid snapshot: %s", err)
        return None

    def newest_valid(self) -> tuple[int, bytes] | None:
        """(zxid, state) of the newest snapshot that verifies, or None; the state whole, for
        tools and tests (a node recovers with newest_valid_file and read_body).

        Newer invalid files are skipped with a WARNING: a node must recover from
        an older valid snapshot plus its log rather than fail (ZOOKEEPER-2325).
        """
        found = self.newest_valid_file()
        return None if found is None else read_snapshot(found[1])

    def valid_zxids(self) -> list[int]:
        """Zxids of the snapshots that verify, oldest first."""
        return [zxid for zxid, path in self.files() if _is_valid(path)]

    def purge(self, keep: int) -> list[Path]:
        """Keep the newest `keep` valid snapshots; delete what is older. Return removed paths.

        Invalid files newer than the oldest kept one stay for the operator to
        inspect. With no valid snapshot, nothing is removed.
        """
        plan = self.plan_purge(keep)
        self.remove(plan.remove)
        return plan.remove

    def plan_purge(self, keep: int) -> PurgePlan:
        """What purge(keep) would delete, without deleting it: the reading part (each of the newest
        files is verified whole until `keep` valid ones are found), which the node does off its
        log writer's thread; the files older than the oldest of those are not read at all."""
        if keep < 1:
            raise ValueError("keep must be >= 1: purging every snapshot would lose history")
        files = self.files()
        kept: list[int] = []
        for zxid, path in reversed(files):
            if len(kept) == keep:
                break
            if _is_valid(path):
                kept.append(zxid)
        if not kept:
            return PurgePlan([], None)
        return PurgePlan([path for zxid, path in files if zxid < kept[-1]], kept[-1])

    def remove(self, paths: list[Path]) -> None:
        """Delete these snapshot files (gone already is fine) and make that durable."""
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            fsync_directory(self.directory)

    def discard_temporaries(self) -> list[Path]:
        """Remove `*.tmp` files a crash left behind mid-write; return them."""
        leftovers = [p for p in self.directory.glob("snapshot.*" + TMP_SUFFIX) if p.is_file()]
        for path in leftovers:
            path.unlink()
        if leftovers:
            fsync_directory(self.directory)
        return leftovers


def _is_valid(path: Path) -> bool:
    try:
        verify_snapshot(path)
    except SnapshotCorruptError:
        return False
    return True
