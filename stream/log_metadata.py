"""A named log's own metadata and where a log lives in the metastore (seed 004's namespace).

    <root>/<log>                       this metadata (JSON): settings, ownership epoch, the next
                                       segment's number, the truncation point; its znode version
                                       guards the whole segment list (every change sets it)
    <root>/<log>/segments/<seq>        one znode per segment (stream/segment.py), seq in 10 digits
    <root>/<log>/owner/writer-<n>      ephemeral sequential: writers queued for ownership
    <root>/<log>/subscribers/<name>    a subscription's committed position ("segment:entry:slot")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from stream import metadata_json as mj
from stream.errors import CorruptMetadata
from stream.position import HEAD, Position

DEFAULT_ROOT = "/streams"  # /quire is the daemons' (its ACLs let applications only read it)
SEQ_DIGITS = 10
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_FIELDS = {"version", "created_ms", "epoch", "next_segment", "truncated_before", "ensemble", "write_quorum",
           "ack_quorum", "max_entry_bytes", "roll_bytes", "roll_ms", "retention_ms", "retention_bytes"}


def check_name(name: str, what: str = "log") -> str:
    """A log's or subscription's name: 1-200 of letters, digits, '.', '_', '-', not starting with
    '.' or '-' (ValueError otherwise)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a {what} name is 1 to 200 letters, digits, '.', '_' or '-', starting with a letter, "
                         f"digit or '_'; got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class LogSettings:
    """How a log's segments are written: their ledgers' E/Qw/Qa, the largest record set, and when
    a segment rolls (bytes of records, or age); retention by age or total size (0: keep all)."""

    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    max_entry_bytes: int = 1 << 20
    roll_bytes: int = 256 << 20
    roll_ms: int = 3_600_000
    retention_ms: int = 0
    retention_bytes: int = 0

    def check(self, what: str = "log settings") -> LogSettings:
        if not self.ensemble >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError(f"{what}: ensemble >= write_quorum >= ack_quorum >= 1 is required")
        if not 64 <= self.max_entry_bytes <= 4 << 20:
            raise ValueError(f"{what}: max_entry_bytes must be from 64 to 4 MiB (bookies keep entries below 5 MiB)")
        if self.roll_bytes < 1 or self.roll_ms < 1 or self.retention_ms < 0 or self.retention_bytes < 0:
            raise ValueError(f"{what}: roll_bytes and roll_ms must be positive, retention 0 or more")
        return self


@dataclass(frozen=True, slots=True)
class LogMetadata:
    created_ms: int
    settings: LogSettings
    epoch: int = 0                    # one more at each change of owner
    next_segment: int = 1
    truncated_before: Position = HEAD

    def with_(self, **changes: object) -> LogMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]

    def encode(self) -> bytes:
        s = self.settings
        return mj.dumps({"version": 1, "created_ms": self.created_ms, "epoch": self.epoch,
                         "next_segment": self.next_segment, "truncated_before": str(self.truncated_before),
                         "ensemble": s.ensemble, "write_quorum": s.write_quorum, "ack_quorum": s.ack_quorum,
                         "max_entry_bytes": s.max_entry_bytes, "roll_bytes": s.roll_bytes, "roll_ms": s.roll_ms,
                         "retention_ms": s.retention_ms, "retention_bytes": s.retention_bytes})

    @classmethod
    def decode(cls, data: bytes, what: str = "log") -> LogMetadata:
        f = mj.loads(data, what, _FIELDS)
        if f["version"] != 1:
            raise CorruptMetadata(f"{what}: metadata version {f['version']!r}, this Quire reads version 1")
        try:
            truncated = Position.parse(f["truncated_before"]) if isinstance(f["truncated_before"], str) else None
        except ValueError:
            truncated = None
        if truncated is None:
            raise CorruptMetadata(f"{what}: truncated_before must be a position segment:entry:slot")
        ints = {k: mj.integer(f, k, what) for k in ("ensemble", "write_quorum", "ack_quorum", "max_entry_bytes",
                                                   "roll_bytes", "roll_ms", "retention_ms", "retention_bytes")}
        try:
            settings = LogSettings(**ints).check(what)
        except ValueError as e:
            raise CorruptMetadata(str(e)) from None
        return cls(created_ms=mj.integer(f, "created_ms", what), settings=settings, epoch=mj.integer(f, "epoch", what),
                   next_segment=mj.integer(f, "next_segment", what, 1), truncated_before=truncated)


class LogPaths:
    """The znodes of one log under a namespace root."""

    def __init__(self, root: str, name: str) -> None:
        self.name = check_name(name)
        self.log = f"{root.rstrip('/')}/{name}"
        self.segments = f"{self.log}/segments"
        self.owner = f"{self.log}/owner"
        self.subscribers = f"{self.log}/subscribers"

    def segment(self, seq: int) -> str:
        return f"{self.segments}/{seq:0{SEQ_DIGITS}d}"

    def subscriber(self, name: str) -> str:
        return f"{self.subscribers}/{check_name(name, 'subscription')}"

    @staticmethod
    def seq_of(child: str) -> int | None:
        """The sequence number a segments/ child names, or None for a name that is not one."""
        return int(child) if len(child) == SEQ_DIGITS and child.isdigit() and child.isascii() else None
