"""SASL DIGEST-MD5 (RFC 2831), the server side, as ZooKeeper serves it on its client port (pure).

ZooKeeper runs Java's DigestMD5Server with the server name and realm "zk-sasl-md5" and the
protocol "zookeeper" (SecurityUtils.createSaslServer), users from the JAAS file's `Server`
section (SaslServerCallbackHandler reads `user_<name>="<password>"` options of
DigestLoginModule). Clients (kazoo's sasl_options through pure-sasl, Java clients such as
zkCli.sh with a JAAS `Client` section) run the exchange of RFC 2831 section 2.1:

1. the client sends an empty token; the server answers a digest-challenge (realm, nonce,
   qop, charset, algorithm);
2. the client sends a digest-response (username, nonce, cnonce, nc, digest-uri, response);
   the server checks it and answers `rspauth=...` (section 2.1.3), which proves to the
   client that the server knows the password too. The exchange is then complete, and the
   connection holds the id ("sasl", username) (ZooKeeper's authorization id is the
   authentication id's short name; a requested authzid enters the digest but not the id).

Only qop "auth" (authentication, no integrity or confidentiality layer: ZooKeeper offers
no other by default, and TLS is what protects the bytes here). Anything a client sends
that does not follow this exchange ends it with `SaslFailure`, and the exchange stays
failed. No I/O here: the caller supplies the nonce (`make_nonce` takes a random source).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping

REALM = "zk-sasl-md5"  # ZooKeeper's server name and realm for DIGEST-MD5 (SecurityUtils)
SERVICE = "zookeeper"  # the protocol part of the service principal
DIGEST_URI = f"{SERVICE}/{REALM}"
MAX_RESPONSE_BYTES = 4096  # Java's DigestMD5Server refuses a longer digest-response (RFC 2831 2.1.2)
NONCE_BYTES = 24  # random bytes behind a nonce (base64: 32 characters)
SASL_SCHEME = "sasl"  # the ACL scheme an authenticated connection gets


class SaslFailure(Exception):
    """The client's token ends the exchange: malformed, out of turn, or wrong credentials.
    ZooKeeper answers AUTHFAILED and closes the connection."""


class _State(enum.Enum):
    CHALLENGE_DUE = "challenge due"  # waiting for the client's empty initial token
    RESPONSE_DUE = "response due"  # challenge sent, waiting for the digest-response
    COMPLETE = "complete"
    FAILED = "failed"


def make_nonce(random_bytes: Callable[[int], bytes]) -> str:
    """A fresh nonce from `random_bytes(n)` (e.g. secrets.token_bytes): base64, no quotes or
    backslashes, so it needs no escaping inside the challenge's quoted string."""
    return base64.b64encode(random_bytes(NONCE_BYTES)).decode("ascii")


