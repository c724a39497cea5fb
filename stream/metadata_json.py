"""Strict JSON for the named logs' metadata znodes: readable with any ZooKeeper tool, and
checked field by field on the way in, since anyone with write access to the metastore can put
anything there (CorruptMetadata names the field and what it should be)."""

from __future__ import annotations

import json
from typing import Any

from stream.errors import CorruptMetadata

MAX_INT = (1 << 63) - 1
MAX_METADATA_BYTES = 64 << 10


def dumps(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def loads(data: bytes | None, what: str, known: set[str]) -> dict[str, Any]:
    """The object `data` holds, with exactly the `known` keys; CorruptMetadata otherwise."""
    if data is None:  # a znode written with null data (a ZooKeeper client may do that)
        raise CorruptMetadata(f"{what}: the znode holds null data")
    if len(data) > MAX_METADATA_BYTES:
        raise CorruptMetadata(f"{what}: {len(data)} bytes of metadata, more than this version writes")
    try:
        fields = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptMetadata(f"{what}: not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise CorruptMetadata(f"{what}: not a JSON object")
    if set(fields) != known:
        missing, extra = sorted(known - set(fields)), sorted(set(fields) - known)
        raise CorruptMetadata(f"{what}: fields missing {missing}, unknown {extra}")
    return fields


def integer(fields: dict[str, Any], key: str, what: str, low: int = 0, high: int = MAX_INT) -> int:
    value = fields[key]
    if type(value) is not int or not low <= value <= high:
        raise CorruptMetadata(f"{what}: {key} must be an integer from {low} to {high}, got {value!r}")
    return value


def choice(fields: dict[str, Any], key: str, what: str, allowed: tuple[str, ...]) -> str:
    value = fields[key]
    if value not in allowed:
        raise CorruptMetadata(f"{what}: {key} must be one of {list(allowed)}, got {value!r}")
    return value
