"""AutoRecovery planning (pure): what to copy where, and the under-replication records.

Seed 000, "Recovering/Repair": the auditor marks every ledger with a fragment
on a lost bookie as under-replicated; a replication worker then, for each such
fragment, picks a bookie outside that fragment's ensemble, copies to it every
entry the lost bookie held, and once the copies are durable replaces the lost
bookie in that fragment by a CAS on the ledger metadata. This module decides:

- which fragments need repair (`damaged_fragments`): those whose ensemble holds
  a lost bookie, except the last fragment of a ledger that is not CLOSED: that
  one belongs to its writer (it may still add to it, or change its ensemble),
  and is repaired only after the ledger is fenced and closed (`open_tail_damaged`);
- which entries a lost bookie held (`entries_on`): those whose write quorum
  (quorum.write_quorum: Qw bookies from `entry_id % E`) includes it, and where
  their surviving copies are (`sources`);
- which bookie replaces it (`choose_targets`): writable, not in the ensemble,
  not lost or being drained; this node's own bookie first when eligible
  (BookKeeper's worker replicates to its local bookie), else a random one;
- whether the metadata still describes the fragment that was copied
  (`apply_repair`): if a writer or recoverer changed it meanwhile the copy is
  redone, never recorded against bookies that do not hold it.

Records kept in the metastore (JSON, docs/autorecovery.md): a ReplicationTask per
under-replicated ledger; the auditor widens it, the worker taking it judges its lost
bookies again (`ReplicationTask.rejudged`: one registered again is lost no more). Time
is an input (milliseconds); randomness is a passed-in generator; nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ledger.errors import LedgerError, NotEnoughBookies
from ledger.metadata import LedgerMetadata
from ledger.placement import Rng, choose_replacement
from ledger.quorum import write_quorum, write_set


class Unrepairable(LedgerError):
    """The ledger cannot be re-replicated now (no eligible bookie, every replica of an entry lost,
    no master key in its metadata, ...): reported in its task, retried after a backoff."""


class FragmentChanged(LedgerError):
    """The fragment that was copied is no longer what the metadata says (an ensemble change or a
    close moved its end, or its bookies changed): copy again from the re-read metadata."""


# -- fragments and entries --------------------------------------------------------------------

def fragment_last_entry(metadata: LedgerMetadata, index: int) -> int:
    """The last entry of a fragment that can no longer grow (any fragment but the last of a ledger
    that is not CLOSED); first_entry - 1 when it holds none."""
    end = metadata.fragment_end(index)
    assert end is not None, f"fragment {index} of ledger {metadata.ledger_id} is still open-ended"
    return max(end, metadata.fragments[index].first_entry - 1)


def damaged_fragments(metadata: LedgerMetadata, lost: Iterable[int]) -> list[int]:
    """Indexes of the fragments to repair now: an ensemble with a lost bookie, and a known end."""
    gone = set(lost)
    last = len(metadata.fragments) - 1
    return [i for i, f in enumerate(metadata.fragments)
            if gone.intersection(f.ensemble) and (i < last or metadata.is_closed)]


def open_tail_damaged(metadata: LedgerMetadata, lost: Iterable[int]) -> bool:
    """True if the ledger is not CLOSED and its last fragment has a lost bookie: its writer's, to be
    left alone for a grace period, then fenced and closed before it is repaired."""
    return not metadata.is_closed and bool(set(lost).intersection(metadata.last_fragment.ensemble))


def entries_on(metadata: LedgerMetadata, index: int, bookie: int) -> Iterator[int]:
    """The entries of fragment `index` (which must have a known end) that `bookie` should hold."""
    fragment = metadata.fragments[index]
    if bookie not in fragment.ensemble:
        return
    position, size, qw = fragment.ensemble.index(bookie), metadata.ensemble_size, metadata.write_quorum
    holds = [position in write_set(i, size, qw) for i in range(size)]  # by entry_id % E
    for entry_id in range(fragment.first_entry, fragment_last_entry(metadata, index) + 1):
        if holds[entry_id % size]:
            yield entry_id


def sources(metadata: LedgerMetadata, entry_id: int, excluded: Iterable[int]) -> tuple[int, ...]:
    """The bookies of the entry's write quorum that may serve a copy, in write-set order."""
    out = set(excluded)
    quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
    return tuple(b for b in quorum if b not in out)


def ledger_entry_count(metadata: LedgerMetadata, indexes: Iterable[int], lost: Iterable[int]) -> int:
    """How many entry copies repairing `indexes` makes (for progress reports)."""
    gone = set(lost)
    return sum(sum(1 for _ in entries_on(metadata, i, b))
               for i in indexes for b in metadata.fragments[i].ensemble if b in gone)


