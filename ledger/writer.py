"""The writer of one ledger (BookKeeper's LedgerHandle + PendingAddOp), as a pure state machine.

Seed 001, "Writing to the ledger", and what follows from it:

- append assigns the next entry id, packages the entry with the current LAC
  piggybacked, and sends it to its write quorum (quorum.write_quorum);
- an entry is acknowledged after Qa acks from its write quorum, and only when
  every lower entry is acknowledged; the LAC is the last acknowledged entry;
- a bookie failure starts an ensemble change: a new fragment from the first
  unacknowledged entry (LAC + 1) with the failed bookie replaced, written by
  CAS; on a lost CAS the metadata is re-read, and if the ledger is no longer
  OPEN every outstanding append fails with an unknown outcome;
- LedgerFenced from any bookie: a recoverer took over. Stop and fail every
  outstanding append as "outcome unknown", never a false success.

The ack rule that BookKeeper got wrong several times (#1591, #4651, #4097):
an ack counts only if its bookie is in the entry's write quorum *as the
committed metadata records it*. While an ensemble-change CAS is in flight no
entry is acknowledged at all (acks are kept, and judged against the ensemble
that the CAS commits); acks from a bookie that the change replaced never
count. Appends made during the change are packaged at once but sent only once
the new ensemble is committed. So every acknowledged entry has Qa copies on
bookies that the metadata names for it.

Explicit LACs (for tailing readers): the LAC piggybacked on each add reaches
the bookies with the next add. When an acknowledgement leaves the writer quiet
(nothing outstanding), it asks for an Idle event (RequestIdle: the driver
answers once the application has had its turn, with no timer); if the writer
is still quiet then, it sends the explicit LAC at once (a Tick stands in for
an Idle that has not come yet). An application that appends again right away
(awaiting one append at a time) piggybacks the LAC instead, at no extra
message. At most one round per append: never more LAC rounds than appends,
and under pipelined load the writer is rarely quiet.

Events in: AddAcked, AddFailed, BookiesChosen, MetadataWritten,
MetadataBadVersion, MetadataRead, Tick, Idle. Calls in: append(payload),
close(). Actions out: SendAdd, SendLac, RequestIdle, ChooseBookies,
WriteMetadata, ReadMetadata, Acknowledge, FailAdds, Completed/Failed (of the
close).
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field

from bookie import errors as B
from bookie.entry import NO_ENTRY, Digester
from ledger.actions import (Acknowledge, Action, AddAcked, AddFailed, BookiesChosen, ChooseBookies, Event,
                            FailAdds, Failed, Idle, MetadataBadVersion, MetadataRead, MetadataWritten, ReadMetadata,
                            RequestIdle, SendAdd, SendLac, Tick, WriteMetadata)
from ledger.close_op import CloseOp
from ledger.errors import (EntryTooLarge, LedgerClosed, LedgerClosedUnderWriter, LedgerError, LedgerFenced,
                           LedgerStateError, NotEnoughBookies, WrongPassword)
from ledger.metadata import LedgerMetadata, LedgerState
from ledger.quorum import write_quorum


class WriterState(enum.Enum):
    OPEN = "open"          # taking appends
    CLOSING = "closing"    # close requested: draining outstanding appends, then the close CAS
    CLOSED = "closed"      # closed by us
    BROKEN = "broken"      # fenced, closed under us, out of bookies, ...: nothing more will succeed


@dataclass(slots=True)
class PendingAdd:
    entry_id: int
    data: bytes               # packaged: ids, piggybacked LAC, length, digest, payload
    length: int               # ledger length in bytes through this entry
    sent_to: frozenset[int] = frozenset()  # replaced, never changed in place: often the shared `quorum`
    quorum: frozenset[int] = frozenset()  # its write quorum in the committed metadata (set when sent)
    acks: set[int] = field(default_factory=set)  # always within `quorum`


@dataclass(slots=True)
class EnsembleChange:
    first_entry: int                            # the first unacknowledged entry when it began
    replacing: tuple[int, ...]                  # failed bookies of the last ensemble
    proposed: LedgerMetadata | None = None      # set once bookies are chosen and the CAS is sent


class Writer:
    """The write side of one OPEN ledger. Drive it with append/close/step; execute the actions in order."""

    def __init__(self, metadata: LedgerMetadata, version: int, digester: Digester, *,
                 explicit_lac: bool = True, max_outstanding: int = 4096, retry_ticks: int = 2) -> None:
        if metadata.state is not LedgerState.OPEN:
            raise LedgerStateError(f"ledger {metadata.ledger_id} is {metadata.state.value}, not OPEN")
        self.metadata = metadata
        self.version = version
        self.digester = digester
        self.explicit_lac = explicit_lac
        self.max_outstanding = max_outstanding  # appends sent but not acknowledged; more wait, unsent
        self.retry_ticks = retry_ticks
        self.ledger_id = metadata.ledger_id
        self.lac = NO_ENTRY                 # last entry acknowledged to the application
        self.length = 0                     # bytes through lac
        self.next_entry = 0
        self.appended_length = 0            # bytes through next_entry - 1
        # Entry order. An OrderedDict: a plain dict deleted from the front makes every later scan
        # from the front walk over the holes (quadratic under pipelining).
        self.pending: collections.OrderedDict[int, PendingAdd] = collections.OrderedDict()
        self.unsent: collections.deque[int] = collections.deque()  # pending ids not sent yet (window, change)
        self.retry: set[tuple[int, int]] = set()   # (bookie, entry) refused as Overloaded: sent again later
        self._ticks = 0
        self._idle_requested = False               # a RequestIdle is out: its Idle decides the explicit LAC
        self.failed_bookies: set[int] = set()
        self.change: EnsembleChange | None = None
        self.close_op: CloseOp | None = None
        self.state = WriterState.OPEN
        self.error: LedgerError | None = None
        self.lac_sent = NO_ENTRY            # highest LAC that reached the bookies (piggybacked or explicit)
        self.ensemble_changes = 0
        self._quorums: dict[int, tuple[tuple[int, ...], frozenset[int]]] = {}  # entry % E -> last fragment's
        self._quorums_of: LedgerMetadata | None = None  # the metadata _quorums were computed from

    # -- the application's calls -----------------------------------------------------------
    def append(self, payload: bytes) -> tuple[int, list[Action]]:
        """Assign the next entry id and send it; returns (entry_id, actions)."""
        if self.state is not WriterState.OPEN:
            raise self._refusal()
        entry_id = self.next_entry
        self.next_entry += 1
        self.appended_length += len(payload)
        data = self.digester.package(self.ledger_id, entry_id, self.lac, self.appended_length, payload)
        add = PendingAdd(entry_id, data, self.appended_length)
        self.pending[entry_id] = add
        self.lac_sent = max(self.lac_sent, self.lac)
        self.unsent.append(entry_id)
        return entry_id, self._send_unsent()

    def close(self) -> list[Action]:
        """Close as the writer: drain outstanding appends, then CAS to CLOSED at the LAC (seed 001)."""
        if self.state is WriterState.BROKEN:
            return [Failed(self.error)]
        if self.state is not WriterState.OPEN:
            return [Failed(LedgerStateError(f"ledger {self.ledger_id}: close already requested"))]
        self.state = WriterState.CLOSING
        return self._maybe_close()

    def _refusal(self) -> LedgerError:
        if self.state is WriterState.BROKEN:
            return self.error
        return LedgerClosed(self.ledger_id, "this handle is closing or closed")

    # -- events ------------------------------------------------------------------------------
    def step(self, event: Event) -> list[Action]:
        if type(event) is AddAcked:  # the hot path first
            return self._on_ack(event)
        if isinstance(event, AddAcked):
            return self._on_ack(event)
        if isinstance(event, AddFailed):
            return self._on_add_failed(event)
        if isinstance(event, (MetadataWritten, MetadataBadVersion, MetadataRead)):
            return self._on_metadata(event)
        if isinstance(event, BookiesChosen):
            return self._on_bookies_chosen(event.bookies)
        if isinstance(event, Tick):
            return self._on_tick()
        if isinstance(event, Idle):
            return self._on_idle()
        raise TypeError(f"not a writer event: {event!r}")

    def _on_ack(self, event: AddAcked) -> list[Action]:
        return self.add_acked(event.bookie, event.entry_id)

    def add_acked(self, bookie: int, entry_id: int) -> list[Action]:
        """step(AddAcked(bookie, entry_id)), without the event object: the driver's hot path, one
        call per bookie per entry."""
        add = self.pending.get(entry_id)
        if add is None or self.state is WriterState.BROKEN or bookie not in add.quorum:
            return []  # an ack from a bookie the metadata does not record for the entry never counts
        add.acks.add(bookie)
        if len(add.acks) < self.metadata.ack_quorum or next(iter(self.pending)) != entry_id:
            return []  # not acknowledged yet, or a lower entry is not
        return self._acknowledge()

    def add_acked_many(self, bookie: int, entry_ids: list[int]) -> list[Action]:
        """add_acked(bookie, e) for each of entry_ids, in order, with the actions of all of them:
        the acks of one socket read from one bookie, in one call."""
        pending = self.pending
        if self.state is WriterState.BROKEN or not pending:
            return []
        qa, first = self.metadata.ack_quorum, next(iter(pending))
        for entry_id in entry_ids:
            add = pending.get(entry_id)
            if add is not None and bookie in add.quorum:
                add.acks.add(bookie)
        add = pending[first]  # as add_acked: acknowledging starts only once the first pending entry may go
        return self._acknowledge() if first in entry_ids and len(add.acks) >= qa else []

    def _on_add_failed(self, event: AddFailed) -> list[Action]:
        if self.state in (WriterState.BROKEN, WriterState.CLOSED) or self.close_op is not None:
            return []  # nothing outstanding any more: the close CAS decides
        err = event.error
        if isinstance(err, B.LedgerFenced):
            return self._break(LedgerFenced(self.ledger_id, f"bookie {event.bookie} refused entry {event.entry_id}"))
        if isinstance(err, B.Unauthorized):
            return self._break(WrongPassword(f"bookie {event.bookie} refused ledger {self.ledger_id}'s master key"))
        if isinstance(err, B.EntryTooLarge):
            return self._break(EntryTooLarge(f"ledger {self.ledger_id} entry {event.entry_id}: {err}"))
        if isinstance(err, B.Overloaded):
            self.retry.add((event.bookie, event.entry_id))  # busy, not failed: the same bookie, a bit later
            return []
        add = self.pending.get(event.entry_id)
        if add is not None:
            add.acks.discard(event.bookie)
        if event.bookie not in self.metadata.last_fragment.ensemble:
            return []  # a bookie an earlier change already replaced
        self.failed_bookies.add(event.bookie)
        return self._start_change()

    # -- acknowledging -------------------------------------------------------------------------
    def _acknowledge(self) -> list[Action]:
        if self.change is not None:
            return []  # hold every ack while the ensemble-change CAS is in flight (#4651, #4097)
        done: list[int] = []
        qa, pending = self.metadata.ack_quorum, self.pending
        while pending:
            entry_id = next(iter(pending))
            add = pending[entry_id]
            if len(add.acks) < qa or not add.quorum:  # acks are within the committed write quorum
                break
            del pending[entry_id]
            done.append(entry_id)
            self.lac, self.length = entry_id, add.length
        out: list[Action] = [Acknowledge(tuple(done))] if done else []
        out += self._send_unsent()
        if (done and not self.pending and self.explicit_lac and self.lac > self.lac_sent
                and not self._idle_requested):
            self._idle_requested = True
            out.append(RequestIdle())  # the application's next append may carry the LAC: see Idle
        return out + self._maybe_close()

    def _on_idle(self) -> list[Action]:
        """The application had its turn since the writer went quiet. Still quiet, with a LAC no add
        carried: tell the bookies now, so a tailing reader's long poll answers at once rather than
        with the next add or a tick later (a cheap message: the bookie does not fsync it). A round
        goes out only when an acknowledgement emptied the writer and moved the LAC past the last one
        sent, so never more rounds than appends."""
        self._idle_requested = False
        if (self.pending or self.lac <= self.lac_sent or not self.explicit_lac
                or self.state not in (WriterState.OPEN, WriterState.CLOSING)):
            return []  # an append carries it (or will be acknowledged and ask again), or nothing to tell
        return self._explicit_lac()

    def _explicit_lac(self) -> list[Action]:
        self.lac_sent = self.lac
        return [SendLac(b, self.lac) for b in self.metadata.last_fragment.ensemble if b not in self.failed_bookies]

    def _send_unsent(self) -> list[Action]:
        """Send waiting appends while the window allows (and no ensemble change is in flight)."""
        if not self.unsent:
            return []
        out: list[Action] = []
        in_flight = len(self.pending) - len(self.unsent)
        while self.unsent and self.change is None and in_flight < self.max_outstanding:
            out += self._send(self.pending[self.unsent.popleft()])
            in_flight += 1
        return out

    def _on_tick(self) -> list[Action]:
        self._ticks += 1
        out: list[Action] = self._on_idle() if self._idle_requested else []  # a driver slow to answer it
        if not self.retry or self._ticks % self.retry_ticks or self.change is not None:
            return out
        for bookie, entry_id in sorted(self.retry):
            add = self.pending.get(entry_id)
            quorum = write_quorum(self.metadata.ensemble_for(entry_id), entry_id, self.metadata.write_quorum)
            if add is not None and bookie in quorum and bookie in add.sent_to:
                out.append(SendAdd(bookie, entry_id, add.data))
        self.retry.clear()
        return out

    def _send(self, add: PendingAdd) -> list[Action]:
        """Send to the entry's write quorum in the committed metadata (the bookies not sent to yet)."""
        quorum, members = self._write_quorum(add.entry_id)
        add.quorum = members
        if not add.sent_to:  # the common case: a fresh append, no acks yet
            add.sent_to = members
            return [SendAdd(b, add.entry_id, add.data) for b in quorum]
        add.acks.intersection_update(members)
        fresh = [b for b in quorum if b not in add.sent_to]
        add.sent_to = add.sent_to.union(fresh)
        return [SendAdd(b, add.entry_id, add.data) for b in fresh]

    def _write_quorum(self, entry_id: int) -> tuple[tuple[int, ...], frozenset[int]]:
        """write_quorum() of the committed metadata, as a tuple and a set; memoized for the last
        fragment (it depends only on entry_id % E there) until the metadata changes."""
        metadata = self.metadata
        fragment = metadata.last_fragment
        if entry_id < fragment.first_entry:
            quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
            return quorum, frozenset(quorum)
        if self._quorums_of is not metadata:
            self._quorums, self._quorums_of = {}, metadata
        key = entry_id % metadata.ensemble_size
        found = self._quorums.get(key)
        if found is None:
            quorum = write_quorum(fragment.ensemble, entry_id, metadata.write_quorum)
            found = self._quorums[key] = (quorum, frozenset(quorum))
        return found

    # -- ensemble change -------------------------------------------------------------------------
    def _start_change(self) -> list[Action]:
        if self.change is not None or self.state not in (WriterState.OPEN, WriterState.CLOSING):
            return []  # one change at a time; failures meanwhile are handled when it commits
        ensemble = self.metadata.last_fragment.ensemble
        replacing = tuple(b for b in ensemble if b in self.failed_bookies)
        if not replacing:
            return []
        self.change = EnsembleChange(self.lac + 1, replacing)
        exclude = frozenset(self.metadata.last_fragment.ensemble) | self.failed_bookies
        return [ChooseBookies(len(replacing), exclude)]

    def _on_bookies_chosen(self, bookies: tuple[int, ...]) -> list[Action]:
        change = self.change
        if change is None or change.proposed is not None or self.state is WriterState.BROKEN:
            return []
        if len(bookies) < len(change.replacing) or set(bookies) & set(self.metadata.last_fragment.ensemble):
            return self._break(NotEnoughBookies(
                f"ledger {self.ledger_id}: no bookie to replace failed bookie(s) {list(change.replacing)}; "
                "appends in flight may or may not be in the ledger"))
        substitute = dict(zip(change.replacing, bookies))
        ensemble = tuple(substitute.get(b, b) for b in self.metadata.last_fragment.ensemble)
        change.proposed = self.metadata.with_fragment(change.first_entry, ensemble)
        return [WriteMetadata(change.proposed, self.version)]

    def _on_metadata(self, event: Event) -> list[Action]:
        if self.close_op is not None:
            out = self.close_op.step(event)
            if self.close_op.done:
                self.metadata, self.version = self.close_op.metadata, self.close_op.version
                failed = [a for a in out if isinstance(a, Failed)]
                self.state = WriterState.BROKEN if failed else WriterState.CLOSED
                if failed:
                    self.error = failed[0].error
            return out
        change = self.change
        if change is None or change.proposed is None or self.state is WriterState.BROKEN:
            return []
        if isinstance(event, MetadataWritten):
            return self._commit_change(change.proposed, event.version)
        if isinstance(event, MetadataBadVersion):
            return [ReadMetadata()]
        assert isinstance(event, MetadataRead)
        return self._on_change_reread(event.metadata, event.version)

    def _on_change_reread(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        change = self.change
        assert change is not None and change.proposed is not None
        if metadata == change.proposed:
            return self._commit_change(metadata, version)  # our CAS landed; only its answer was lost
        if metadata.state is not LedgerState.OPEN:
            why = "closed" if metadata.is_closed else "in recovery"
            err = (LedgerClosedUnderWriter(self.ledger_id, "closed by another client during an ensemble change")
                   if metadata.is_closed else LedgerFenced(self.ledger_id, f"the ledger is {why}"))
            return self._break(err)
        # Still OPEN but changed by someone else (re-replication): adopt it, propose again if needed.
        return self._adopt(metadata, version)

    def _commit_change(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        self.ensemble_changes += 1
        return self._adopt(metadata, version)

    def _adopt(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        """Committed metadata with (maybe) other bookies: judge and complete every entry against it."""
        self.metadata, self.version, self.change = metadata, version, None
        out: list[Action] = []
        for add in self.pending.values():
            if add.sent_to:  # the others wait in self.unsent
                out += self._send(add)  # judged, and completed, against the new write quorum
        out += self._send_unsent()
        out += self._start_change()  # bookies that failed while the CAS was in flight
        return out + self._acknowledge()

    # -- closing and breaking ----------------------------------------------------------------------
    def _maybe_close(self) -> list[Action]:
        if self.state is not WriterState.CLOSING or self.pending or self.change or self.close_op:
            return []
        self.close_op = CloseOp(self.metadata, self.version, self.lac, self.length)
        return self.close_op.start()

    def fail(self, error: LedgerError) -> list[Action]:
        """The driver's verdict: the ledger is gone (deleted under us), so nothing outstanding will
        ever be acknowledged and nothing more can be written. Idempotent."""
        return [] if self.state is WriterState.BROKEN else self._break(error)

    def _break(self, error: LedgerError) -> list[Action]:
        """Nothing outstanding will ever be acknowledged: fail it all with `error`."""
        closing = self.state is WriterState.CLOSING
        self.state, self.error = WriterState.BROKEN, error
        ids = tuple(self.pending)
        self.pending.clear()
        self.unsent.clear()
        self.change = None
        out: list[Action] = [FailAdds(ids, error)] if ids else []
        if closing:
            out.append(Failed(error))  # the close that was waiting for the drain fails too
        return out

    def statistics(self) -> dict:
        return {"ledger_id": self.ledger_id, "state": self.state.value, "lac": self.lac,
                "next_entry": self.next_entry, "pending": len(self.pending),
                "ensemble_changes": self.ensemble_changes, "changing": self.change is not None}