class DigestMD5Server:
    """One DIGEST-MD5 exchange of one connection: `evaluate` each client token in turn.

    `users` maps a username to its password. `realm` and `digest_uri` default to
    ZooKeeper's; RFC 2831's examples use others."""

    def __init__(self, users: Mapping[str, str], nonce: str, *, realm: str = REALM,
                 digest_uri: str = DIGEST_URI) -> None:
        self._users = users
        self.nonce = nonce
        self.realm = realm
        self.digest_uri = digest_uri
        self._state = _State.CHALLENGE_DUE
        self.user: str | None = None  # the authenticated username once complete

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    def evaluate(self, token: bytes) -> bytes:
        """The server's answer to the client's next token; SaslFailure ends the exchange."""
        state, self._state = self._state, _State.FAILED  # stays failed unless the step succeeds
        if state is _State.CHALLENGE_DUE:
            if token:
                raise SaslFailure("DIGEST-MD5 has no initial response: the first token must be empty")
            self._state = _State.RESPONSE_DUE
            return self.challenge()
        if state is _State.RESPONSE_DUE:
            user, rspauth = self._check_response(token)
            self.user, self._state = user, _State.COMPLETE
            return b"rspauth=" + rspauth.encode("ascii")
        raise SaslFailure(f"no token is expected once the exchange is {state.value}")

    def challenge(self) -> bytes:
        """The digest-challenge (RFC 2831 2.1.1), as Java's DigestMD5Server words it."""
        return (f'realm="{_quote(self.realm)}",nonce="{self.nonce}",qop="auth",charset=utf-8,'
                f"algorithm=md5-sess").encode("utf-8")

    def _check_response(self, token: bytes) -> tuple[str, str]:
        if len(token) > MAX_RESPONSE_BYTES:
            raise SaslFailure(f"digest-response of {len(token)} bytes exceeds {MAX_RESPONSE_BYTES}")
        fields = parse_directives(token)
        utf8 = _charset_is_utf8(fields)
        for key in ("username", "nonce", "cnonce", "nc", "digest-uri", "response"):
            if key not in fields:
                raise SaslFailure(f"digest-response lacks the required directive {key!r}")
        _check_negotiation(fields, self.nonce, self.realm, self.digest_uri)
        username = _text(fields["username"], utf8)
        realm = _text(fields.get("realm", ""), utf8)
        password = self._users.get(username)
        if password is None:
            raise SaslFailure(f"unknown user {username!r}")
        ha1 = _ha1(username, realm, password, fields, utf8)
        expected = _response_value(ha1, fields, b"AUTHENTICATE:" + _raw(fields["digest-uri"]))
        if not hmac.compare_digest(expected, fields["response"].lower()):
            raise SaslFailure(f"wrong password for user {username!r}")
        return username, _response_value(ha1, fields, b":" + _raw(fields["digest-uri"]))


def digest_response(username: str, password: str, challenge: bytes, cnonce: str, *,
                    digest_uri: str = DIGEST_URI, authzid: str | None = None) -> bytes:
    """The client's digest-response to `challenge` (RFC 2831 2.1.2, qop auth, charset
    utf-8), the way Java's DigestMD5Client words it. For tests and our own tools: the
    server side never calls it."""
    offered = parse_directives(challenge)
    fields = {"charset": "utf-8", "username": username, "realm": offered.get("realm", ""),
              "nonce": offered["nonce"], "nc": "00000001", "cnonce": cnonce, "digest-uri": digest_uri,
              "qop": "auth"}
    if authzid is not None:
        fields["authzid"] = authzid
    wire = {k: v.encode("utf-8").decode("latin-1") for k, v in fields.items()}  # as the bytes will read
    ha1 = _ha1(username, fields["realm"], password, wire, True)
    wire["response"] = _response_value(ha1, wire, b"AUTHENTICATE:" + _raw(wire["digest-uri"]))
    quoted = ("username", "realm", "nonce", "cnonce", "digest-uri", "authzid")
    return ",".join(f'{k}="{_quote(v)}"' if k in quoted else f"{k}={v}" for k, v in wire.items()).encode("latin-1")


def check_rspauth(username: str, password: str, challenge: bytes, response: bytes, rspauth: bytes) -> bool:
    """Whether the server's final `rspauth=...` proves it knows the password (the client's check)."""
    sent = parse_directives(response)
    ha1 = _ha1(username, _text(sent.get("realm", ""), True), password, sent, True)
    got = parse_directives(rspauth).get("rspauth", "")
    return hmac.compare_digest(_response_value(ha1, sent, b":" + _raw(sent["digest-uri"])).encode("ascii"),
                               _raw(got.lower()))


# -- the digest (RFC 2831 2.1.2.1) ---------------------------------------------------------

def _ha1(username: str, realm: str, password: str, fields: Mapping[str, str], utf8: bool) -> str:
    secret = hashlib.md5(b":".join((_credential(username, utf8), _credential(realm, utf8),
                                    _credential(password, utf8)))).digest()
    a1 = secret + b":" + _raw(fields["nonce"]) + b":" + _raw(fields["cnonce"])
    if "authzid" in fields:
        a1 += b":" + _raw(fields["authzid"])
    return hashlib.md5(a1).hexdigest()


