"""Recovering a ledger: fence it, find its last entry, close it (seed 001, "Closing a ledger as a reader").

BookKeeper's LedgerRecoveryOp, sans-I/O. The steps:

1. MARKING: CAS the metadata to IN_RECOVERY. If another recoverer already did,
   go on: recoverers converge by the CAS at the end. If the CAS loses to the
   writer (an ensemble change), re-read and mark again; once IN_RECOVERY is
   committed the writer can no longer change the ensemble, so the last
   fragment is final.
2. FENCING: fence every bookie of the last fragment's ensemble until the
   answers cover it ((Qw - Qa) + 1 of each write quorum, quorum.Coverage);
   each answer carries that bookie's LAC. The highest one is known complete.
   A lost or failed fence is re-sent on a later Tick; a dead bookie does not
   block (coverage needs only (Qw - Qa) + 1 of each write quorum, #2281).
3. READING: read forward from
        start = max(highest LAC + 1, first entry of the last fragment)
   Entries up to the LAC were acknowledged. Entries before the last
   fragment's first entry were acknowledged too: the writer starts a new
   fragment at its first *unacknowledged* entry. So nothing before `start` is
   ever re-read or re-written, and recovery never touches old fragments
   (BookKeeper #2615); starting below the last fragment would re-add old
   entries to the new ensemble, a second copy the metadata does not record.
   Reads fence too (FAULTS.md "Fencing is not enough", #2614: a bookie whose
   fence was lost must not take the old writer's add after it answered "no
   such entry"): every read to a bookie that has not confirmed a fence (by
   answering the fence or a fencing read) carries the fence flag. Reads go to the entry's whole write quorum at once, a
   window of entries ahead. Per entry:
     * found: one digest-verified copy is enough; it is re-added (recovery
       add, accepted by fenced bookies) to its whole write quorum and counts
       once Qa of them acknowledged it;
     * absent: explicit NoSuchEntry / NoSuchLedger from (Qw - Qa) + 1 bookies
       of its write quorum (Coverage.entry): it cannot have been acknowledged;
     * unknown otherwise (timeouts, unavailable, corrupt copies, a bookie in
       limbo after losing its data): never absent; those bookies are asked
       again on a later Tick. Recovery waits rather than close short.
   The ledger ends just before the first absent entry, once every entry from
   `start` up to it is found and re-replicated.
4. CLOSING: CAS to CLOSED with that last entry and the ledger length (from
   the last entry's header; when no entry past `start - 1` exists, from entry
   `start - 1` read once, not re-added). On a lost CAS re-read: CLOSED by
   another recoverer -> adopt their result (convergence); still IN_RECOVERY
   with the same fragments -> close again on the new version; other
   fragments -> recover again from fencing.
5. A bookie whose recovery adds fail is replaced (ChooseBookies) for the
   entries re-added from then on; that fragment goes into the metadata only
   with the close (see the last section of this module).

Completed(result) carries the closed LedgerMetadata; `version` is its znode version.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bookie import errors as B
from bookie.entry import NO_ENTRY, DigestMismatch, Digester, EntryFormatError
from ledger.actions import (Action, AddAcked, AddFailed, BookiesChosen, ChooseBookies, Completed, Event, Failed,
                            FenceAnswered, FenceFailed, MetadataBadVersion, MetadataRead, MetadataWritten,
                            ReadAnswered, ReadFailed, ReadMetadata, SendAdd, SendFence, SendRead, Tick, WriteMetadata)
from ledger.errors import MetadataConflict, WrongPassword
from ledger.metadata import LedgerMetadata, LedgerState
from ledger.quorum import Coverage, write_quorum

ABSENT_ERRORS = (B.NoSuchEntry, B.NoSuchLedger)


class Phase(enum.Enum):
    MARKING = "marking"
    FENCING = "fencing"
    READING = "reading"
    CLOSING = "closing"
    DONE = "done"


@dataclass(slots=True)
class EntryRecovery:
    entry_id: int
    quorum: tuple[int, ...]      # where the old writer wrote it: read from here, absence judged here
    absent: Coverage
    targets: tuple[int, ...] = ()  # where it is re-added: its write quorum in the current metadata
    data: bytes | None = None
    length: int = 0
    is_absent: bool = False
    add_acks: set[int] = field(default_factory=set)
    read_retry: set[int] = field(default_factory=set)   # bookies to ask again on a Tick
    add_retry: set[int] = field(default_factory=set)
    add_sent: set[int] = field(default_factory=set)
    answered: set[int] = field(default_factory=set)


class RecoveryOp:
    """One recovery of one ledger. start(), then step(event) until Completed or Failed."""

    def __init__(self, metadata: LedgerMetadata, version: int, digester: Digester, *,
                 read_window: int = 64, retry_ticks: int = 3) -> None:
        self.metadata = metadata
        self.version = version
        self.digester = digester
        self.read_window = read_window
        self.retry_ticks = retry_ticks
        self.ledger_id = metadata.ledger_id
        self.phase = Phase.MARKING
        self._proposed: LedgerMetadata | None = None
        self._ticks = 0
        self.restarts = 0
        self._reset()
        self.result: LedgerMetadata | None = None

    def _reset(self) -> None:
        """Forget what fencing and reading found (at start, and when the metadata changed under us)."""
        # fencing
        self.fence_coverage: Coverage | None = None
        self.fenced: dict[int, int] = {}          # bookie -> LAC it reported
        self._fenced_by_read: set[int] = set()    # bookies that answered a fencing read
        self._fence_retry: set[int] = set()
        self.lac = NO_ENTRY
        # reading
        self.start_entry = 0
        self.entries: dict[int, EntryRecovery] = {}
        self.next_read = 0
        self.first_unresolved = 0
        self.end: int | None = None                # first absent entry
        self.probe: EntryRecovery | None = None   # entry start - 1, read for its length only
        self.last_entry = NO_ENTRY
        self.length = 0
        self.read_ensemble: tuple[int, ...] = ()   # the last fragment's ensemble when fencing began
        self.failed_bookies: set[int] = set()      # re-adds failed there: replace them (ensemble change)
        self.substitute: dict[int, int] = {}       # failed bookie of the last ensemble -> its replacement
        self.change_from: int | None = None        # entries from here on are re-added to the substitutes
        self._choosing = False
        self.ensemble_changes = 0

    # -- driving ----------------------------------------------------------------------------------
    def start(self) -> list[Action]:
        state = self.metadata.state
        if state is LedgerState.CLOSED:
            return self._done(self.metadata)
        if state is LedgerState.IN_RECOVERY:
            return self._begin_fencing()
        return self._mark()

    def step(self, event: Event) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        if isinstance(event, (MetadataWritten, MetadataBadVersion, MetadataRead)):
            return self._on_metadata(event)
        if isinstance(event, Tick):
            return self._on_tick()
        if self.phase is Phase.FENCING and isinstance(event, (FenceAnswered, FenceFailed)):
            return self._on_fence(event)
        if self.phase is Phase.READING:
            if isinstance(event, (ReadAnswered, ReadFailed)):
                return self._on_read(event)
            if isinstance(event, (AddAcked, AddFailed)):
                return self._on_add(event)
            if isinstance(event, BookiesChosen):
                return self._on_bookies_chosen(event.bookies)
        return []

    # -- marking and closing: the two CAS steps -------------------------------------------------------
    def _mark(self) -> list[Action]:
        self.phase = Phase.MARKING
        self._proposed = self.metadata.with_state(LedgerState.IN_RECOVERY)
        return [WriteMetadata(self._proposed, self.version)]

    def _on_metadata(self, event: Event) -> list[Action]:
        if self.phase not in (Phase.MARKING, Phase.CLOSING):
            return []
        if isinstance(event, MetadataWritten):
            self.metadata, self.version = self._proposed, event.version
            return self._begin_fencing() if self.phase is Phase.MARKING else self._done(self.metadata)
        if isinstance(event, MetadataBadVersion):
            return [ReadMetadata()]
        assert isinstance(event, MetadataRead)
        metadata, self.version = event.metadata, event.version
        self.metadata = metadata
        if metadata.state is LedgerState.CLOSED:
            return self._done(metadata)  # another recoverer (or the writer) closed it: converge on theirs
        if self.phase is Phase.MARKING:
            return self._begin_fencing() if metadata.state is LedgerState.IN_RECOVERY else self._mark()
        if metadata.state is LedgerState.IN_RECOVERY:
            if metadata.fragments == self._fragments_read:
                return self._close()  # only something else changed: close again on the new version
            return self._restart()    # the ensembles changed under us: what we verified may not hold
        self.phase = Phase.DONE
        return [Failed(MetadataConflict(f"ledger {self.ledger_id} went back to OPEN during recovery"))]

    def _restart(self) -> list[Action]:
        self.restarts += 1
        self._reset()
        return self._begin_fencing()

    def _close(self) -> list[Action]:
        self.phase = Phase.CLOSING
        self._fragments_read = self.metadata.fragments
        self._proposed = self._closing_base().closed(self.last_entry, self.length)
        return [WriteMetadata(self._proposed, self.version)]

    def _done(self, metadata: LedgerMetadata) -> list[Action]:
        self.phase, self.result = Phase.DONE, metadata
        return [Completed(metadata)]

    # -- fencing -----------------------------------------------------------------------------------------
    def _begin_fencing(self) -> list[Action]:
        self.phase = Phase.FENCING
        m = self.metadata
        self.fence_coverage = Coverage.ensemble(m.ensemble_size, m.write_quorum, m.ack_quorum)
        self.read_ensemble = m.last_fragment.ensemble
        return [SendFence(b) for b in m.last_fragment.ensemble]

    def _on_fence(self, event: FenceAnswered | FenceFailed) -> list[Action]:
        ensemble = self.read_ensemble
        if event.bookie not in ensemble:
            return []
        if isinstance(event, FenceFailed):
            if isinstance(event.error, B.Unauthorized):
                self.phase = Phase.DONE
                return [Failed(WrongPassword(f"bookie {event.bookie} refused ledger {self.ledger_id}'s master key"))]
            self._fence_retry.add(event.bookie)  # unknown: only a persisted fence counts
            return []
        self.fenced[event.bookie] = event.lac
        self.lac = max(self.lac, event.lac)
        if not self.fence_coverage.add(ensemble.index(event.bookie)):
            return []
        return self._begin_reading()

    # -- reading forward ------------------------------------------------------------------------------------
    def _begin_reading(self) -> list[Action]:
        self.phase = Phase.READING
        self.start_entry = max(self.lac + 1, self.metadata.last_fragment.first_entry)
        self.next_read = self.first_unresolved = self.start_entry
        return self._read_more()

    def _start_probe(self) -> list[Action]:
        """Nothing exists past start - 1: read that entry (not re-added, it is complete) for its length."""
        probe_id = self.start_entry - 1
        quorum = write_quorum(self.metadata.ensemble_for(probe_id), probe_id, self.metadata.write_quorum)
        self.probe = EntryRecovery(probe_id, quorum, self._absent_coverage(probe_id))
        return [SendRead(b, probe_id) for b in quorum]

    def _absent_coverage(self, entry_id: int) -> Coverage:
        m = self.metadata
        return Coverage.entry(m.ensemble_size, m.write_quorum, m.ack_quorum, entry_id)

    def _read_more(self) -> list[Action]:
        out: list[Action] = []
        m = self.metadata
        while self.next_read < self.first_unresolved + self.read_window and (
                self.end is None or self.next_read < self.end):
            e = self.next_read
            self.next_read += 1
            quorum = write_quorum(self.read_ensemble, e, m.write_quorum)
            moved = self.change_from is not None and e >= self.change_from
            targets = write_quorum(self._target_ensemble() if moved else m.ensemble_for(e), e, m.write_quorum)
            self.entries[e] = EntryRecovery(e, quorum, self._absent_coverage(e), targets)
            out += [SendRead(b, e, fence=self._needs_fence(b)) for b in quorum]
        return out

    def _needs_fence(self, bookie: int) -> bool:
        """Reads fence every bookie that has not confirmed a fence yet (#2614); a fence is durable, so
        once confirmed, plain reads do (a fence on every read would cost the bookie a journal write)."""
        return bookie not in self.fenced and bookie not in self._fenced_by_read

    def _verified(self, event: ReadAnswered) -> int | None:
        """The entry's length if the copy is genuine, else None (a corrupt copy is an unknown answer)."""
        try:
            entry = self.digester.verify(event.data)
        except (DigestMismatch, EntryFormatError):
            return None
        if entry.ledger_id != self.ledger_id or entry.entry_id != event.entry_id:
            return None
        return entry.length

    def _on_read(self, event: ReadAnswered | ReadFailed) -> list[Action]:
        probe = self.probe
        if probe is not None and event.entry_id == probe.entry_id and probe.data is None:
            return self._on_probe(probe, event)
        rec = self.entries.get(event.entry_id)
        if rec is None or rec.is_absent or event.bookie not in rec.quorum:
            return []
        rec.answered.add(event.bookie)
        if isinstance(event, ReadAnswered) or isinstance(event.error, ABSENT_ERRORS):
            self._fenced_by_read.add(event.bookie)  # it fenced before answering
        if isinstance(event, ReadAnswered):
            length = self._verified(event)
            if length is None:
                rec.read_retry.add(event.bookie)
                return []
            if rec.data is not None:
                return []
            rec.data, rec.length = event.data, length
            return self._readd(rec)
        if isinstance(event.error, ABSENT_ERRORS) and rec.data is None:
            index = self.read_ensemble.index(event.bookie)
            if rec.absent.add(index):
                rec.is_absent = True
                self.end = rec.entry_id if self.end is None else min(self.end, rec.entry_id)
                return self._advance()
            return []
        if rec.data is None:
            rec.read_retry.add(event.bookie)  # unknown: timeouts never prove absence (#3405)
        return []

    def _on_probe(self, probe: EntryRecovery, event: ReadAnswered | ReadFailed) -> list[Action]:
        if event.bookie not in probe.quorum:
            return []
        length = self._verified(event) if isinstance(event, ReadAnswered) else None
        if length is None:
            probe.read_retry.add(event.bookie)
            return []
        probe.data, probe.length = event.data, length
        return self._advance()

    def _readd(self, rec: EntryRecovery) -> list[Action]:
        """Recovery adds (accepted by fenced bookies) to the targets not sent to yet."""
        fresh = [b for b in rec.targets if b not in rec.add_sent]
        rec.add_sent.update(fresh)
        return [SendAdd(b, rec.entry_id, rec.data, recovery=True) for b in fresh]

    def _on_add(self, event: AddAcked | AddFailed) -> list[Action]:
        rec = self.entries.get(event.entry_id)
        if rec is None or rec.data is None or event.bookie not in rec.targets:
            return []  # an ack from a bookie the metadata does not record for the entry never counts
        if isinstance(event, AddFailed):
            rec.add_retry.add(event.bookie)
            if isinstance(event.error, (B.Overloaded, B.LedgerFenced)):
                return []  # busy (or a bookie that refuses recovery adds): ask again later
            self.failed_bookies.add(event.bookie)
            return self._start_change()
        rec.add_acks.add(event.bookie)
        if event.bookie in self.failed_bookies:
            # It takes adds again: replace only the bookies still failing (with one spare and a
            # dead bookie beside one that was down a while, asking for two replacements never ends).
            self.failed_bookies.discard(event.bookie)
            return self._start_change() + self._advance()
        return self._advance()

    def _advance(self) -> list[Action]:
        """Move past every entry that is found and re-replicated; close at the first absent one."""
        qa = self.metadata.ack_quorum
        while True:
            rec = self.entries.get(self.first_unresolved)
            if rec is None or rec.data is None or len(rec.add_acks) < qa:
                break
            self.last_entry, self.length = rec.entry_id, rec.length
            self.first_unresolved += 1
        if self.end is not None and self.first_unresolved == self.end:
            if self.end == self.start_entry:  # nothing past start - 1: its length comes from the probe
                if self.start_entry > 0 and self.probe is None:
                    return self._start_probe()
                if self.probe is not None and self.probe.data is None:
                    return []
                self.last_entry = self.start_entry - 1
                self.length = self.probe.length if self.probe is not None else 0
            return self._close()
        return self._read_more()

    # -- retries ----------------------------------------------------------------------------------------------
    def _on_tick(self) -> list[Action]:
        self._ticks += 1
        if self._ticks % self.retry_ticks:
            return []
        out: list[Action] = []
        if self.phase is Phase.FENCING:
            out += [SendFence(b) for b in sorted(self._fence_retry)]
            self._fence_retry.clear()
        elif self.phase is Phase.READING:
            recs = [r for r in self.entries.values() if not r.is_absent]
            if self.probe is not None and self.probe.data is None:
                recs.append(self.probe)
            for rec in recs:
                if rec.data is None:
                    out += [SendRead(b, rec.entry_id, fence=rec is not self.probe and self._needs_fence(b))
                            for b in sorted(rec.read_retry)]
                else:
                    out += [SendAdd(b, rec.entry_id, rec.data, recovery=True)
                            for b in sorted(rec.add_retry) if b in rec.targets]
                    rec.add_retry.clear()
                rec.read_retry.clear()
        return out

    # -- replacing a failed bookie during recovery -------------------------------------------------------
    # BookKeeper's recovery adds change the ensemble like a writer's adds. Here the new fragment is
    # never written on its own: entries from `change_from` on are re-added to the substituted
    # ensemble first, and the fragment goes into the metadata with the close, in one CAS. A recoverer
    # that dies halfway leaves the metadata as it was, so the next one still reads where the old
    # writer wrote (an intermediate fragment would make it judge absence on a bookie that never had
    # the entries).
    def _start_change(self) -> list[Action]:
        ensemble = self._target_ensemble()
        replacing = [b for b in ensemble if b in self.failed_bookies]
        if self._choosing or not replacing:
            return []
        self._choosing = True
        return [ChooseBookies(len(replacing), frozenset(ensemble) | self.failed_bookies)]

    def _target_ensemble(self) -> tuple[int, ...]:
        return tuple(self.substitute.get(b, b) for b in self.metadata.last_fragment.ensemble)

    def _on_bookies_chosen(self, bookies: tuple[int, ...]) -> list[Action]:
        ensemble = self._target_ensemble()
        replacing = [b for b in ensemble if b in self.failed_bookies]
        self._choosing = False
        if not replacing or len(bookies) < len(replacing) or set(bookies) & set(ensemble):
            return []  # no spare bookie: the failed ones are asked again on Ticks
        for old, new in zip(replacing, bookies):
            for original, current in list(self.substitute.items()):
                if current == old:
                    self.substitute[original] = new
            if old in self.metadata.last_fragment.ensemble:
                self.substitute[old] = new
        first = max(self.first_unresolved, self.metadata.last_fragment.first_entry)
        self.change_from = first if self.change_from is None else min(self.change_from, first)
        self.first_unresolved = self.change_from  # entries from there on are judged on the new targets
        self.ensemble_changes += 1
        ensemble, out = self._target_ensemble(), []
        for rec in self.entries.values():
            if rec.is_absent or rec.entry_id < self.change_from:
                continue
            rec.targets = write_quorum(ensemble, rec.entry_id, self.metadata.write_quorum)
            rec.add_acks.intersection_update(rec.targets)
            if rec.data is not None:
                out += self._readd(rec)
        return out + self._advance()

    def _closing_base(self) -> LedgerMetadata:
        """The metadata to close: with the substituted fragment if any entry lives in it."""
        if self.change_from is None or self.change_from > self.last_entry:
            return self.metadata
        return self.metadata.with_fragment(self.change_from, self._target_ensemble())
