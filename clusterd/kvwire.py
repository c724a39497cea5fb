"""The temporary key-value client protocol: frames, requests, responses (pure, no I/O).

It serves the demo until the metastore brings the ZooKeeper client protocol.

Format, version 1. Both directions carry frames:

    u32 big-endian length n | n bytes: one UTF-8 JSON object

Requests: {"op": "put", "key": k, "value": v, "version": n | null},
{"op": "delete", "key": k, "version": n | null}, {"op": "get", "key": k}.
A null or absent version means "any"; 0 on a put means "must not exist yet".
No other fields are allowed. Every request
gets exactly one response, in request order: {"ok": true, ...} or
{"ok": false, "error": <one of ERRORS>, "message": text}. A request that breaks
this format gets a BadRequest response, after which the server closes the
connection: nothing after a broken frame can be trusted to be aligned.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from zab.kv_state_machine import MAX_KEY_BYTES, MAX_VALUE_BYTES

HEADER = struct.Struct(">I")
# The largest legal request is a put of a MAX_VALUE_BYTES value. JSON escapes a
# control character as 6 bytes (\u00XX), so the worst case is 6x the value plus
# the key and the envelope; 8 MiB covers it. Larger frames are refused before
# their body is read, so a bad length costs no memory.
MAX_FRAME_BYTES = 8 << 20

BAD_VERSION = "BadVersion"
NO_KEY = "NoKey"
NO_LEADER = "NoLeader"
OUTCOME_UNKNOWN = "OutcomeUnknown"
BAD_REQUEST = "BadRequest"
ERRORS = (BAD_VERSION, NO_KEY, NO_LEADER, OUTCOME_UNKNOWN, BAD_REQUEST)


class WireError(Exception):
    """The peer sent bytes that break the format; the connection cannot continue."""


class FrameTooLarge(WireError):
    pass


class MalformedFrame(WireError):
    pass


class BadRequest(WireError):
    """A well-framed JSON object that is not a valid request."""


@dataclass(frozen=True, slots=True)
class Get:
    key: str


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: str
    version: int | None  # None: any version


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    version: int | None


Request = Get | Put | Delete


# -- frames -------------------------------------------------------------------

def encode_frame(message: dict[str, Any]) -> bytes:
    """One frame holding `message` as compact JSON."""
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Turns a byte stream into JSON objects; incremental, bounded by `max_frame_bytes`."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        """The next complete message, or None until more bytes arrive; WireError if broken."""
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self._max:
            raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {self._max}")
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[HEADER.size:end])
        del self._buffer[:end]
        return _decode_body(body)

    def check_eof(self) -> None:
        """The stream ended: raise if it stopped inside a frame."""
        if self._buffer:
            raise MalformedFrame(f"stream ended inside a frame ({len(self._buffer)} bytes pending)")


def _decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise MalformedFrame(f"frame is not UTF-8 JSON: {e}") from None
    if not isinstance(message, dict):
        raise MalformedFrame(f"frame holds a JSON {type(message).__name__}, not an object")
    return message


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# -- requests -----------------------------------------------------------------

_FIELDS = {"get": {"op", "key"}, "put": {"op", "key", "value", "version"}, "delete": {"op", "key", "version"}}


def parse_request(message: dict[str, Any]) -> Request:
    """Validate a decoded request; BadRequest says what is wrong with it."""
    op = message.get("op")
    if op not in _FIELDS:
        raise BadRequest(f"unknown op {op!r}: expected one of {sorted(_FIELDS)}")
    extra = set(message) - _FIELDS[op]
    if extra:
        raise BadRequest(f"unexpected fields {sorted(extra)} for op {op!r}")
    key = _text(message, "key", MAX_KEY_BYTES)
    if not key:
        raise BadRequest("key must not be empty")
    if op == "get":
        return Get(key)
    version = _version(message)
    if op == "delete":
        return Delete(key, version)
    return Put(key, _text(message, "value", MAX_VALUE_BYTES), version)


def _text(message: dict[str, Any], field: str, max_bytes: int) -> str:
    value = message.get(field)
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # JSON can carry lone surrogates, which are not text
        raise BadRequest(f"{field} is not valid Unicode text") from None
    if size > max_bytes:
        raise BadRequest(f"{field} is {size} bytes, more than the limit of {max_bytes}")
    return value


def _version(message: dict[str, Any]) -> int | None:
    version = message.get("version")  # absent, like null, means any version
    if version is None:
        return None
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 1 << 63:
        raise BadRequest("version must be null or an integer from 0 to 2^63-1")
    return version


def request_message(request: Request) -> dict[str, Any]:
    """The JSON object for `request` (client side)."""
    if isinstance(request, Get):
        return {"op": "get", "key": request.key}
    if isinstance(request, Put):
        return {"op": "put", "key": request.key, "value": request.value, "version": request.version}
    return {"op": "delete", "key": request.key, "version": request.version}


# -- responses ----------------------------------------------------------------

def error_response(error: str, message: str, **fields: Any) -> dict[str, Any]:
    assert error in ERRORS, error
    return {"ok": False, "error": error, "message": message, **fields}


def check_response(message: dict[str, Any]) -> dict[str, Any]:
    """Validate a response envelope (client side); WireError if it is not one."""
    ok = message.get("ok")
    if ok is True:
        return message
    if ok is False and message.get("error") in ERRORS and isinstance(message.get("message"), str):
        return message
    raise MalformedFrame(f"not a response: {message!r:.200}")
