"""Ledger metadata: what the metastore keeps about each ledger, and where.

Seed 001 ("A ledger's metadata contains"): id, ensemble size E, write quorum
Qw, ack quorum Qa, state OPEN / IN_RECOVERY / CLOSED, last entry (only when
CLOSED), and one or more fragments (first entry, bookies). Seed 000 adds the
ledger length, digest type, password, ctime and custom metadata, and the
hierarchical ledger-manager layout `{root}/{2 digits}/{4 digits}/L{4 digits}`
of the 10-digit ledger id.

Every change is a versioned compare-and-set on the ledger's znode (done by
ledger/manager.py); this module is pure: the record, its rules, its bytes.
The znode data is UTF-8 JSON (docs/ledger.md): readable with `clusterctl get`,
versioned by a "format" field, validated field by field on decode.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from bookie.entry import NO_ENTRY, DigestType

FORMAT = 1
MAX_LEDGER_ID = 10**10 - 1  # the hierarchical layout has 10 digits
MAX_ENSEMBLE = 64


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class LedgerMetadataError(ValueError):
    """Metadata bytes or values that break the rules; the message names the field."""


@dataclass(frozen=True, slots=True)
class Fragment:
    """A run of entries from `first_entry` on, stored on `ensemble` (bookie ids, E of them)."""

    first_entry: int
    ensemble: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: tuple[Fragment, ...]
    digest_type: DigestType
    password_digest: bytes  # ledger/password.py password_record (salted scrypt): open() refuses a wrong password
    ctime_ms: int
    state: LedgerState = LedgerState.OPEN
    last_entry: int | None = None  # set exactly when CLOSED; NO_ENTRY (-1) for an empty ledger
    length: int = 0  # bytes of payload up to last_entry, when CLOSED
    custom: dict[str, bytes] = field(default_factory=dict)
    # bookie.entry.master_key(password): what AutoRecovery's recovery adds carry (a bookie binds a
    # ledger to its first add's key). None in metadata written before it was kept: such a ledger
    # cannot be re-replicated (docs/autorecovery.md says why storing it is an acceptable trade-off).
    master_key: bytes | None = None

    def __post_init__(self) -> None:
        _check(self)

    # -- reading ------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_fragment(self) -> Fragment:
        return self.fragments[-1]

    def fragment_index(self, entry_id: int) -> int:
        """Index of the fragment that holds `entry_id` (the last one starting at or before it)."""
        if entry_id < 0:
            raise ValueError(f"entry ids start at 0, got {entry_id}")
        index = 0
        for i, fragment in enumerate(self.fragments):
            if fragment.first_entry <= entry_id:
                index = i
        return index

    def ensemble_for(self, entry_id: int) -> tuple[int, ...]:
        return self.fragments[self.fragment_index(entry_id)].ensemble

    def fragment_end(self, index: int) -> int | None:
        """Last entry of fragment `index`: the next fragment's first entry - 1, or the ledger's last
        entry for the final fragment of a closed ledger, or None (open-ended)."""
        if index + 1 < len(self.fragments):
            return self.fragments[index + 1].first_entry - 1
        return self.last_entry if self.is_closed else None

    @property
    def bookies(self) -> frozenset[int]:
        return frozenset(b for f in self.fragments for b in f.ensemble)

    # -- changing (each result is what a CAS will try to write) --------------------------
    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return replace(self, state=state)

    def closed(self, last_entry: int, length: int) -> LedgerMetadata:
        """CLOSED at `last_entry`; fragments that start after it are dropped (they hold nothing)."""
        fragments = tuple(f for i, f in enumerate(self.fragments) if i == 0 or f.first_entry <= last_entry)
        return replace(self, state=LedgerState.CLOSED, last_entry=last_entry, length=length, fragments=fragments)

    def with_fragment(self, first_entry: int, ensemble: tuple[int, ...]) -> LedgerMetadata:
        """A new last fragment from `first_entry`; replaces the last one if it starts there too
        (an ensemble change whose first entry never got written)."""
        kept = tuple(f for f in self.fragments if f.first_entry < first_entry)
        if not kept and first_entry != 0:
            raise LedgerMetadataError(f"fragment at {first_entry} would leave entries 0..{first_entry - 1} without one")
        return replace(self, fragments=(*kept, Fragment(first_entry, tuple(ensemble))))

    def replace_bookie(self, fragment_index: int, old: int, new: int) -> LedgerMetadata:
        """Re-replication: `new` takes `old`'s place in one fragment's ensemble."""
        fragment = self.fragments[fragment_index]
        ensemble = tuple(new if b == old else b for b in fragment.ensemble)
        fragments = list(self.fragments)
        fragments[fragment_index] = Fragment(fragment.first_entry, ensemble)
        return replace(self, fragments=tuple(fragments))


def _check(m: LedgerMetadata) -> None:
    def fail(problem: str) -> None:
        raise LedgerMetadataError(f"ledger {m.ledger_id}: {problem}")

    if not 0 <= m.ledger_id <= MAX_LEDGER_ID:
        fail(f"ledger id must be from 0 to {MAX_LEDGER_ID}")
    if not (1 <= m.ack_quorum <= m.write_quorum <= m.ensemble_size <= MAX_ENSEMBLE):
        fail(f"need E >= Qw >= Qa >= 1 (and E <= {MAX_ENSEMBLE}), got E={m.ensemble_size} "
             f"Qw={m.write_quorum} Qa={m.ack_quorum}")
    if not m.fragments or m.fragments[0].first_entry != 0:
        fail("the first fragment must start at entry 0")
    previous = -1
    for f in m.fragments:
        if f.first_entry <= previous:
            fail(f"fragments must start at increasing entries, got {[x.first_entry for x in m.fragments]}")
        previous = f.first_entry
        if len(f.ensemble) != m.ensemble_size or len(set(f.ensemble)) != len(f.ensemble):
            fail(f"fragment at {f.first_entry} needs {m.ensemble_size} distinct bookies, got {list(f.ensemble)}")
    if (m.state is LedgerState.CLOSED) != (m.last_entry is not None):
        fail(f"last entry is set exactly when the ledger is CLOSED (state {m.state.value}, last {m.last_entry})")
    if m.last_entry is not None and m.last_entry < NO_ENTRY:
        fail(f"last entry {m.last_entry} is below {NO_ENTRY}")
    if m.length < 0:
        fail("length must not be negative")
    if m.master_key is not None and len(m.master_key) != 32:
        fail(f"master key must be 32 bytes, got {len(m.master_key)}")


# -- the znode path (seed 000, hierarchical ledger manager) --------------------------------

def ledger_path(root: str, ledger_id: int) -> str:
    """`{root}/00/0000/L0001` for ledger 1: at most 100 / 10,000 / 10,000 children per level."""
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise LedgerMetadataError(f"ledger id {ledger_id} is outside 0..{MAX_LEDGER_ID}")
    digits = f"{ledger_id:010d}"
    return f"{root}/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"


def ledger_id_from_path(root: str, path: str) -> int:
    """Inverse of ledger_path; LedgerMetadataError for anything else."""
    parts = path[len(root):].split("/") if path.startswith(root + "/") else []
    if (len(parts) != 4 or parts[0] or len(parts[1]) != 2 or len(parts[2]) != 4 or len(parts[3]) != 5
            or not parts[3].startswith("L") or not (parts[1] + parts[2] + parts[3][1:]).isdigit()):
        raise LedgerMetadataError(f"{path!r} is not a ledger path under {root!r}")
    return int(parts[1] + parts[2] + parts[3][1:])


# -- bytes --------------------------------------------------------------------------------

def encode(m: LedgerMetadata) -> bytes:
    doc = {
        "format": FORMAT, "ledger_id": m.ledger_id, "ensemble_size": m.ensemble_size,
        "write_quorum": m.write_quorum, "ack_quorum": m.ack_quorum, "state": m.state.value,
        "last_entry": m.last_entry, "length": m.length,
        "fragments": [{"first_entry": f.first_entry, "ensemble": list(f.ensemble)} for f in m.fragments],
        "digest_type": m.digest_type.name, "password_digest": m.password_digest.hex(), "ctime_ms": m.ctime_ms,
        "custom": {k: base64.b64encode(v).decode() for k, v in sorted(m.custom.items())},
    }
    if m.master_key is not None:
        doc["master_key"] = m.master_key.hex()
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(data: bytes | None) -> LedgerMetadata:
    """Parse and validate znode data; LedgerMetadataError names what is wrong."""
    if data is None:  # a znode written with null data (a ZooKeeper client may do that)
        raise LedgerMetadataError("ledger metadata znode holds null data")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise LedgerMetadataError(f"ledger metadata is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise LedgerMetadataError("ledger metadata must be a JSON object")
    if doc.get("format") != FORMAT:
        raise LedgerMetadataError(f"ledger metadata format {doc.get('format')!r} is not {FORMAT}: "
                                  "written by another version of Quire")
    try:
        return _from_doc(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, LedgerMetadataError):
            raise
        raise LedgerMetadataError(f"ledger metadata field missing or malformed: {e!r}") from None


def _from_doc(doc: dict[str, Any]) -> LedgerMetadata:
    def integer(value: Any, *, optional: bool = False) -> Any:
        if optional and value is None:
            return None
        if type(value) is not int:
            raise ValueError(f"expected an integer, got {value!r}")
        return value

    fragments = tuple(Fragment(integer(f["first_entry"]), tuple(integer(b) for b in f["ensemble"]))
                      for f in doc["fragments"])
    custom = doc["custom"]
    if not isinstance(custom, dict):
        raise ValueError("custom must be an object")
    return LedgerMetadata(
        ledger_id=integer(doc["ledger_id"]), ensemble_size=integer(doc["ensemble_size"]),
        write_quorum=integer(doc["write_quorum"]), ack_quorum=integer(doc["ack_quorum"]),
        fragments=fragments, digest_type=DigestType[doc["digest_type"]],
        password_digest=bytes.fromhex(doc["password_digest"]), ctime_ms=integer(doc["ctime_ms"]),
        state=LedgerState(doc["state"]), last_entry=integer(doc["last_entry"], optional=True),
        length=integer(doc["length"]),
        custom={str(k): base64.b64decode(v, validate=True) for k, v in custom.items()},
        master_key=bytes.fromhex(doc["master_key"]) if doc.get("master_key") is not None else None)
