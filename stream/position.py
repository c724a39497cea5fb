"""A record's position in a named log: DistributedLog's DLSN (segment sequence number, entry
id, slot). Positions order the records of a log: by segment, then by the entry in the segment's
ledger, then by the record's slot in that entry's record set."""

from __future__ import annotations

from dataclasses import dataclass

_MAX = (1 << 63) - 1


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Segment sequence numbers start at 1; entry ids and slots at 0. Written "segment:entry:slot"."""

    segment: int
    entry: int
    slot: int

    def __post_init__(self) -> None:
        for name in ("segment", "entry", "slot"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= _MAX:
                raise ValueError(f"a position's {name} is an integer from 0 to 2**63-1, got {value!r}")

    def __str__(self) -> str:
        return f"{self.segment}:{self.entry}:{self.slot}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """"segment:entry:slot" (as str() writes it); ValueError naming the expected form otherwise."""
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(f"a position is written segment:entry:slot (three decimal numbers), got {text!r}")
        return cls(*(int(p) for p in parts))


HEAD = Position(0, 0, 0)  # before every record of every log
