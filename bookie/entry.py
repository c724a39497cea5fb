"""The packaged ledger entry: what a writer sends, a bookie stores and a reader checks.

Seed 001: "The entry written contains the ledger id, the entry id, the last add
confirmed and the payload." Seed 000 adds the running ledger length and the
message authentication code. Layout (big-endian), documented in docs/bookie.md:

    ledger_id   u64
    entry_id    u64
    lac         i64   last add confirmed when the entry was written, -1 for none
    length      u64   ledger length in bytes including this entry's payload
    digest_type u8    1 = CRC32C, 2 = HMAC-SHA256
    digest      4 or 32 bytes, over the 33 header bytes above and the payload
    payload     the application's bytes

The digest is end to end: the writer computes it, bookies store the packaged
bytes as they came, a reader verifies them. HMAC-SHA256 is keyed by a key
derived from the ledger's password, so a reader without the password cannot
forge or even check such entries. The bookie itself only parses the header
(it needs the ids and the LAC) and never the digest.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

import crc32c

HEADER = struct.Struct(">QQqQB")
HEADER_BYTES = HEADER.size  # 33
NO_ENTRY = -1  # "no entry yet": the LAC of an empty ledger, the last entry of an empty closed ledger


class DigestType(enum.IntEnum):
    CRC32C = 1
    HMAC_SHA256 = 2

    @property
    def size(self) -> int:
        return 4 if self is DigestType.CRC32C else 32


class EntryFormatError(ValueError):
    """The bytes are not a packaged entry (truncated, unknown digest type, ...): the sender is at fault."""


class DigestMismatch(Exception):
    """The entry's digest does not match its bytes: this replica is corrupt (or the password is wrong).
    Read the entry from another bookie of its write quorum."""

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        super().__init__(f"ledger {ledger_id} entry {entry_id}: digest mismatch; the replica is corrupt or "
                         "the password is wrong; read it from another bookie")
        self.ledger_id = ledger_id
        self.entry_id = entry_id


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    digest_type: DigestType


@dataclass(frozen=True, slots=True)
class Entry:
    """A verified entry, as a reader hands it to the application."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


def password_key(password: bytes, purpose: bytes) -> bytes:
    """A 32-byte key derived from a ledger password for one purpose (b"mac", b"master", b"check")."""
    return hashlib.sha256(b"quire-ledger-" + purpose + b"\x00" + password).digest()


def master_key(password: bytes) -> bytes:
    """What adds and fences carry: a bookie binds a ledger to the first master key it sees."""
    return password_key(password, b"master")


class Digester:
    """Computes and checks the digests of one ledger's entries."""

    def __init__(self, digest_type: DigestType, password: bytes) -> None:
        self.digest_type = DigestType(digest_type)
        self._mac_key = password_key(password, b"mac")

    def _digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        if self.digest_type is DigestType.CRC32C:
            return struct.pack(">I", crc32c.crc32c(payload, crc32c.crc32c(header)))
        mac = hmac.new(self._mac_key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def package(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        header = HEADER.pack(ledger_id, entry_id, lac, length, self.digest_type)
        return b"".join((header, self._digest(header, payload), payload))

    def verify(self, data: bytes) -> Entry:
        """Check a packaged entry; raises EntryFormatError or DigestMismatch."""
        header = parse_header(data)
        if header.digest_type is not self.digest_type:
            raise DigestMismatch(header.ledger_id, header.entry_id)
        end = HEADER_BYTES + self.digest_type.size
        view = memoryview(data)
        if not hmac.compare_digest(self._digest(bytes(view[:HEADER_BYTES]), view[end:]), bytes(view[HEADER_BYTES:end])):
            raise DigestMismatch(header.ledger_id, header.entry_id)
        return Entry(header.ledger_id, header.entry_id, header.lac, header.length, bytes(view[end:]))


def parse_header(data: bytes | memoryview) -> EntryHeader:
    """The header of a packaged entry, without checking the digest (what a bookie needs)."""
    if len(data) < HEADER_BYTES:
        raise EntryFormatError(f"packaged entry of {len(data)} bytes is shorter than its {HEADER_BYTES}-byte header")
    ledger_id, entry_id, lac, length, kind = HEADER.unpack_from(data)
    try:
        digest_type = DigestType(kind)
    except ValueError:
        raise EntryFormatError(f"unknown digest type {kind}") from None
    if len(data) < HEADER_BYTES + digest_type.size:
        raise EntryFormatError(f"packaged entry of {len(data)} bytes is shorter than its header and digest")
    if entry_id > 2**63 - 1 or ledger_id > 2**63 - 1 or lac < NO_ENTRY or lac >= entry_id:
        raise EntryFormatError(f"ledger {ledger_id} entry {entry_id}: impossible ids or LAC {lac}")
    return EntryHeader(ledger_id, entry_id, lac, length, digest_type)


def crc32c_digest_ok(data: bytes) -> bool | None:
    """For verifiers without the password: True/False for CRC32C entries, None for HMAC ones (not checkable)."""
    header = parse_header(data)
    if header.digest_type is not DigestType.CRC32C:
        return None
    try:
        Digester(DigestType.CRC32C, b"").verify(data)
    except DigestMismatch:
        return False
    return True
