"""acceptedEpoch and currentEpoch: the two epochs Zab persists outside the log.

Zab (paper section 4; ZooKeeper's QuorumPeer) keeps them in two files of the
data directory, written separately: acceptedEpoch when a follower accepts a
NEWEPOCH / LEADERINFO (DISCOVERY), currentEpoch when it acknowledges NEWLEADER
(SYNCHRONIZATION). Since acceptedEpoch is always written first,
currentEpoch <= acceptedEpoch holds on disk and is checked on read.

File content (see docs/formats.md, "Epoch files"): ASCII, one line

    <epoch in decimal, no leading zeros> SP <CRC-32C of those digits, 8 lowercase hex> LF

e.g. b"5 a1b2c3d4\\n". Writes go through `<name>.tmp` + fsync + rename + directory
fsync, so a crash leaves the old or the new value (ZOOKEEPER-2307/2354/4269). A
leftover `<name>.tmp` is ignored on read and overwritten by the next write, so
a crash at any point never stops the node from restarting.
"""

from __future__ import annotations

import re
from pathlib import Path

from crc32c import crc32c

from zab.core import zxid as zxids
from edge.files import ensure_directory, write_atomically
from zab.storage.storage_errors import WIPE_ZAB_STATE, EpochFileError

ACCEPTED_EPOCH = "acceptedEpoch"
CURRENT_EPOCH = "currentEpoch"
EPOCH_FILE_NAMES = (ACCEPTED_EPOCH, CURRENT_EPOCH)
# Longest valid content: 10 digits (2**32 - 1), space, 8 hex digits, newline.
_MAX_CONTENT_BYTES = 20
_CONTENT = re.compile(rb"(0|[1-9][0-9]{0,9}) ([0-9a-f]{8})\n")


def encode_epoch(value: int) -> bytes:
    """The content of an epoch file holding `value`."""
    if not 0 <= value <= zxids.EPOCH_MAX:
        raise ValueError(f"epoch {value} out of range 0..{zxids.EPOCH_MAX}")
    digits = str(value).encode("ascii")
    return digits + b" " + f"{crc32c(digits):08x}".encode("ascii") + b"\n"


def parse_epoch(content: bytes, *, source: str = "epoch file") -> int:
    """The epoch in an epoch file's `content`; EpochFileError (naming `source`) if invalid."""
    match = _CONTENT.fullmatch(content)
    if match is None:
        raise _corrupt(source, "content is not '<decimal epoch> <crc32c hex>\\n'")
    digits, crc = match.groups()
    if crc32c(digits) != int(crc, 16):
        raise _corrupt(source, "checksum mismatch")
    value = int(digits)
    if value > zxids.EPOCH_MAX:
        raise _corrupt(source, f"epoch {value} exceeds {zxids.EPOCH_MAX}")
    return value


def write_epoch(data_dir: Path, name: str, value: int) -> None:
    """Durably set epoch file `name` (ACCEPTED_EPOCH or CURRENT_EPOCH) to `value`.

    When this returns the new value survives a crash; the caller updates its
    in-memory epoch only afterwards (disk before memory).
    """
    _check_name(name)
    content = encode_epoch(value)
    ensure_directory(Path(data_dir))
    write_atomically(Path(data_dir) / name, [content])


def read_epoch(data_dir: Path, name: str) -> int:
    """The value of epoch file `name`, 0 when the file does not exist."""
    _check_name(name)
    path = Path(data_dir) / name
    try:
        with open(path, "rb") as file:
            # One byte more than the longest valid content is enough to reject it.
            content = file.read(_MAX_CONTENT_BYTES + 1)
    except FileNotFoundError:
        return 0
    except OSError as err:
        raise _corrupt(str(path), f"unreadable: {err}") from err
    return parse_epoch(content, source=str(path))


def read_epochs(data_dir: Path) -> tuple[int, int]:
    """(acceptedEpoch, currentEpoch); (0, 0) on a new node.

    Raises EpochFileError when a file is corrupt or currentEpoch > acceptedEpoch.
    """
    accepted = read_epoch(data_dir, ACCEPTED_EPOCH)
    current = read_epoch(data_dir, CURRENT_EPOCH)
    if current > accepted:
        raise EpochFileError(
            f"{Path(data_dir) / CURRENT_EPOCH} holds {current}, more than {ACCEPTED_EPOCH} "
            f"{accepted}: Zab never writes that, so the data directory was modified or "
            "damaged; " + WIPE_ZAB_STATE
        )
    return accepted, current


def _check_name(name: str) -> None:
    if name not in EPOCH_FILE_NAMES:
        raise ValueError(f"epoch file name {name!r} is not one of {EPOCH_FILE_NAMES}")


def _corrupt(source: str, what: str) -> EpochFileError:
    return EpochFileError(
        f"epoch file {source} is invalid ({what}); the node cannot know which epochs it "
        "promised: " + WIPE_ZAB_STATE
    )