# -- targets and the metadata change --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FragmentRepair:
    """One fragment's repair: `replacements` (lost bookie -> new bookie) for the fragment that
    starts at `first_entry` with `ensemble` and ends at `last_entry` (inclusive)."""

    index: int
    first_entry: int
    last_entry: int
    ensemble: tuple[int, ...]
    replacements: tuple[tuple[int, int], ...]

    @property
    def targets(self) -> dict[int, int]:
        return dict(self.replacements)


def choose_targets(ensemble: tuple[int, ...], lost: Iterable[int], writable: Iterable[int],
                   excluded: Iterable[int], rng: Rng, prefer: int | None = None) -> dict[int, int]:
    """{lost bookie: replacement} for the lost members of `ensemble`. Replacements are writable,
    distinct, outside the ensemble and not in `excluded` (lost or being drained); `prefer` (this
    node's bookie) is taken first when eligible. Unrepairable if there are not enough of them."""
    failed = [b for b in ensemble if b in set(lost)]
    eligible = sorted(set(writable) - set(excluded) - set(ensemble))
    chosen: dict[int, int] = {}
    if prefer is not None and prefer in eligible and failed:
        chosen[failed.pop(0)] = prefer
        eligible.remove(prefer)
    try:
        chosen.update(choose_replacement(eligible, ensemble, failed, rng) if failed else {})
    except NotEnoughBookies:
        raise Unrepairable(f"not enough bookies: {len(failed) + len(chosen)} of ensemble {list(ensemble)} need a "
                           f"replacement outside it, eligible: {sorted(set(eligible) | set(chosen.values()))}; "
                           "start more bookies (or fewer decommissions)") from None
    return chosen


def plan_fragment(metadata: LedgerMetadata, index: int, lost: Iterable[int], writable: Iterable[int],
                  excluded: Iterable[int], rng: Rng, prefer: int | None = None) -> FragmentRepair:
    """The repair of fragment `index` (one of damaged_fragments)."""
    fragment = metadata.fragments[index]
    targets = choose_targets(fragment.ensemble, lost, writable, excluded, rng, prefer)
    return FragmentRepair(index, fragment.first_entry, fragment_last_entry(metadata, index), fragment.ensemble,
                          tuple(sorted(targets.items())))


def apply_repair(current: LedgerMetadata, repair: FragmentRepair) -> LedgerMetadata:
    """`current` with the repair's replacements, if its fragment is still the one copied: same first
    entry, same bookies, same last entry. FragmentChanged otherwise (copy again)."""
    index = next((i for i, f in enumerate(current.fragments) if f.first_entry == repair.first_entry), None)
    if index is None or current.fragments[index].ensemble != repair.ensemble:
        raise FragmentChanged(f"ledger {current.ledger_id}: the fragment from entry {repair.first_entry} "
                              f"changed (was on {list(repair.ensemble)})")
    end = current.fragment_end(index)
    if end is None or max(end, repair.first_entry - 1) != repair.last_entry:
        raise FragmentChanged(f"ledger {current.ledger_id}: the fragment from entry {repair.first_entry} now ends "
                              f"at {end}, not {repair.last_entry}")
    repaired = current
    for old, new in repair.replacements:
        repaired = repaired.replace_bookie(index, old, new)
    return repaired


# -- the periodic replica check -------------------------------------------------------------------

