"""A small deterministic key-value state machine with versioned compare-and-set, for the
Zab-only tests of the simulator (the daemon runs only the metastore's; tests/test_metastore_sim.py
runs the simulator on that one).
Requests and transactions are JSON objects (sorted keys, so bytes are
deterministic). The leader prepares each request into an idempotent
transaction carrying the resulting version, as in the paper's example
(w1 = ("/a", "1", 1)): replaying a transaction never depends on state it does
not name, except that a `set` replaces the value and version outright.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from zab.statemachine import MalformedState, Refusal

ANY_VERSION = None  # the request carries JSON null for "any version"
MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1 << 20


class KVRequestError(ValueError):
    """A client request that cannot be turned into a transaction."""


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def encode_put(key: str, value: str, version: int | None = ANY_VERSION) -> bytes:
    """Request: set `key` to `value` if its version is `version` (None: any; 0: must not exist)."""
    return _dumps({"op": "put", "key": key, "value": value, "version": version})


def encode_delete(key: str, version: int | None = ANY_VERSION) -> bytes:
    return _dumps({"op": "delete", "key": key, "version": version})


def decode_result(result: bytes) -> dict[str, Any]:
    """Result of an applied transaction: {"ok": true, "version": n} or {"ok": false, "error": ...}."""
    return json.loads(result)


@dataclass(frozen=True, slots=True)
class FrozenKV:
    zxid: int
    items: dict[str, tuple[str, int]]

    def to_bytes(self) -> bytes:
        return _dumps({"zxid": self.zxid, "items": sorted([k, v, ver] for k, (v, ver) in self.items.items())})


class KVStateMachine:
    """Keys map to (value, version); version counts sets since creation, starting at 1."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, int]] = {}
        self.last_zxid = 0
        # Leader's view of the future (paper section 1): key -> (version or None if deleted, pending count)
        self._prepared: dict[str, tuple[int | None, int]] = {}

    # -- leader side -------------------------------------------------------
    def _future_version(self, key: str) -> int | None:
        if key in self._prepared:
            return self._prepared[key][0]
        current = self.items.get(key)
        return None if current is None else current[1]

    def prepare(self, zxid: int, session_id: int, request: bytes, decoded: object = None) -> bytes | Refusal:
        try:
            req = _parse_request(request)
        except KVRequestError as e:
            return Refusal(_dumps({"e": "BadRequest", "m": str(e)}))
        key, expected = req["key"], req["version"]
        future = self._future_version(key)
        if expected is not None and (future or 0) != expected:
            return Refusal(_dumps({"e": "BadVersion", "m": f"{key!r} is at version {future or 0}, not {expected}"}))
        pending = self._prepared.get(key, (None, 0))[1] + 1
        if req["op"] == "put":
            new_version = (future or 0) + 1
            self._prepared[key] = (new_version, pending)
            return _dumps({"t": "set", "k": key, "v": req["value"], "ver": new_version})
        if future is None:
            return Refusal(_dumps({"e": "NoKey", "m": f"{key!r} does not exist"}))
        self._prepared[key] = (None, pending)
        return _dumps({"t": "del", "k": key})

    def forget_prepared(self) -> None:
        self._prepared.clear()

    # -- every node --------------------------------------------------------
    def refused(self, zxid: int, refusal: bytes) -> bytes:
        # `zxid`: what the answer was ordered after, so a reader can check that order.
        t = _loads(refusal, "refusal")
        if not (isinstance(t, dict) and isinstance(t.get("e"), str) and isinstance(t.get("m"), str)):
            raise MalformedState("a refusal needs string fields e and m")
        return _dumps({"ok": False, "error": t["e"], "message": t["m"], "zxid": zxid})

    def check(self, txn: bytes) -> None:
        _decode_txn(txn)

    def apply(self, zxid: int, txn: bytes) -> bytes:
        assert zxid > self.last_zxid, f"apply out of order: {zxid:#x} after {self.last_zxid:#x}"
        t = _decode_txn(txn)  # whole, before the first change: MalformedState leaves the state as it was
        self.last_zxid = zxid
        if t["t"] == "err":  # logs written before refusals were answered without a transaction
            return _dumps({"ok": False, "error": t["e"], "message": t["m"]})
        key = t["k"]
        self._settle(key)
        if t["t"] == "set":
            self.items[key] = (t["v"], t["ver"])
            return _dumps({"ok": True, "version": t["ver"], "zxid": zxid})
        self.items.pop(key, None)
        return _dumps({"ok": True, "version": 0, "zxid": zxid})

    def _settle(self, key: str) -> None:
        if key in self._prepared:
            version, pending = self._prepared[key]
            if pending <= 1:
                del self._prepared[key]
            else:
                self._prepared[key] = (version, pending - 1)

    def get(self, key: str) -> tuple[str, int] | None:
        return self.items.get(key)

    def freeze(self) -> FrozenKV:
        return FrozenKV(self.last_zxid, dict(self.items))

    def restore(self, zxid: int, state: bytes) -> None:
        doc = _loads(state, "snapshot")
        if not isinstance(doc, dict) or doc.get("zxid") != zxid or not isinstance(doc.get("items"), list):
            raise MalformedState(f"not a snapshot at zxid {zxid:#x}")
        if not all(isinstance(i, list) and len(i) == 3 and isinstance(i[0], str) and isinstance(i[1], str)
                   and _is_version(i[2]) for i in doc["items"]):
            raise MalformedState("a snapshot item must be [key, value, version]")
        self.items = {k: (v, ver) for k, v, ver in doc["items"]}
        self.last_zxid = zxid
        self._prepared.clear()

    def digest(self) -> str:
        return hashlib.sha256(FrozenKV(0, self.items).to_bytes()).hexdigest()[:16]


def _loads(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise MalformedState(f"{what} is not JSON: {e}") from None


def _is_version(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


_TXN_FIELDS = {"err": {"e": str, "m": str}, "set": {"k": str, "v": str, "ver": int}, "del": {"k": str}}


def _decode_txn(txn: bytes) -> dict[str, Any]:
    """A transaction with every field `apply` reads, of its type; MalformedState otherwise."""
    t = _loads(txn, "transaction")
    fields = _TXN_FIELDS.get(t.get("t")) if isinstance(t, dict) and isinstance(t.get("t"), str) else None
    if fields is None or not all(isinstance(t.get(f), kind) for f, kind in fields.items()):
        raise MalformedState(f"not a transaction: {bytes(txn[:64])!r}")
    if "ver" in fields and not _is_version(t["ver"]):
        raise MalformedState(f"version {t['ver']!r} is not a non-negative integer")
    return t


def _parse_request(request: bytes) -> dict[str, Any]:
    try:
        req = json.loads(request)
    except (ValueError, UnicodeDecodeError) as e:
        raise KVRequestError(f"request is not JSON: {e}") from None
    if not isinstance(req, dict) or req.get("op") not in ("put", "delete"):
        raise KVRequestError("request must be an object with op 'put' or 'delete'")
    key, version = req.get("key"), req.get("version")
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise KVRequestError(f"key must be a non-empty string of at most {MAX_KEY_BYTES} bytes")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        raise KVRequestError("version must be null (any) or a non-negative integer")
    if req["op"] == "put":
        value = req.get("value")
        if not isinstance(value, str) or len(value.encode()) > MAX_VALUE_BYTES:
            raise KVRequestError(f"value must be a string of at most {MAX_VALUE_BYTES} bytes")
    return req
