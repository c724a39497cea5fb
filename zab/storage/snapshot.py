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
"""

from __future__ import annotations

import logging
import os
import re
import struct
from pathlib import Path

from crc32c import crc32c

from edge.files import TMP_SUFFIX, ensure_directory, fsync_directory, write_atomically
from zab.storage.storage_errors import SnapshotCorruptError

_log = logging.getLogger("quire.snapshot")

MAGIC = b"QSNP"
VERSION = 1
_HEADER = struct.Struct(">4sIQQII")
HEADER_BYTES = _HEADER.size  # 32
_NAME = re.compile(r"snapshot\.([0-9a-f]{16})")


def snapshot_name(zxid: int) -> str:
    """The file name of the snapshot at `zxid`; sorts in zxid order."""
    return f"snapshot.{zxid:016x}"


def encode_snapshot_header(zxid: int, state: bytes) -> bytes:
    """The 32-byte header of a snapshot of `state` at `zxid`."""
    head = _HEADER.pack(MAGIC, VERSION, zxid, len(state), crc32c(state), 0)
    return head[:-4] + struct.pack(">I", crc32c(head[:-4]))


def decode_snapshot(buf: bytes | memoryview, *, source: str = "snapshot") -> tuple[int, bytes]:
    """Check a whole snapshot file's bytes; return (zxid, state).

    Raises SnapshotCorruptError (naming `source`) for any defect.
    """
    if len(buf) < HEADER_BYTES:
        raise _corrupt(source, f"{len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, zxid, body_length, body_crc, header_crc = _HEADER.unpack_from(buf)
    if crc32c(memoryview(buf)[: HEADER_BYTES - 4]) != header_crc:
        raise _corrupt(source, "header checksum mismatch")
    if magic != MAGIC or version != VERSION:
        raise _corrupt(source, f"unknown magic {magic!r} / version {version}")
    if body_length != len(buf) - HEADER_BYTES:
        raise _corrupt(source, f"header says {body_length} body bytes, file has {len(buf) - HEADER_BYTES}")
    body = bytes(memoryview(buf)[HEADER_BYTES:])
    if crc32c(body) != body_crc:
        raise _corrupt(source, "body checksum mismatch")
    return zxid, body


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
    match = _NAME.fullmatch(Path(path).name)
    if match and int(match.group(1), 16) != zxid:
        raise _corrupt(str(path), f"header zxid {zxid:#x} differs from the file name")
    return zxid, state


def _corrupt(source: str, what: str) -> SnapshotCorruptError:
    return SnapshotCorruptError(
        f"snapshot {source} is invalid ({what}); it will be ignored. If no valid "
        "snapshot and no complete log remain, wipe this node's data directory and "
        "let it resync from the ensemble"
    )


class SnapshotStore:
    """The snapshot files of one node, in `directory` (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        ensure_directory(self.directory)

    def path_for(self, zxid: int) -> Path:
        return self.directory / snapshot_name(zxid)

    def write(self, zxid: int, state: bytes) -> Path:
        """Durably store `state` as the snapshot at `zxid`; return its path."""
        if not 0 <= zxid < 1 << 64:
            raise ValueError(f"zxid {zxid} does not fit an unsigned 64-bit field")
        path = self.path_for(zxid)
        write_atomically(path, [encode_snapshot_header(zxid, state), state])
        return path

    def files(self) -> list[tuple[int, Path]]:
        """Every snapshot file by its name, valid or not, oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            match = _NAME.fullmatch(entry.name)
            if match:
                found.append((int(match.group(1), 16), Path(entry.path)))
        return sorted(found)

    def newest_valid(self) -> tuple[int, bytes] | None:
        """(zxid, state) of the newest snapshot that verifies, or None.

        Newer invalid files are skipped with a WARNING: a node must recover from
        an older valid snapshot plus its log rather than fail (ZOOKEEPER-2325).
        """
        for _, path in reversed(self.files()):
            try:
                return read_snapshot(path)
            except SnapshotCorruptError as err:
                _log.warning("skipping invalid snapshot: %s", err)
        return None

    def valid_zxids(self) -> list[int]:
        """Zxids of the snapshots that verify, oldest first."""
        return [zxid for zxid, path in self.files() if _is_valid(path)]

    def purge(self, keep: int) -> list[Path]:
        """Keep the newest `keep` valid snapshots; delete what is older. Return removed paths.

        Invalid files newer than the oldest kept one stay for the operator to
        inspect. With no valid snapshot, nothing is removed.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1: purging every snapshot would lose history")
        files = self.files()
        valid = [zxid for zxid, path in files if _is_valid(path)]
        if not valid:
            return []
        oldest_kept = valid[-keep:][0]
        removed = [path for zxid, path in files if zxid < oldest_kept]
        for path in removed:
            path.unlink()
        if removed:
            fsync_directory(self.directory)
        return removed

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
        read_snapshot(path)
    except SnapshotCorruptError:
        return False
    return True
