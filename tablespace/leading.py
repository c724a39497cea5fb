"""What a tablespace's leader decides before it writes a change (pure): a transaction's conditions
checked against the state every earlier change will give, and its effects.

The leader pipelines: a change is appended before the earlier ones are acknowledged, so it is
checked against the applied state plus the effects still pending (`_pending`, the last pending
effect per key). Reads are answered from the applied state only: a value is visible once its
change is acknowledged, never before.
"""

from __future__ import annotations

from dataclasses import dataclass

from tablespace.change import Delete, Effect, Put
from tablespace.errors import BadRequest, VersionMismatch
from tablespace.state import TableState

ABSENT = -1  # an `expect` that the key must not exist
MAX_KEY_BYTES = 64 << 10
MAX_VALUE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a transaction. kind "put", "delete" or "check" (a condition only);
    `expect`: None for none, ABSENT, or the version the key must have."""
    kind: str
    table: str
    key: bytes
    value: bytes = b""
    expect: int | None = None

    def check(self) -> None:
        if self.kind not in ("put", "delete", "check"):
            raise BadRequest(f"op {self.kind!r} is not put, delete or check")
        table = self.table.encode()
        if not 0 < len(table) <= 255 or not self.table.isprintable() or "/" in self.table:
            raise BadRequest(f"table name {self.table!r}: 1 to 255 bytes, printable, no '/'")
        if len(self.key) > MAX_KEY_BYTES or len(self.value) > MAX_VALUE_BYTES:
            raise BadRequest(f"keys are at most {MAX_KEY_BYTES} bytes and values {MAX_VALUE_BYTES}")
        if self.expect is not None and not ABSENT <= self.expect < 1 << 63:
            raise BadRequest(f"expect is -1 (absent) or a version from 0, got {self.expect}")
        if self.kind == "check" and self.expect is None:
            raise BadRequest("a check needs an expected version")


class Leader:
    """The leader's view of a tablespace: the applied state and the effects not acknowledged yet."""

    def __init__(self, state: TableState) -> None:
        self.state = state
        self._pending: dict[tuple[str, bytes], list] = {}  # key -> [value or None, version, pending count]

    def current(self, table: str, key: bytes) -> tuple[bytes, int] | None:
        """The key as the changes written so far leave it (pending ones included)."""
        p = self._pending.get((table, key))
        if p is not None:
            return None if p[0] is None else (p[0], p[1])
        return self.state.get(table, key)

    def prepare(self, ops: list[Op]) -> tuple[list[Effect], list[int | None]]:
        """The effects of a transaction and each op's result (a put's new version, a check's
        version, None for a delete), registered as pending. VersionMismatch (nothing registered)
        if a condition fails; later ops see earlier ones."""
        if not ops:
            raise BadRequest("a transaction needs at least one op")
        seen: dict[tuple[str, bytes], tuple[bytes, int] | None] = {}
        effects: list[Effect] = []
        results: list[int | None] = []
        for i, op in enumerate(ops):
            op.check()
            k = (op.table, op.key)
            now = seen[k] if k in seen else self.current(op.table, op.key)
            version = ABSENT if now is None else now[1]
            if op.expect is not None and op.expect != version:
                raise VersionMismatch(f"op {i}: {op.table}/{op.key!r} is at version {version}, not {op.expect}"
                                      " (-1: absent)")
            if op.kind == "put":
                # As ZooKeeper's: a key created again starts at version 0.
                new = version + 1 if now is not None else 0
                seen[k] = (op.value, new)
                effects.append(Put(op.table, op.key, op.value, new))
                results.append(new)
            elif op.kind == "delete":
                if now is not None:
                    seen[k] = None
                    effects.append(Delete(op.table, op.key))
                results.append(None)
            else:
                results.append(version)
        for e in effects:
            p = self._pending.setdefault((e.table, e.key), [None, 0, 0])
            p[0], p[1] = (e.value, e.version) if isinstance(e, Put) else (None, 0)
            p[2] += 1
        return effects, results

    def acknowledged(self, effects: list[Effect]) -> None:
        """A change was acknowledged (in log order): apply it and drop it from the pending."""
        self.state.apply(effects)
        for e in effects:
            k = (e.table, e.key)
            p = self._pending[k]
            p[2] -= 1
            if not p[2]:
                del self._pending[k]
