"""What a bookie decides about its ledgers, written once (pure: no I/O, no clock, no threads).

BookieStorage (bookie/storage.py, the edge that makes journal records durable) and the
simulator's SimBookie (sim/bookies.py) both decide every request here:

- a ledger is bound to the first master key that adds to it, fences it or writes its LAC (a
  KEY record goes before that request's own record); any other key is Unauthorized, a key of
  another size than MASTER_KEY_BYTES a BadRequest;
- a fenced ledger refuses adds (LedgerFenced) except recovery adds. Fencing writes a FENCE
  record; fencing a ledger never seen here creates it fenced, so a late add is refused too;
  fencing an already fenced ledger writes nothing and answers its LAC;
- a ledger's LAC is max(highest LAC field of its stored entries, explicit LAC). The LAC
  field of an accepted add raises the explicit LAC at once, before the add is durable, as an
  explicit LAC does (both name entries the writer had acknowledged); it never goes down;
- a deleted ledger is gone for good: adds, fences and LAC writes answer NoSuchLedger, and so
  do reads;
- while `read_only` says why (the disk is full), adds are refused with BookieReadOnly; reads,
  fences and LACs are still served (recovery must be able to fence a full bookie);
- re-adding an entry stored here is a success that writes nothing.

The state is an Index (bookie/index.py): per ledger its key, fence flag, LACs and stored
entries, and the deleted ledgers' ids; it is what checkpoints persist. The rules change it at
once, when they decide (a fence refuses later adds from that moment), and hand back the
journal records that make the change durable, exactly the bytes of
storage_codec.encode_journal_record; the caller answers only once they are durable. An
accepted add's entry becomes readable when the caller reports it stored (`stored`), after
its record is durable.

`step(request) -> Outcome` is the uniform form. `admit_adds` is the hot path: a socket read's
worth of adds decided in one pass, without a request or outcome object per add, that hands
every add its checks do not clear to the same one-add rule `step` uses; it must agree with
`step` outcome for outcome and byte for byte (tests/test_bookie_ledger_rules.py checks it
under hypothesis). `replay` gives a journal record read back on open its meaning.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from crc32c import crc32c

from bookie.entry import HEADER, HEADER_BYTES, DigestType, EntryFormatError, parse_header
from bookie.errors import (BadRequest, BookieError, BookieReadOnly, EntryTooLarge, LedgerFenced, NoSuchEntry,
                           NoSuchLedger, Unauthorized)
from bookie.index import Index, LedgerState, Location
from bookie.storage_codec import JournalRecord, Kind, encode_journal_record
from bookie.storage_config import MASTER_KEY_BYTES, MAX_ENTRY_BYTES_LIMIT, MAX_ID, AddRequest

__all__ = ["AddFields", "AddRequest", "Admission", "Admitted", "DeleteLedgers", "Fence", "LedgerRules", "Outcome",
           "ReadEntry", "ReadLac", "Request", "WriteLac"]

# One add as the service hands it over: (ledger_id, entry_id, master_key, packaged entry, recovery).
AddFields = tuple[int, int, bytes, bytes, bool]
# One accepted add, to store once its record is durable: (ledger_id, entry_id, packaged entry, its LAC field).
Admitted = tuple[int, int, bytes, int]

_IDS = struct.Struct(">QQ")
_FRAME = struct.Struct(">II")
_ADD_KIND = bytes((Kind.ADD,))
_MIN_ADD_BODY = 1 + 16  # kind, ledger id, entry id
_DIGEST_BYTES = {t.value: t.size for t in DigestType}


# --- requests and outcomes ------------------------------------------------------------------
# An add is a storage_config.AddRequest.

@dataclass(frozen=True, slots=True)
class Fence:
    """Fence the ledger (binding its key if unbound); answers its LAC."""

    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class WriteLac:
    """An explicit LAC from the writer (binding the ledger's key if unbound)."""

    ledger_id: int
    lac: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class ReadLac:
    """This bookie's LAC of the ledger."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """Where a stored entry is (the caller reads its bytes)."""

    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class DeleteLedgers:
    """Forget ledgers for good (their stored entries become garbage)."""

    ledger_ids: tuple[int, ...]


Request = AddRequest | Fence | WriteLac | ReadLac | ReadEntry | DeleteLedgers


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request did. `error`: its refusal (then nothing changed and nothing is to be
    written), None when done. `records`: journal records to make durable before answering, one
    record each. `lac`: the answer of Fence and ReadLac; `location`: of ReadEntry. `stored`: an
    accepted add's entry, for `LedgerRules.stored` once its record is durable (None when there is
    nothing to store: refused, or stored here already). `woken`: ledgers whose LAC rose or that
    were deleted: their LAC waiters must look again."""

    error: BookieError | None = None
    records: list[bytes] = field(default_factory=list)
    lac: int | None = None
    location: Location | None = None
    stored: Admitted | None = None
    woken: tuple[int, ...] = ()


# What `admit_adds` decided: one outcome per add (None: accepted, or stored here already), how many
# journal records it appended (an ADD record may take two chunks) and the ledgers whose LAC the
# accepted adds' LAC fields raised (wake their waiters). A plain tuple: a NamedTuple costs more than
# the rest of a one-add batch's bookkeeping.
Admission = tuple[list[BookieError | None], int, list[int]]


# --- the rules ------------------------------------------------------------------------------

class LedgerRules:
    """One bookie's ledger rules over its Index. One caller at a time (the bookie's event loop);
    the Index's copy-on-write snapshots (checkpoints) are respected: states are fetched for writing
    through Index.state_for_write / writable_state, never kept across calls."""

    def __init__(self, index: Index, max_entry_bytes: int = MAX_ENTRY_BYTES_LIMIT) -> None:
        self.index = index
        self.max_entry_bytes = max_entry_bytes
        # Why adds are refused (the disk is full), or None: the edge measures the disk and sets it.
        self.read_only: str | None = None

    def step(self, request: Request) -> Outcome:
        """Decide one request: change the state and return the outcome with its journal records."""
        try:
            match request:
                case AddRequest(ledger_id, entry_id, master_key, data, recovery):
                    return self._add(ledger_id, entry_id, master_key, data, recovery)
                case Fence(ledger_id, master_key):
                    return self._fence(ledger_id, master_key)
                case WriteLac(ledger_id, lac, master_key):
                    return self._write_lac(ledger_id, lac, master_key)
                case ReadLac(ledger_id):
                    return Outcome(lac=self.lac(ledger_id))
                case ReadEntry(ledger_id, entry_id):
                    return Outcome(location=self.locate(ledger_id, entry_id))
                case DeleteLedgers(ledger_ids):
                    return self._delete(ledger_ids)
        except BookieError as error:
            return Outcome(error=error)
        raise TypeError(f"not a bookie request: {request!r}")

    # --- adds -----------------------------------------------------------------------------------

    def _add(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool) -> Outcome:
        records: list[bytes] = []
        admitted: list[Admitted] = []
        error = self._admit(ledger_id, entry_id, master_key, data, recovery, records, admitted)
        if error is not None:
            return Outcome(error=error)
        if admitted:  # the ADD record's two chunks, as one record
            records[-2:] = [records[-2] + records[-1]]
        return Outcome(records=records, stored=admitted[0] if admitted else None,
                       woken=tuple(self._told_lacs(admitted, 0)))

    def _admit(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool,
               journal: list[bytes], admitted: list[Admitted]) -> BookieError | None:
        """The one-add rule: its refusal, or None with its records appended to `journal` (KEY first
        if it binds the key; the ADD record as two chunks, header and entry, as admit_adds writes it;
        no ADD if the entry is stored here already) and the entry to `admitted`."""
        if self.read_only is not None:
            return BookieReadOnly(self.read_only)
        if len(data) > self.max_entry_bytes:
            return EntryTooLarge(f"entry of {len(data)} bytes exceeds max_entry_bytes {self.max_entry_bytes}")
        try:
            header = parse_header(data)
        except EntryFormatError as err:
            return BadRequest(f"ledger {ledger_id} entry {entry_id}: {err}")
        if (header.ledger_id, header.entry_id) != (ledger_id, entry_id):
            return BadRequest(f"request for ledger {ledger_id} entry {entry_id} carries an entry of "
                              f"ledger {header.ledger_id} entry {header.entry_id}")
        try:
            state = self._bind(ledger_id, master_key, journal)
        except BookieError as err:
            return err
        if state.fenced and not recovery:
            return LedgerFenced(f"ledger {ledger_id} is fenced on this bookie: a recoverer took it over")
        if state.entries.get(entry_id) is not None:
            return None  # already stored and durable (stored() comes only after its record is)
        journal += _add_record(ledger_id, entry_id, data)
        admitted.append((ledger_id, entry_id, data, header.lac))
        return None

    def admit_adds(self, adds: list[AddFields], journal: list[bytes], admitted: list[Admitted]) -> Admission:
        """Decide a socket read's worth of adds, as step(AddRequest) would one by one: appends the
        accepted adds' journal records to `journal` (an ADD record as two chunks: header, entry) and
        the adds to `admitted`; returns the Admission. The hot path: the common add (a bound,
        unfenced ledger, its key, a sound header) costs no object of its own; any other goes to the
        one-add rule (`_admit`)."""
        if self.read_only is not None:
            return self._refuse_all(adds), 0, []
        start, chunks = len(admitted), len(journal)  # every ADD record takes two chunks, a KEY one
        results: list[BookieError | None] = []
        ledgers, deleted, max_entry_bytes = self.index.ledgers, self.index.deleted, self.max_entry_bytes
        last_ledger = last_key = state = None
        for add in adds:
            ledger_id, entry_id, key, data, recovery = add
            n = len(data)
            if n < HEADER_BYTES or n > max_entry_bytes:
                results.append(self._admit(*add, journal, admitted))
                continue
            h_ledger, h_entry, lac, _, digest_type = HEADER.unpack_from(data)
            size = _DIGEST_BYTES.get(digest_type)
            if (size is None or n < HEADER_BYTES + size or h_ledger != ledger_id or h_entry != entry_id
                    or entry_id > MAX_ID or ledger_id > MAX_ID or not -1 <= lac < entry_id):
                results.append(self._admit(*add, journal, admitted))
                continue
            if ledger_id != last_ledger or not hmac.compare_digest(key, last_key):
                state = ledgers.get(ledger_id)
                if (state is None or state.master_key is None or len(key) != len(state.master_key)
                        or not hmac.compare_digest(state.master_key, key) or ledger_id in deleted):
                    last_ledger = None  # unbound, deleted or another key: the one-add rule binds or refuses
                    results.append(self._admit(*add, journal, admitted))
                    continue
                last_ledger, last_key = ledger_id, key
            if state.fenced and not recovery:
                results.append(self._admit(*add, journal, admitted))
                continue
            results.append(None)
            if state.entries.get(entry_id) is not None:
                continue  # already stored and durable
            head = _ADD_KIND + _IDS.pack(ledger_id, entry_id)
            journal.append(_FRAME.pack(_MIN_ADD_BODY + n, crc32c(data, crc32c(head))) + head)
            journal.append(data)
            admitted.append((ledger_id, entry_id, data, lac))
        adds_written = len(admitted) - start
        return results, len(journal) - chunks - adds_written, self._told_lacs(admitted, start)

    def _refuse_all(self, adds: list[AddFields]) -> list[BookieError | None]:
        """While read-only: every add's refusal (the one-add rule, so that they read the same)."""
        return [self._admit(*add, [], []) for add in adds]

    def _told_lacs(self, admitted: list[Admitted], start: int) -> list[int]:
        """Raise the explicit LACs to the accepted adds' LAC fields (admitted[start:]); the ledgers
        whose LAC rose. A tailing reader's long poll answers as soon as the next add arrives (a writer
        appending back to back sends no explicit LAC). Lost in a crash, they only lower this bookie's
        LAC to what its stored entries carry."""
        woken: list[int] = []
        if start == len(admitted):
            return woken
        ledger_id, _, _, lac = admitted[start]
        for entry in admitted[start + 1:]:
            if entry[0] != ledger_id:
                if self._raise_explicit_lac(ledger_id, lac):
                    woken.append(ledger_id)
                ledger_id, lac = entry[0], entry[3]
            elif entry[3] > lac:
                lac = entry[3]
        if self._raise_explicit_lac(ledger_id, lac):
            woken.append(ledger_id)
        return woken

    def stored(self, entries: list[Admitted], positions: list[int]) -> set[int]:
        """The accepted adds' records are durable and their entries are at these packed positions
        (index.pack_position): readable from now on, their LAC fields counted. Returns the ledgers
        touched (their LAC waiters look again); a ledger deleted meanwhile is skipped."""
        return self.index.put_many(entries, positions)

    # --- fences, explicit LACs, deletions ---------------------------------------------------------

    def _fence(self, ledger_id: int, master_key: bytes) -> Outcome:
        records: list[bytes] = []
        state = self._bind(ledger_id, master_key, records)
        if not state.fenced:  # fenced already: nothing new to write (its FENCE record went before)
            state.fenced = True
            records.append(encode_journal_record(JournalRecord(Kind.FENCE, ledger_id)))
        return Outcome(records=records, lac=state.lac)

    def _write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Outcome:
        if not -1 <= lac <= MAX_ID:
            raise BadRequest(f"LAC {lac} is not an entry id or -1")
        records: list[bytes] = []
        self._bind(ledger_id, master_key, records)
        records.append(encode_journal_record(JournalRecord(Kind.LAC, ledger_id, lac)))
        return Outcome(records=records, woken=(ledger_id,) if self._raise_explicit_lac(ledger_id, lac) else ())

    def _raise_explicit_lac(self, ledger_id: int, lac: int) -> bool:
        """Raise the ledger's explicit LAC to `lac`; whether its LAC rose."""
        state = self.index.state(ledger_id)
        if state is None or lac <= state.explicit_lac:
            return False
        raised = lac > state.lac
        self.index.writable_state(ledger_id).explicit_lac = lac
        return raised

    def _delete(self, ledger_ids: Iterable[int]) -> Outcome:
        ids = list(ledger_ids)
        for ledger_id in ids:  # all checked before any is deleted: a bad request changes nothing
            _check_id(ledger_id, "ledger")
        records: list[bytes] = []
        woken: list[int] = []
        for ledger_id in ids:
            if ledger_id in self.index.deleted:
                continue
            self.index.delete(ledger_id)
            records.append(encode_journal_record(JournalRecord(Kind.DELETE, ledger_id)))
            woken.append(ledger_id)
        return Outcome(records=records, woken=tuple(woken))

    def _bind(self, ledger_id: int, master_key: bytes, records: list[bytes]) -> LedgerState:
        """The ledger's state for writing, bound to `master_key` if unbound (its KEY record joins
        `records`); raises BadRequest, NoSuchLedger (deleted here) or Unauthorized, changing nothing."""
        _check_id(ledger_id, "ledger")
        if len(master_key) != MASTER_KEY_BYTES:
            raise BadRequest(f"master key must be {MASTER_KEY_BYTES} bytes, got {len(master_key)}")
        if ledger_id in self.index.deleted:
            raise NoSuchLedger(f"ledger {ledger_id} was deleted from this bookie")
        state = self.index.state_for_write(ledger_id)
        if state.master_key is None:
            state.master_key = bytes(master_key)
            records.append(encode_journal_record(JournalRecord(Kind.KEY, ledger_id, 0, state.master_key)))
        elif not hmac.compare_digest(state.master_key, master_key):
            raise Unauthorized(f"ledger {ledger_id} is bound to another master key: wrong password")
        return state

    # --- queries (no records) ---------------------------------------------------------------------

    def lac(self, ledger_id: int) -> int:
        """max(highest LAC field of its stored entries, explicit LAC), NO_ENTRY if neither. Raises
        NoSuchLedger if the ledger is unknown or deleted here."""
        return self._state(ledger_id).lac

    def last_entry(self, ledger_id: int) -> int:
        """The highest entry id stored here (NO_ENTRY if none). Raises NoSuchLedger."""
        return self._state(ledger_id).last_entry

    def locate(self, ledger_id: int, entry_id: int) -> Location:
        """Where the stored entry's record is. Raises NoSuchLedger, or NoSuchEntry when this bookie
        holds the ledger but not the entry (not stored yet counts as not here)."""
        self._state(ledger_id)
        where = self.index.get(ledger_id, entry_id)
        if where is None:
            raise NoSuchEntry(f"ledger {ledger_id} entry {entry_id} is not stored on this bookie")
        return where

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced here (False if unknown)."""
        state = self.index.state(ledger_id)
        return state is not None and state.fenced

    def is_bound(self, ledger_id: int) -> bool:
        """Whether the ledger is bound to a master key here: a request with its key binds nothing."""
        state = self.index.state(ledger_id)
        return state is not None and state.master_key is not None

    def lac_passed(self, ledger_id: int, beyond: int) -> bool:
        """Whether a long poll for a LAC greater than `beyond` may answer: it is, or the ledger was
        deleted here (the waiter must learn that too)."""
        if ledger_id in self.index.deleted:
            return True
        state = self.index.state(ledger_id)
        return state is not None and state.lac > beyond

    def ledgers(self) -> list[int]:
        """Ids of the ledgers this bookie holds state for (not deleted ones), ascending."""
        return sorted(self.index.ledgers)

    def _state(self, ledger_id: int) -> LedgerState:
        state = self.index.state(ledger_id)
        if state is None:
            if ledger_id in self.index.deleted:
                raise NoSuchLedger(f"ledger {ledger_id} was deleted from this bookie")
            raise NoSuchLedger(f"ledger {ledger_id} is not on this bookie")
        return state

    # --- the journal read back ----------------------------------------------------------------------

    def replay(self, record: JournalRecord) -> None:
        """Give a KEY, FENCE, LAC or DELETE record read back on open its effect. Idempotent over a
        state that already holds it (a checkpoint image taken after the change was decided): the
        first key stays, the LAC only rises. ADD records carry entries: see `needs_entry`."""
        if record.kind is Kind.ADD:
            raise ValueError("an ADD record is replayed by storing its entry (needs_entry, then the index)")
        if record.kind is Kind.DELETE:
            self.index.delete(record.ledger_id)
            return
        if record.ledger_id in self.index.deleted:
            return
        state = self.index.state_for_write(record.ledger_id)
        if record.kind is Kind.KEY:
            state.master_key = state.master_key or record.data
        elif record.kind is Kind.FENCE:
            state.fenced = True
        elif record.kind is Kind.LAC:
            state.explicit_lac = max(state.explicit_lac, record.value)

    def needs_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Whether a replayed ADD's entry must be stored again: its ledger is not deleted and the
        entry is not indexed (the checkpoint image predates it)."""
        return ledger_id not in self.index.deleted and self.index.get(ledger_id, entry_id) is None


def _add_record(ledger_id: int, entry_id: int, data: bytes) -> tuple[bytes, bytes]:
    """An ADD journal record as two chunks, the frame and ids then the entry: the bytes of
    storage_codec.encode_journal_record without copying the entry (admit_adds inlines it)."""
    head = _ADD_KIND + _IDS.pack(ledger_id, entry_id)
    return _FRAME.pack(_MIN_ADD_BODY + len(data), crc32c(data, crc32c(head))) + head, data


def _check_id(value: int, what: str) -> None:
    if not 0 <= value <= MAX_ID:
        raise BadRequest(f"{what} id {value} is not in 0..2**63-1")
