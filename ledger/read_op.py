"""Reading: one entry from its replicas, the LAC from the ensemble, and long polls for tailing.

- ReadEntryOp (BookKeeper's PendingReadOp with speculative reads): ask the
  entry's write-quorum bookies one at a time, in write-set order; if the one
  asked does not answer within `speculative_ticks` Ticks, ask the next one as
  well. The first digest-verified copy wins. A digest mismatch, a wrong
  entry, NoSuchEntry or a failure moves on to the next replica at once; when
  every replica failed, EntryNotAvailable.
- ReadLacOp (ReadLastConfirmedOp): ask every bookie of the last fragment for
  its LAC; done with the highest answer once the answers cover the ensemble
  ((Qw - Qa) + 1 of each write quorum), or once everyone answered or failed
  with at least one answer. Any LAC a bookie reports was acknowledged to the
  writer's application, so reading up to it is safe (seed 000, "Reading").
- LongPollOp: ask one bookie of the next entry's write quorum to answer when
  its LAC passes what we know; move to the next replica on failure.
"""

from __future__ import annotations

from bookie.entry import DigestMismatch, Digester, Entry, EntryFormatError
from ledger.actions import (Action, Completed, Event, Failed, LacAnswered, LacFailed, LongPollAnswered,
                            LongPollFailed, ReadAnswered, ReadFailed, SendLongPoll, SendRead, SendReadLac, Tick)
from ledger.errors import EntryNotAvailable
from ledger.metadata import LedgerMetadata
from ledger.quorum import Coverage, write_quorum


def verify_entry(digester: Digester, ledger_id: int, entry_id: int, data: bytes) -> Entry | None:
    """The entry if `data` is a genuine copy of (ledger_id, entry_id), else None."""
    try:
        entry = digester.verify(data)
    except (DigestMismatch, EntryFormatError):
        return None
    if entry.ledger_id != ledger_id or entry.entry_id != entry_id:
        return None
    return entry


class ReadEntryOp:
    """Read one entry. Completed(Entry) or Failed(EntryNotAvailable)."""

    def __init__(self, metadata: LedgerMetadata, entry_id: int, digester: Digester, *,
                 speculative_ticks: int = 2) -> None:
        self.ledger_id = metadata.ledger_id
        self.entry_id = entry_id
        self.digester = digester
        self.speculative_ticks = speculative_ticks
        self.replicas = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
        self.asked = 0                      # replicas[:asked] were sent a read
        self.failed: dict[int, str] = {}    # bookie -> why its answer was no good
        self.ticks_since_ask = 0
        self.done = False

    def start(self) -> list[Action]:
        return self._ask_next()

    def _ask_next(self) -> list[Action]:
        if self.asked >= len(self.replicas):
            return []
        bookie = self.replicas[self.asked]
        self.asked += 1
        self.ticks_since_ask = 0
        return [SendRead(bookie, self.entry_id)]

    def step(self, event: Event) -> list[Action]:
        if self.done:
            return []
        if isinstance(event, Tick):
            self.ticks_since_ask += 1
            if self.ticks_since_ask >= self.speculative_ticks:
                return self._ask_next()  # speculative: the slow replica may still answer first
            return []
        if not isinstance(event, (ReadAnswered, ReadFailed)) or event.entry_id != self.entry_id:
            return []
        if event.bookie not in self.replicas or event.bookie in self.failed:
            return []
        if isinstance(event, ReadAnswered):
            entry = verify_entry(self.digester, self.ledger_id, self.entry_id, event.data)
            if entry is not None:
                self.done = True
                return [Completed(entry)]
            self.failed[event.bookie] = "digest mismatch"
        else:
            self.failed[event.bookie] = type(event.error).__name__
        if len(self.failed) == len(self.replicas):
            self.done = True
            detail = ", ".join(f"bookie {b}: {why}" for b, why in self.failed.items())
            return [Failed(EntryNotAvailable(self.ledger_id, self.entry_id, detail))]
        return self._ask_next()


class ReadLacOp:
    """The highest LAC the last fragment's bookies report. Completed(lac) or Failed(EntryNotAvailable)."""

    def __init__(self, metadata: LedgerMetadata) -> None:
        self.ledger_id = metadata.ledger_id
        self.ensemble = metadata.last_fragment.ensemble
        self.coverage = Coverage.ensemble(metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum)
        self.lac: int | None = None
        self.outstanding = set(self.ensemble)
        self.done = False

    def start(self) -> list[Action]:
        return [SendReadLac(b) for b in self.ensemble]

    def step(self, event: Event) -> list[Action]:
        if self.done or not isinstance(event, (LacAnswered, LacFailed)) or event.bookie not in self.outstanding:
            return []
        self.outstanding.discard(event.bookie)
        if isinstance(event, LacAnswered):
            self.lac = event.lac if self.lac is None else max(self.lac, event.lac)
            self.coverage.add(self.ensemble.index(event.bookie))
        if self.lac is not None and (self.coverage.covered() or not self.outstanding):
            self.done = True
            return [Completed(self.lac)]
        if not self.outstanding:
            self.done = True
            return [Failed(EntryNotAvailable(self.ledger_id, -1, "no bookie of the ensemble answered for the LAC"))]
        return []


class LongPollOp:
    """Wait for entry `entry_id` to be confirmed (LAC >= entry_id), asking one replica at a time.

    Completed((lac, Entry | None)): the bookie's LAC when it answered, and the
    entry if it came with the answer. A LAC unchanged at the bookie's timeout
    completes too (the caller polls again, maybe after checking whether the
    ledger got closed). Failed(EntryNotAvailable) once every replica failed.
    """

    def __init__(self, metadata: LedgerMetadata, entry_id: int, previous_lac: int, digester: Digester,
                 *, first_replica: int = 0) -> None:
        self.ledger_id = metadata.ledger_id
        self.entry_id = entry_id
        self.previous_lac = previous_lac
        self.digester = digester
        quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
        k = first_replica % len(quorum)
        self.replicas = quorum[k:] + quorum[:k]
        self.asked = 0
        self.done = False

    def start(self) -> list[Action]:
        return self._ask_next()

    def _ask_next(self) -> list[Action]:
        if self.asked >= len(self.replicas):
            self.done = True
            return [Failed(EntryNotAvailable(self.ledger_id, self.entry_id, "no replica answered the long poll"))]
        bookie = self.replicas[self.asked]
        self.asked += 1
        return [SendLongPoll(bookie, self.entry_id, self.previous_lac)]

    def step(self, event: Event) -> list[Action]:
        if self.done or not isinstance(event, (LongPollAnswered, LongPollFailed)):
            return []
        if event.bookie != self.replicas[self.asked - 1]:
            return []
        if isinstance(event, LongPollFailed):
            return self._ask_next()
        entry = None
        if event.data is not None:
            entry = verify_entry(self.digester, self.ledger_id, self.entry_id, event.data)
        self.done = True
        return [Completed((event.lac, entry))]
