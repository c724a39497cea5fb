"""ACLs, as ZooKeeper defines them (pure: no I/O).

An ACL entry grants `perms` (bits READ 1, WRITE 2, CREATE 4, DELETE 8, ADMIN 16)
to an `Id` (scheme, id). Schemes:

- world: the only id is "anyone"; it matches every client.
- auth: only in a create/setACL request; it stands for every authenticated id of
  the requesting session and is expanded into them when the request is prepared
  (fixup_acl). It never appears in a stored ACL.
- digest: id "user:base64(sha1(user:password))" (generate_digest, as
  DigestAuthenticationProvider.generateDigest); a session gets it by
  `addAuth("digest", b"user:password")` (digest_auth_id).
- ip: id "address" or "address/prefix-bits", IPv4 or IPv6; it matches the client's
  address (every connection carries its address as an ("ip", host) id, which is
  not an "authenticated" id, so "auth" never expands to it).
- x509: id the subject distinguished name of a client certificate, in RFC 2253 form
  ("CN=alice,O=Quire", as Java's X500Principal.getName() and cryptography's
  Name.rfc4514_string() write it); the TLS edge gives a connection that id when its
  certificate checks out (X509AuthenticationProvider). It matches exactly.
- sasl: id a SASL username; a connection gets ("sasl", username) when its DIGEST-MD5
  exchange completes (metastore/edge/sasl_edge.py). It matches exactly, and the user
  "super" matches every sasl id (SASLAuthenticationProvider).

`check` follows ZooKeeperServer.checkACL: an empty ACL allows everything, a
"super" id allows everything, and otherwise some entry must grant the permission
to world:anyone or to an id of the client with a matching scheme.

The super id. A session holds SUPER_ID only when the node serving its connection
gave it: `digest_auth_ids` adds it when addAuth("digest", "user:password") digests
to the cluster's `super_digest` (DigestAuthenticationProvider's superDigest). It
bypasses every check on that node; on the leader it counts only where the envelope
edge accepts the origin node's word for it (metastore/wire/envelope.py, the service):
an identity "super" that arrives from the network unvouched for must be dropped
there, never passed to `check`.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from metastore.errors import InvalidACL, NoAuth


class Perm(enum.IntFlag):
    READ = 1
    WRITE = 2
    CREATE = 4
    DELETE = 8
    ADMIN = 16
    ALL = 31


@dataclass(slots=True, unsafe_hash=True)
class Id:
    scheme: str
    id: str


@dataclass(slots=True, unsafe_hash=True)
class ACL:
    perms: int
    id: Id


ANYONE_ID = Id("world", "anyone")
AUTH_IDS = Id("auth", "")
SUPER_SCHEME = "super"
SUPER_ID = Id(SUPER_SCHEME, "")  # what DigestAuthenticationProvider adds for the superDigest
OPEN_ACL_UNSAFE: tuple[ACL, ...] = (ACL(Perm.ALL, ANYONE_ID),)
CREATOR_ALL_ACL: tuple[ACL, ...] = (ACL(Perm.ALL, AUTH_IDS),)
READ_ACL_UNSAFE: tuple[ACL, ...] = (ACL(Perm.READ, ANYONE_ID),)

# Schemes whose ids come from a successful authentication (isAuthenticated() in
# ZooKeeper's providers): "auth" expands only to these.
AUTHENTICATED_SCHEMES = frozenset(("digest", "sasl", "x509"))


_LEN = struct.Struct(">I")


def _text(value: str) -> bytes:
    raw = value.encode()
    return _LEN.pack(len(raw)) + raw


def encode_acl(acl: Sequence[ACL]) -> bytes:
    """Canonical bytes of an ACL list: u32 count, then per entry i32 perms and the
    scheme and id as u32-length-prefixed UTF-8 (the layout of txns and snapshots)."""
    parts = [_LEN.pack(len(acl))]
    for entry in acl:
        parts += [struct.pack(">i", entry.perms), _text(entry.id.scheme), _text(entry.id.id)]
    return b"".join(parts)


# -- digest --------------------------------------------------------------------

def generate_digest(id_password: str) -> str:
    """"user:password" -> "user:" + base64(sha1(b"user:password")), as ZooKeeper computes it."""
    user = id_password.split(":", 1)[0]
    # Java's getBytes(UTF_8) turns an unpaired surrogate into "?", as "replace" does.
    sha1 = hashlib.sha1(id_password.encode("utf-8", "replace")).digest()
    return user + ":" + base64.b64encode(sha1).decode("ascii")


def digest_auth_id(auth_data: bytes) -> Id:
    """The id that addAuth("digest", auth_data) gives a session."""
    return Id("digest", generate_digest(auth_data.decode("utf-8", "replace")))


def digest_auth_ids(auth_data: bytes, super_digest: str | None) -> list[Id]:
    """The ids addAuth("digest", auth_data) gives a session: its digest id, preceded by
    SUPER_ID when the digest is the configured `super_digest` (as ZooKeeper's provider)."""
    ident = digest_auth_id(auth_data)
    if super_digest is not None and hmac.compare_digest(ident.id.encode(), super_digest.encode()):
        return [SUPER_ID, ident]
    return [ident]


_SUPER_DIGEST_HELP = ('give "user:" + base64(sha1("user:password")), the output of '
                      'metastore.core.acl.generate_digest("user:password") (ZooKeeper\'s '
                      'DigestAuthenticationProvider.superDigest)')


def parse_super_digest(text: str) -> str:
    """Validate a configured superDigest ("user:base64-of-20-bytes"); ValueError says how to make one."""
    user, colon, encoded = text.partition(":")
    if not colon or not user or ":" in encoded:
        raise ValueError(f"super_digest {text!r} is not user:digest; {_SUPER_DIGEST_HELP}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"super_digest {text!r}: the digest is not base64; {_SUPER_DIGEST_HELP}") from None
    if len(raw) != hashlib.sha1().digest_size:
        raise ValueError(f"super_digest {text!r}: the digest is {len(raw)} bytes, not a SHA-1's 20; "
                         f"{_SUPER_DIGEST_HELP}")
    return text


def _java_split(text: str, sep: str) -> list[str]:
    """Java's String.split(sep) with no limit: trailing empty strings are dropped."""
    if sep not in text:
        return [text]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _digest_id_valid(ident: str) -> bool:
    return len(_java_split(ident, ":")) == 2


# -- ip ------------------------------------------------------------------------

_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_HEX = re.compile(r"[+-]?[0-9a-fA-F]+")


def _v4_bytes(addr: str) -> bytes | None:
    parts = addr.split(".")
    if len(parts) != 4:
        return None
    out = bytearray()
    for part in parts:
        if not _JAVA_INT.fullmatch(part):
            return None
        value = int(part)
        if not 0 <= value <= 255:
            return None
        out.append(value)
    return bytes(out)


def _v6_segments(text: str) -> list[str]:
    return text.split(":") if text else []


def _v6_bytes(addr: str) -> bytes | None:
    halves = addr.split("::")
    if len(halves) == 1:
        head, tail = addr.split(":"), []
        if len(head) != 8:
            return None
    elif len(halves) == 2:
        head, tail = _v6_segments(halves[0]), _v6_segments(halves[1])
        if len(head) + len(tail) >= 8:
            return None
    else:
        return None
    values = []
    for segment in head + tail:
        if not segment or len(segment) > 4 or not _JAVA_HEX.fullmatch(segment):
            return None
        values.append(int(segment, 16))
    words = values[:len(head)] + [0] * (8 - len(values)) + values[len(head):]
    return b"".join(bytes(((w >> 8) & 0xFF, w & 0xFF)) for w in words)


def _addr_bytes(addr: str) -> bytes | None:
    if ":" in addr:
        return _v6_bytes(addr)
    if "." in addr:
        return _v4_bytes(addr)
    return None


def _prefix_bits(addr: bytes, spec: str | None) -> int | None:
    if spec is None:
        return len(addr) * 8
    if not _JAVA_INT.fullmatch(spec):
        return None
    bits = int(spec)
    return bits if 0 <= bits <= len(addr) * 8 else None


def _masked(addr: bytes, bits: int) -> bytes:
    value = int.from_bytes(addr, "big")
    width = len(addr) * 8
    mask = ((1 << bits) - 1) << (width - bits) if bits else 0
    return (value & mask).to_bytes(len(addr), "big")


def _ip_parse(expr: str) -> tuple[bytes, int] | None:
    address, slash, prefix = expr.partition("/")
    raw = _addr_bytes(address)
    if raw is None:
        return None
    bits = _prefix_bits(raw, prefix if slash else None)
    return None if bits is None else (raw, bits)


def ip_matches(client_address: str, acl_expr: str) -> bool:
    """Whether a client at `client_address` matches an ip ACL id ("10.0.0.0/8", "::1", ...)."""
    parsed = _ip_parse(acl_expr)
    client = _addr_bytes(client_address)
    if parsed is None or client is None or len(client) != len(parsed[0]):
        return False
    acl_addr, bits = parsed
    return _masked(client, bits) == _masked(acl_addr, bits)


# -- x509 ----------------------------------------------------------------------

# RFC 4514 (and the leniencies of Java's X500Principal that X509AuthenticationProvider.isValid
# relies on: ";" between RDNs, spaces around separators, "OID." before a dotted type).
_PAIR = r'\\(?:[,=+<>#;\\" ]|[0-9A-Fa-f]{2})'
_CHAR = r'[^,+;<>"\\\s]'
# Possessive and atomic throughout: ids come from clients, so matching must stay linear
# (a backtracking pattern here would let one setACL stall the leader).
_AVA = (r'(?>\s*+(?:[A-Za-z][A-Za-z0-9-]*+|(?:OID\.|oid\.)?[0-9]++(?:\.[0-9]++)*+)\s*+=\s*+'
        r'(?:"(?:[^"\\]|\\.)*+"|#(?:[0-9A-Fa-f]{2})++|(?:(?!#)' + _CHAR + '|' + _PAIR + ')(?:' + _CHAR + '|' + _PAIR
        + r'|\s++(?=' + _CHAR + '|' + _PAIR + r'))*+|)\s*+)')
_DN = re.compile(f"(?:{_AVA}(?:[,;+]{_AVA})*+)?")


def _x509_id_valid(ident: str) -> bool:
    return _DN.fullmatch(ident) is not None


# -- sasl ----------------------------------------------------------------------

# SASLAuthenticationProvider.isValid: a Kerberos name, "user", "user/host@REALM" or
# "user@REALM"; only a name with "@" must have that shape.
_KERBEROS_NAME = re.compile(r"[^/@]*(?:/[^/@]*)?@[^/@]*")


def _sasl_id_valid(ident: str) -> bool:
    return "@" not in ident or _KERBEROS_NAME.fullmatch(ident) is not None


# -- validation and checks -----------------------------------------------------

def is_valid_id(ident: Id) -> bool:
    """Whether a stored ACL may name `ident` (a provider exists and accepts the id)."""
    if ident.scheme == "world":
        return ident.id == "anyone"
    if ident.scheme == "digest":
        return _digest_id_valid(ident.id)
    if ident.scheme == "ip":
        return _ip_parse(ident.id) is not None
    if ident.scheme == "x509":
        return _x509_id_valid(ident.id)
    if ident.scheme == "sasl":
        return _sasl_id_valid(ident.id)
    return False


def fixup_acl(path: str, acl: Sequence[ACL], auth_ids: Sequence[Id]) -> tuple[ACL, ...]:
    """The ACL to store for a create or setACL request (PrepRequestProcessor.fixupACL).

    Duplicates are dropped (first occurrence kept); "auth" entries expand to the
    session's authenticated ids; an empty list, an unknown scheme, an invalid id,
    or "auth" without any authenticated id is InvalidACL.
    """
    unique = list(dict.fromkeys(acl))  # first occurrences, in linear time (a list scan was quadratic)
    if not unique:
        raise InvalidACL(path, "empty ACL")
    out: list[ACL] = []
    for entry in unique:
        if entry.id.scheme == "auth":
            expanded = [ACL(entry.perms, ident) for ident in auth_ids if ident.scheme in AUTHENTICATED_SCHEMES]
            if not expanded:
                raise InvalidACL(path, "auth scheme without an authenticated id")
            out.extend(expanded)
        elif is_valid_id(entry.id):
            out.append(entry)
        else:
            raise InvalidACL(path, f"invalid id {entry.id.scheme}:{entry.id.id}")
    return tuple(out)


def validate_acl(path: str, acl: Sequence[ACL]) -> None:
    """InvalidACL unless `acl` could be stored as is (non-empty, known schemes, valid ids, no "auth")."""
    if not acl:
        raise InvalidACL(path, "empty ACL")
    for entry in acl:
        if not is_valid_id(entry.id):
            raise InvalidACL(path, f"invalid id {entry.id.scheme}:{entry.id.id}")


def _id_matches(acl_id: Id, client_id: Id) -> bool:
    if client_id.scheme != acl_id.scheme:
        return False
    if acl_id.scheme in ("digest", "x509"):
        return client_id.id == acl_id.id
    if acl_id.scheme == "sasl":
        # SASLAuthenticationProvider.matches: the user "super" passes every sasl entry.
        return client_id.id in (acl_id.id, "super")
    if acl_id.scheme == "ip":
        return ip_matches(client_id.id, acl_id.id)
    return False


def check(acl: Iterable[ACL], perm: int, auth_ids: Sequence[Id]) -> bool:
    """Whether a client holding `auth_ids` has permission `perm` on a node with `acl`."""
    entries = tuple(acl)
    if not entries:
        return True
    if any(ident.scheme == SUPER_SCHEME for ident in auth_ids):
        return True
    for entry in entries:
        if not entry.perms & perm:
            continue
        if entry.id == ANYONE_ID:
            return True
        if any(_id_matches(entry.id, ident) for ident in auth_ids):
            return True
    return False


def require(acl: Iterable[ACL], perm: int, auth_ids: Sequence[Id], path: str | None = None) -> None:
    """NoAuth unless `check` allows it."""
    if not check(acl, perm, auth_ids):
        raise NoAuth(path, f"{Perm(perm & Perm.ALL)!r} denied")


def obfuscated(acl: Iterable[ACL]) -> tuple[ACL, ...]:
    """`acl` as getACL shows it to a client without ADMIN: each digest id's hash becomes
    "x" ("alice:x"), as FinalRequestProcessor does since ZooKeeper's CVE-2019-0201 fix, so
    a reader cannot take the hashes away and guess the passwords offline."""
    return tuple(ACL(e.perms, Id(e.id.scheme, _DIGEST_SECRET.sub(":x", e.id.id))) if e.id.scheme == "digest" else e
                 for e in acl)


_DIGEST_SECRET = re.compile(r":.*")  # Java's replaceAll(":.*", ":x"): "." stops at a line end there too