def _response_value(ha1: str, fields: Mapping[str, str], a2: bytes) -> str:
    kd = b":".join((ha1.encode("ascii"), _raw(fields["nonce"]), _raw(fields["nc"]), _raw(fields["cnonce"]),
                    _raw(fields.get("qop", "auth")), hashlib.md5(a2).hexdigest().encode("ascii")))
    return hashlib.md5(kd).hexdigest()


def _credential(text: str, utf8: bool) -> bytes:
    """A username, realm or password as it is hashed: ISO 8859-1 when every character fits,
    else UTF-8 (which RFC 2831 allows only with charset=utf-8; a password that does not fit
    ISO 8859-1 cannot be matched without it)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


# -- directives (RFC 2831 section 7.1's #rule of token or quoted-string values) -----------

_DIRECTIVE = re.compile(r'[ \t\r\n]*([A-Za-z0-9_-]+)[ \t\r\n]*=[ \t\r\n]*'
                        r'(?:"((?:[^"\\]|\\.)*)"|([^",\s]*))[ \t\r\n]*(?:,|\Z)', re.S)
_ESCAPE = re.compile(r"\\(.)", re.S)


def parse_directives(token: bytes) -> dict[str, str]:
    """`name=value,...` of a challenge or response: names lower-cased, quoted values
    unescaped, values as ISO 8859-1 text (one character per byte, so `_raw` gives the bytes
    back). SaslFailure on a malformed list or a directive given twice."""
    text = token.decode("latin-1")
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _DIRECTIVE.match(text, pos)
        if match is None or match.end() == pos:
            raise SaslFailure(f"malformed directive list at byte {pos}")
        name = match.group(1).lower()
        if name in out:
            raise SaslFailure(f"directive {name!r} appears twice")
        quoted = match.group(2)
        out[name] = _ESCAPE.sub(r"\1", quoted) if quoted is not None else match.group(3)
        pos = match.end()
    return out


def _raw(value: str) -> bytes:
    return value.encode("latin-1")


def _text(value: str, utf8: bool) -> str:
    if not utf8:
        return value
    try:
        return _raw(value).decode("utf-8")
    except UnicodeDecodeError:
        raise SaslFailure("charset=utf-8, but a value is not UTF-8") from None


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _charset_is_utf8(fields: Mapping[str, str]) -> bool:
    charset = fields.get("charset")
    if charset is not None and charset.lower() != "utf-8":
        raise SaslFailure(f"charset {charset!r}: only utf-8 may be named")
    return charset is not None


def _check_negotiation(fields: Mapping[str, str], nonce: str, realm: str, digest_uri: str) -> None:
    """The directives that must repeat or accept what the challenge offered (RFC 2831 2.1.2)."""
    if not hmac.compare_digest(_raw(fields["nonce"]), nonce.encode("ascii")):
        raise SaslFailure("the nonce is not the one this server sent")
    if fields["nc"] != "00000001":
        raise SaslFailure(f"nonce-count {fields['nc']!r}: a fresh nonce is used once, with 00000001")
    if fields.get("qop", "auth") != "auth":
        raise SaslFailure(f"qop {fields['qop']!r}: this server offers only auth (TLS protects the bytes)")
    if "cipher" in fields:
        raise SaslFailure("cipher is only for qop auth-conf, which this server does not offer")
    if fields.get("realm", realm) != realm:
        raise SaslFailure(f"realm {fields['realm']!r} is not {realm!r}")
    if fields["digest-uri"].lower() != digest_uri.lower():
        raise SaslFailure(f"digest-uri {fields['digest-uri']!r} is not {digest_uri!r} (ZooKeeper's service "
                          "principal for DIGEST-MD5)")
    if not fields.get("maxbuf", "1").isdigit():
        raise SaslFailure(f"maxbuf {fields['maxbuf']!r} is not a number")
    if not re.fullmatch(r"[0-9a-fA-F]{32}", fields["response"]):
        raise SaslFailure("response is not 32 hex digits")
