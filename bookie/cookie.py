"""The bookie cookie: a data directory's identity (pure: codec and checks, no I/O).

A bookie that lost its disk and comes back empty under its old identity would
answer "nothing here" for entries it acknowledged (FAULTS.md, limbo, BP-46).
The cookie prevents it: `<bookie dir>/cookie` is written once, when the
directory is first used, and names the bookie id, a random instance id, the
cluster name and the layout version. The service records the instance id in
the metastore at first registration and passes it back on every start, so a
wiped directory (no cookie) or a swapped one (another id) is refused.

File format (ASCII, LF line ends, at most MAX_COOKIE_BYTES):

    quire-bookie-cookie
    bookie_id=<decimal>
    instance_id=<32 lowercase hex>
    cluster=<name, printable ASCII without "=" or newline; may be empty>
    layout=<decimal>
    crc=<CRC-32C of every byte before this line, 8 lowercase hex>
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from crc32c import crc32c

from bookie.errors import CookieMismatch, StorageError

LAYOUT_VERSION = 1
MAX_COOKIE_BYTES = 1024
_FIRST_LINE = "quire-bookie-cookie"
_PATTERN = re.compile(
    r"quire-bookie-cookie\n"
    r"bookie_id=(0|[1-9][0-9]{0,18})\n"
    r"instance_id=([0-9a-f]{32})\n"
    r"cluster=([\x20-\x3c\x3e-\x7e]{0,200})\n"
    r"layout=(0|[1-9][0-9]{0,8})\n"
)
_CRC_LINE = re.compile(r"crc=([0-9a-f]{8})\n")


class CookieCorrupt(StorageError):
    """The cookie file is unreadable: the directory's identity is unknown."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: the directory's identity is unknown; restore the cookie file from a copy, "
                         "or retire this bookie's identity and start it on an empty directory (docs/operations.md, "
                         "\"Replacing a dead machine\")")


@dataclass(frozen=True, slots=True)
class Cookie:
    bookie_id: int
    instance_id: str
    cluster: str = ""
    layout: int = LAYOUT_VERSION


def encode_cookie(cookie: Cookie) -> bytes:
    """The file's bytes. Raises ValueError for fields the format cannot hold."""
    body = (f"{_FIRST_LINE}\nbookie_id={cookie.bookie_id}\ninstance_id={cookie.instance_id}\n"
            f"cluster={cookie.cluster}\nlayout={cookie.layout}\n").encode()
    if not _PATTERN.fullmatch(body.decode()):
        raise ValueError(f"cookie fields cannot be stored: {cookie!r}")
    return body + f"crc={crc32c(body):08x}\n".encode()


def decode_cookie(data: bytes) -> Cookie:
    """Parse a cookie file; raises CookieCorrupt for anything but a well-formed, checksummed cookie."""
    if len(data) > MAX_COOKIE_BYTES:
        raise CookieCorrupt(f"cookie of {len(data)} bytes is larger than any cookie ({MAX_COOKIE_BYTES})")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise CookieCorrupt("cookie is not ASCII") from None
    match = _PATTERN.match(text)
    crc = _CRC_LINE.fullmatch(text, match.end()) if match else None
    if match is None or crc is None:
        raise CookieCorrupt("cookie does not have the expected lines")
    if int(crc.group(1), 16) != crc32c(data[: match.end()]):
        raise CookieCorrupt("cookie checksum mismatch")
    return Cookie(int(match.group(1)), match.group(2), match.group(3), int(match.group(4)))


def check_cookie(found: Cookie | None, *, bookie_id: int, instance_id: str | None, cluster: str | None,
                 has_data: bool, where: str) -> None:
    """Refuse a directory that is not this bookie's: raises CookieMismatch (or StorageError).

    `found` is the directory's cookie (None: no cookie file); `instance_id` what
    the metastore recorded for this bookie (None: first start); `has_data`
    whether the directory holds journal or entry log files.
    """
    if found is None:
        if instance_id is not None:
            raise CookieMismatch(
                f"{where} has no cookie but bookie {bookie_id} is registered with instance {instance_id}: "
                "the disk was wiped or replaced, and this bookie may have acknowledged entries it no longer "
                "has. Decommission the old identity (re-replicate its ledgers) and start it with a fresh one")
        if has_data:
            raise CookieMismatch(f"{where} holds bookie data but no cookie: its identity is unknown; "
                                 "restore the cookie file or wipe the directory and re-register the bookie")
        return
    if found.layout != LAYOUT_VERSION:
        raise StorageError(f"{where} uses data layout {found.layout}; this version reads layout "
                           f"{LAYOUT_VERSION}: run a matching version")
    if found.bookie_id != bookie_id:
        raise CookieMismatch(f"{where} belongs to bookie {found.bookie_id}, not {bookie_id}: "
                             "the data directories were swapped; point each bookie at its own")
    if instance_id is not None and found.instance_id != instance_id:
        raise CookieMismatch(
            f"{where} holds instance {found.instance_id} of bookie {bookie_id}, but instance {instance_id} is "
            "registered: the directory was replaced by another copy; restore the right one or decommission")
    if cluster is not None and found.cluster != cluster:
        raise CookieMismatch(f"{where} belongs to cluster {found.cluster!r}, not {cluster!r}: point this bookie "
                             "at its own cluster's directory")
