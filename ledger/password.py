"""Ledger password records (pure): what the metadata keeps so that open() can refuse a wrong password.

A ledger's metadata is readable by every client of the metastore (readers find
its ensembles there), so what it keeps about the password must not give the
password away. It keeps a salted, slow hash: scrypt (RFC 7914) with a 16-byte
salt drawn for the ledger and N=2^14, r=8, p=1 (about 16 MiB and a few tens of
milliseconds per check: once per create and per open, never per entry), tagged
so the parameters can change later. Before issue 17 it kept an unsalted SHA-256
derivation (bookie.entry.password_key(password, b"check")): a single table of
guesses fitted every ledger. Such records are still accepted when a ledger
written then is opened.
"""

from __future__ import annotations

import hashlib
import hmac

from bookie.entry import password_key

SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
TAG = b"scrypt-1:"  # format 1: scrypt with the parameters above


def password_record(password: bytes, salt: bytes) -> bytes:
    """The record kept in the metadata for `password` (salt: SALT_BYTES random bytes, from the caller)."""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"a password salt is {SALT_BYTES} bytes, got {len(salt)}")
    return TAG + salt + _scrypt(password, salt)


def password_matches(record: bytes, password: bytes) -> bool:
    """Whether `password` is the one `record` was made from (either format)."""
    if record.startswith(TAG) and len(record) == len(TAG) + SALT_BYTES + HASH_BYTES:
        salt = record[len(TAG):len(TAG) + SALT_BYTES]
        return hmac.compare_digest(record[len(TAG) + SALT_BYTES:], _scrypt(password, salt))
    return hmac.compare_digest(record, password_key(password, b"check"))  # written before issue 17


def _scrypt(password: bytes, salt: bytes) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=64 << 20, dklen=HASH_BYTES)
