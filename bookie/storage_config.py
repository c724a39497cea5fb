"""What the bookie storage engine is configured with and exchanges with its caller (pure data).

One validated frozen dataclass (STYLE.md, habit 10), the add request the
bookie service decodes from the wire, and the result of a compaction.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
MASTER_KEY_BYTES = 32
# The hard ceiling of an entry this engine can store at all: journal and entry
# log decoders reject larger lengths as damage, so a config cannot exceed it.
MAX_ENTRY_BYTES_LIMIT = 64 * MIB
MAX_ID = 2**63 - 1  # ledger and entry ids are non-negative signed 64-bit (Java longs)


@dataclass(frozen=True)
class BookieStorageConfig:
    """Tuning of one bookie's storage; the defaults suit a production disk.

    - max_entry_bytes: a packaged entry larger than this is refused (EntryTooLarge).
    - journal_segment_bytes: a journal segment rolls once it passes this size.
    - entry_log_bytes: the current entry log rotates once it passes this size.
    - checkpoint_every_bytes / checkpoint_interval_ms: BookieStorage.run()
      checkpoints when this many journal bytes were written since the last
      checkpoint, or this long after it if anything was written.
    - disk_usage_threshold: fraction of the filesystem in use above which the
      bookie turns read-only (1.0: never); disk_check_interval_ms: how often
      run() re-checks it.
    - compaction_threshold: an entry log whose live bytes are below this
      fraction of its size is rewritten by compact() (0.0: never).
    - compaction_interval_ms: how often run() compacts (0: only when called).
    - max_index_bytes: above this much index memory (Index.memory_bytes, sampled with the disk
      check) the bookie turns read-only as on a full disk, until deletions bring it back under.
    """

    max_entry_bytes: int = 5 * MIB
    journal_segment_bytes: int = 256 * MIB
    entry_log_bytes: int = 512 * MIB
    checkpoint_every_bytes: int = 64 * MIB
    checkpoint_interval_ms: int = 60_000
    disk_usage_threshold: float = 0.95
    disk_check_interval_ms: int = 10_000
    compaction_threshold: float = 0.5
    compaction_interval_ms: int = 0
    max_index_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not 0 < self.max_entry_bytes <= MAX_ENTRY_BYTES_LIMIT:
            raise ValueError(f"max_entry_bytes must be in 1..{MAX_ENTRY_BYTES_LIMIT}, got {self.max_entry_bytes}")
        for name in ("journal_segment_bytes", "entry_log_bytes", "checkpoint_every_bytes", "max_index_bytes"):
            if getattr(self, name) < 4096:
                raise ValueError(f"{name} must be at least 4096 bytes, got {getattr(self, name)}")
        for name in ("checkpoint_interval_ms", "disk_check_interval_ms", "compaction_interval_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0.0 <= self.disk_usage_threshold <= 1.0:
            raise ValueError(f"disk_usage_threshold is a fraction in 0..1, got {self.disk_usage_threshold}")
        if not 0.0 <= self.compaction_threshold <= 1.0:
            raise ValueError(f"compaction_threshold is a fraction in 0..1, got {self.compaction_threshold}")


@dataclass(frozen=True, slots=True)
class AddRequest:
    """One add as the service decoded it: `data` is the packaged entry (bookie/entry.py).

    `recovery` marks a recovery add, which a fenced ledger still accepts (that
    is how recovery re-replicates, seed 001).
    """

    ledger_id: int
    entry_id: int
    master_key: bytes
    data: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class CompactionStats:
    """What one compact() did: entry logs rewritten and removed, entries moved, bytes freed."""

    logs_compacted: int = 0
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_freed: int = 0