def replica_checks(metadata: LedgerMetadata, skip: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(entry id, bookie) for every stored copy a CLOSED ledger should have, skipping the bookies in
    `skip` (already known lost): the auditor reads each to find missing or corrupt replicas."""
    assert metadata.is_closed and metadata.last_entry is not None
    gone = set(skip)
    for entry_id in range(metadata.last_entry + 1):
        for bookie in write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum):
            if bookie not in gone:
                yield entry_id, bookie


# -- the task record ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReplicationTask:
    """An under-replicated ledger (znode data under /quire/underreplicated/<ledger id>).

    `lost`: bookies whose replicas are gone (or being drained): replaced in every fragment; the
    auditor only widens it, the worker that takes the task drops those registered again (`rejudged`).
    `damaged`: live bookies of the ensembles missing some replicas (found by the replica check):
    their missing entries are copied back to them, the metadata is unchanged.
    `attempts`, `error`, `next_attempt_ms`: the last failed repair and when to try again."""

    ledger_id: int
    lost: frozenset[int]
    since_ms: int
    damaged: frozenset[int] = frozenset()
    attempts: int = 0
    error: str | None = None
    next_attempt_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"ledger_id": self.ledger_id, "lost": sorted(self.lost), "since_ms": self.since_ms,
                           "damaged": sorted(self.damaged), "attempts": self.attempts, "error": self.error,
                           "next_attempt_ms": self.next_attempt_ms, **self.extra}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ReplicationTask:
        """Parse a task; ValueError names what is wrong."""
        try:
            raw = json.loads(data)
            known = ("ledger_id", "lost", "since_ms", "damaged", "attempts", "error", "next_attempt_ms")
            return cls(int(raw["ledger_id"]), frozenset(int(b) for b in raw["lost"]), int(raw["since_ms"]),
                       frozenset(int(b) for b in raw.get("damaged", ())), int(raw.get("attempts", 0)),
                       raw.get("error"), int(raw.get("next_attempt_ms", 0)),
                       {k: v for k, v in raw.items() if k not in known})
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not an under-replication task: {(data or b'')[:200]!r} ({e})") from None

    def covers(self, lost: Iterable[int], damaged: Iterable[int] = ()) -> bool:
        return self.lost.issuperset(lost) and (self.damaged | self.lost).issuperset(damaged)

    def merged(self, lost: Iterable[int], damaged: Iterable[int] = ()) -> ReplicationTask:
        """The same task, with more bookies to repair; a pending backoff is dropped (new work)."""
        return replace(self, lost=self.lost | frozenset(lost), damaged=self.damaged | frozenset(damaged),
                       next_attempt_ms=0)

    def rejudged(self, registered: Iterable[int], draining: Iterable[int] = ()) -> ReplicationTask:
        """The task as a worker takes it: its lost bookies judged again, as BookKeeper's
        ReplicationWorker checks a ledger's fragments when it takes it rather than trusting the mark.
        A lost bookie registered again (available or read-only) came back with its disks (its cookie
        says so): it is lost no more, may be read from and need not be replaced. One still
        unregistered, or being drained (registered read-only on purpose), stays lost. A task left
        with no lost bookie in the ledger's fragments and nothing `damaged` to refill is finished."""
        back = self.lost & (frozenset(registered) - frozenset(draining))
        return replace(self, lost=self.lost - back) if back else self

    def failed(self, error: str, now_ms: int, base_ms: int, max_ms: int) -> ReplicationTask:
        """After an unsuccessful repair: the error, and the next attempt after an exponential backoff."""
        delay = min(max_ms, base_ms * 2 ** min(self.attempts, 20))
        return replace(self, attempts=self.attempts + 1, error=error, next_attempt_ms=now_ms + delay)

    def due(self, now_ms: int) -> bool:
        return now_ms >= self.next_attempt_ms


# -- the auditor's view of bookies -----------------------------------------------------------------

class LossTracker:
    """Which known bookies have been unregistered for longer than `grace_ms` (lost for good).

    A bookie that registers again within the grace period is forgotten: it causes no copying."""

    def __init__(self, grace_ms: int) -> None:
        self.grace_ms = grace_ms
        self.missing_since: dict[int, int] = {}

    def observe(self, known: Iterable[int], registered: Iterable[int], now_ms: int) -> None:
        """Known bookies (those with a cookie, or in some ensemble) and the registered ones, at now_ms."""
        present = set(registered)
        missing = set(known) - present
        for bookie in list(self.missing_since):
            if bookie not in missing:
                del self.missing_since[bookie]
        for bookie in missing:
            self.missing_since.setdefault(bookie, now_ms)

    def lost(self, now_ms: int) -> frozenset[int]:
        return frozenset(b for b, since in self.missing_since.items() if now_ms - since >= self.grace_ms)

    def next_deadline_ms(self) -> int | None:
        """When the next missing bookie would count as lost (None: nobody is missing)."""
        pending = [since + self.grace_ms for since in self.missing_since.values()]
        return min(pending) if pending else None


def ledgers_to_mark(ledgers: Iterable[LedgerMetadata], lost: Iterable[int]) -> dict[int, frozenset[int]]:
    """{ledger id: its lost bookies} for every ledger with a fragment on a lost bookie."""
    gone = frozenset(lost)
    return {m.ledger_id: m.bookies & gone for m in ledgers if m.bookies & gone}


__all__ = ["FragmentChanged", "FragmentRepair", "LossTracker", "ReplicationTask", "Unrepairable",
           "apply_repair", "choose_targets", "damaged_fragments", "entries_on", "fragment_last_entry",
           "ledger_entry_count", "ledgers_to_mark", "open_tail_damaged", "plan_fragment", "replica_checks", "sources"]
