"""The bookie's ledger rules (bookie/ledger_rules.py), pure: no files, no trio.

Each rule by example, with the exact journal records it hands back; then hypothesis: for random
sequences of add batches, fences, explicit LACs, deletions, stores, snapshots and read-only
spells, with random keys, recovery flags and malformed entries, the hot path `admit_adds` and
the one-add rule (`step` per add) give the same outcomes, the same journal bytes and the same
state; and replaying the journal those records make onto an empty index gives back what is
durable (keys, fences, deletions, entries), with a LAC never above the live one.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie.entry import NO_ENTRY, Digester, DigestType
from bookie.errors import (BadRequest, BookieReadOnly, EntryTooLarge, LedgerFenced, NoSuchEntry, NoSuchLedger,
                           Unauthorized)
from bookie.index import Index, Location, pack_position
from bookie.ledger_rules import (AddRequest, DeleteLedgers, Fence, LedgerRules, Outcome, ReadEntry, ReadLac,
                                 WriteLac)
from bookie.storage_codec import JournalRecord, Kind, encode_journal_record, scan_journal

SOAK = os.environ.get("QUIRE_SOAK") == "1"
FUZZ = settings(max_examples=2000 if SOAK else 200, derandomize=not SOAK, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DIGESTER = Digester(DigestType.CRC32C, b"rules")
KEY, OTHER = b"k" * 32, b"o" * 32


def entry(ledger_id: int, entry_id: int, lac: int = NO_ENTRY, payload: bytes = b"payload") -> bytes:
    return DIGESTER.package(ledger_id, entry_id, lac, len(payload), payload)


def add(rules: LedgerRules, ledger_id: int, entry_id: int, *, key: bytes = KEY, lac: int = NO_ENTRY,
        recovery: bool = False) -> Outcome:
    return rules.step(AddRequest(ledger_id, entry_id, key, entry(ledger_id, entry_id, lac), recovery))


def record(kind: Kind, ledger_id: int, value: int = 0, data: bytes = b"") -> bytes:
    return encode_journal_record(JournalRecord(kind, ledger_id, value, data))


def store(rules: LedgerRules, outcomes: list[Outcome]) -> None:
    """What the edge does once the records are durable."""
    entries = [o.stored for o in outcomes if o.stored is not None]
    rules.stored(entries, [pack_position(1, 20 + i) for i in range(len(entries))])


# --- each rule, by example ---------------------------------------------------------------------


def test_the_first_key_binds_the_ledger_and_another_is_refused():
    rules = LedgerRules(Index())
    first = add(rules, 1, 0)
    assert first.error is None
    assert first.records == [record(Kind.KEY, 1, 0, KEY), record(Kind.ADD, 1, 0, entry(1, 0))]
    assert first.stored == (1, 0, entry(1, 0), NO_ENTRY)
    assert add(rules, 1, 1).records == [record(Kind.ADD, 1, 1, entry(1, 1))]
    for request in (AddRequest(1, 2, OTHER, entry(1, 2)), Fence(1, OTHER), WriteLac(1, 0, OTHER)):
        refused = rules.step(request)
        assert isinstance(refused.error, Unauthorized) and refused.records == [] and refused.stored is None
    assert rules.index.state(1).master_key == KEY


def test_a_key_of_the_wrong_size_is_a_bad_request_and_binds_nothing():
    rules = LedgerRules(Index())
    assert isinstance(add(rules, 1, 0, key=b"short").error, BadRequest)
    assert isinstance(rules.step(Fence(1, b"k" * 33)).error, BadRequest)
    assert not rules.is_bound(1) and rules.index.state(1) is None


def test_a_fence_binds_an_unseen_ledger_and_refuses_later_adds_except_recovery_adds():
    rules = LedgerRules(Index())
    fenced = rules.step(Fence(7, KEY))
    assert fenced.error is None and fenced.lac == NO_ENTRY
    assert fenced.records == [record(Kind.KEY, 7, 0, KEY), record(Kind.FENCE, 7)]
    assert rules.is_fenced(7)
    assert isinstance(add(rules, 7, 0).error, LedgerFenced)
    recovered = add(rules, 7, 0, recovery=True)
    assert recovered.error is None and recovered.records == [record(Kind.ADD, 7, 0, entry(7, 0))]


def test_fencing_a_fenced_ledger_writes_nothing_and_answers_its_lac():
    rules = LedgerRules(Index())
    store(rules, [add(rules, 1, 0), add(rules, 1, 1, lac=0)])
    assert rules.step(Fence(1, KEY)).records == [record(Kind.FENCE, 1)]
    again = rules.step(Fence(1, KEY))
    assert (again.error, again.records, again.lac) == (None, [], 0)


def test_the_lac_is_the_highest_of_the_stored_lac_fields_and_the_explicit_lac_and_never_goes_down():
    rules = LedgerRules(Index())
    assert isinstance(rules.step(ReadLac(1)).error, NoSuchLedger)
    first = add(rules, 1, 5, lac=3)
    assert first.woken == (1,) and rules.lac(1) == 3, "an accepted add's LAC field counts at once"
    lower = rules.step(WriteLac(1, 2, KEY))
    assert lower.records == [record(Kind.LAC, 1, 2)] and lower.woken == () and rules.lac(1) == 3
    higher = rules.step(WriteLac(1, 4, KEY))
    assert higher.woken == (1,) and rules.step(ReadLac(1)).lac == 4
    store(rules, [first])
    state = rules.index.state(1)
    assert (state.max_lac, state.explicit_lac, state.last_entry, rules.lac(1)) == (3, 4, 5, 4)
    assert isinstance(rules.step(WriteLac(1, -2, KEY)).error, BadRequest)
    assert isinstance(rules.step(WriteLac(1, 2**63, KEY)).error, BadRequest)


def test_an_explicit_lac_binds_an_unseen_ledger_with_its_key_record_first():
    rules = LedgerRules(Index())
    out = rules.step(WriteLac(3, 9, KEY))
    assert out.records == [record(Kind.KEY, 3, 0, KEY), record(Kind.LAC, 3, 9)] and rules.lac(3) == 9


def test_an_entry_is_readable_only_once_stored_and_readding_it_writes_nothing():
    rules = LedgerRules(Index())
    out = add(rules, 1, 0)
    assert isinstance(rules.step(ReadEntry(1, 0)).error, NoSuchEntry)
    assert isinstance(rules.step(ReadEntry(2, 0)).error, NoSuchLedger)
    rules.stored([out.stored], [pack_position(3, 40)])
    assert rules.step(ReadEntry(1, 0)).location == Location(3, 40, len(entry(1, 0)))
    again = add(rules, 1, 0, recovery=True)
    assert (again.error, again.records, again.stored, again.woken) == (None, [], None, ())


def test_a_deleted_ledger_refuses_everything_and_is_deleted_once():
    rules = LedgerRules(Index())
    store(rules, [add(rules, 1, 0)])
    out = rules.step(DeleteLedgers((1, 1, 2)))
    assert out.records == [record(Kind.DELETE, 1), record(Kind.DELETE, 2)] and out.woken == (1, 2)
    for request in (AddRequest(1, 1, KEY, entry(1, 1)), Fence(1, KEY), WriteLac(1, 0, KEY), ReadLac(1),
                    ReadEntry(1, 0)):
        assert isinstance(rules.step(request).error, NoSuchLedger), request
    assert rules.step(DeleteLedgers((1,))).records == []
    assert rules.lac_passed(1, 10**6), "a long poll must learn that its ledger is gone"
    assert rules.ledgers() == []


def test_a_deletion_with_a_bad_id_deletes_nothing():
    rules = LedgerRules(Index())
    add(rules, 1, 0)
    assert isinstance(rules.step(DeleteLedgers((1, -1))).error, BadRequest)
    assert rules.ledgers() == [1] and not rules.index.deleted


def test_a_full_disk_refuses_adds_but_serves_fences_and_lacs():
    rules = LedgerRules(Index())
    rules.read_only = "disk full"
    refused = add(rules, 1, 0)
    assert isinstance(refused.error, BookieReadOnly) and str(refused.error) == "disk full"
    assert rules.admit_adds([(1, 0, KEY, entry(1, 0), False)], [], [])[0][0].args == ("disk full",)
    assert rules.step(Fence(1, KEY)).error is None and rules.step(WriteLac(1, 0, KEY)).error is None
    rules.read_only = None
    assert add(rules, 1, 0, recovery=True).error is None


@pytest.mark.parametrize("data, error", [
    (entry(1, 0)[:20], BadRequest),                      # shorter than its header
    (entry(2, 0), BadRequest),                           # another ledger's entry
    (entry(1, 1), BadRequest),                           # another entry id
    (entry(1, 0, payload=b"x" * 300), EntryTooLarge),
])
def test_malformed_and_oversized_entries_are_refused(data, error):
    rules = LedgerRules(Index(), max_entry_bytes=200)
    out = rules.step(AddRequest(1, 0, KEY, data))
    assert isinstance(out.error, error) and out.records == [] and rules.index.state(1) is None


def test_a_journal_record_read_back_means_what_it_said():
    rules = LedgerRules(Index())
    for rec in (JournalRecord(Kind.KEY, 1, 0, KEY), JournalRecord(Kind.KEY, 1, 0, OTHER),
                JournalRecord(Kind.LAC, 1, 4), JournalRecord(Kind.LAC, 1, 2), JournalRecord(Kind.FENCE, 1),
                JournalRecord(Kind.FENCE, 2), JournalRecord(Kind.DELETE, 2), JournalRecord(Kind.LAC, 2, 9)):
        rules.replay(rec)
    state = rules.index.state(1)
    assert (state.master_key, state.explicit_lac, state.fenced) == (KEY, 4, True), "the first key stays"
    assert rules.index.state(2) is None and 2 in rules.index.deleted
    assert rules.needs_entry(1, 0) and not rules.needs_entry(2, 0)
    with pytest.raises(ValueError):
        rules.replay(JournalRecord(Kind.ADD, 1, 0, entry(1, 0)))


def test_the_hot_path_counts_records_and_wakes_each_raised_ledger():
    rules = LedgerRules(Index())
    journal: list[bytes] = []
    admitted: list = []
    adds = [(1, 0, KEY, entry(1, 0), False), (1, 1, KEY, entry(1, 1, 0), False), (2, 0, KEY, entry(2, 0), False)]
    outcomes, record_count, woken = rules.admit_adds(adds, journal, admitted)
    assert outcomes == [None] * 3 and woken == [1]
    assert record_count == 5 == len(scan_journal(b"".join(journal)).records)  # two KEYs, three ADDs


# --- the hot path against the one-add rule (hypothesis) ----------------------------------------

LEDGERS = (1, 2, 3)
ledgers = st.sampled_from((1, 1, 1, 2, 3))  # runs of one ledger, as a writer's pipelined adds come
keys = st.sampled_from([KEY] * 6 + [OTHER, b"short"])


@st.composite
def adds(draw) -> tuple:
    ledger_id = draw(ledgers)
    entry_id = draw(st.integers(0, 8))
    lac = draw(st.integers(-1, max(-1, entry_id - 1)))
    data = entry(ledger_id, entry_id, lac, b"p" * draw(st.integers(0, 60)))
    shape = draw(st.sampled_from(["good"] * 10 + ["short", "other ledger", "other entry", "bad lac", "bad digest"]))
    if shape == "short":
        data = data[:draw(st.integers(0, 36))]
    elif shape == "other ledger":
        data = entry(ledger_id + 1, entry_id, lac)
    elif shape == "other entry":
        data = entry(ledger_id, entry_id + 1, lac)
    elif shape == "bad lac":
        data = entry(ledger_id, entry_id, entry_id)
    elif shape == "bad digest":
        data = data[:32] + b"\x09" + data[33:]
    return ledger_id, entry_id, draw(keys), data, draw(st.sampled_from([False, False, True]))


batches = st.tuples(st.just("adds"), st.lists(adds(), min_size=1, max_size=12))
operations = st.lists(st.one_of(
    batches, batches, batches, batches,
    st.tuples(st.just("store")), st.tuples(st.just("store")),
    st.tuples(st.just("fence"), ledgers, keys),
    st.tuples(st.just("lac"), ledgers, st.integers(-1, 10), keys),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(LEDGERS), max_size=2)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("read_only"), st.sampled_from([False, False, True])),
), min_size=1, max_size=40)


def described(error) -> tuple | None:
    return None if error is None else (type(error).__name__, str(error))


def state_of(rules: LedgerRules) -> tuple:
    index = rules.index
    return (sorted(index.deleted), {
        ledger_id: (s.master_key, s.fenced, s.explicit_lac, s.max_lac, s.last_entry, sorted(s.entries.items()))
        for ledger_id, s in index.ledgers.items()})


class Pair:
    """The same bookie twice: adds through admit_adds on one, through step() one by one on the other."""

    def __init__(self) -> None:
        self.fast, self.slow = LedgerRules(Index(), max_entry_bytes=80), LedgerRules(Index(), max_entry_bytes=80)
        self.journal: list[bytes] = []  # the fast side's, in chunks; the slow side's must be the same bytes
        self.slow_records: list[bytes] = []
        self.pending_fast: list = []
        self.pending_slow: list = []
        self.positions = 0

    def adds(self, batch: list) -> None:
        admitted: list = []
        results, record_count, woken = self.fast.admit_adds(batch, self.journal, admitted)
        outcomes = [self.slow.step(AddRequest(*a)) for a in batch]
        assert [described(e) for e in results] == [described(o.error) for o in outcomes]
        records = [r for o in outcomes for r in o.records]
        assert record_count == len(records)
        self.slow_records += records
        assert b"".join(self.journal) == b"".join(self.slow_records)
        assert admitted == [o.stored for o in outcomes if o.stored is not None]
        assert set(woken) == {ledger_id for o in outcomes for ledger_id in o.woken}
        self.pending_fast += admitted
        self.pending_slow += [o.stored for o in outcomes if o.stored is not None]

    def both(self, request) -> None:
        a, b = self.fast.step(request), self.slow.step(request)
        assert (described(a.error), a.records, a.lac, a.woken) == (described(b.error), b.records, b.lac, b.woken)
        self.journal.append(b"".join(a.records))
        self.slow_records += b.records

    def store(self) -> None:
        positions = [pack_position(1, self.positions + i + 1) for i in range(len(self.pending_fast))]
        self.positions += len(positions)
        assert self.fast.stored(self.pending_fast, positions) == self.slow.stored(self.pending_slow, positions)
        self.pending_fast, self.pending_slow = [], []


@FUZZ
@given(operations)
def test_the_hot_path_and_the_one_add_rule_agree_outcome_for_outcome_and_byte_for_byte(ops):
    pair = Pair()
    snapshots = []
    for op in ops:
        match op:
            case ("adds", batch):
                pair.adds(batch)
            case ("fence", ledger_id, key):
                pair.both(Fence(ledger_id, key))
            case ("lac", ledger_id, lac, key):
                pair.both(WriteLac(ledger_id, lac, key))
            case ("delete", ids):
                pair.both(DeleteLedgers(tuple(ids)))
            case ("store",):
                pair.store()
            case ("snapshot",):  # a checkpoint's cut: the states are shared until changed (copy-on-write)
                snapshots.append((pair.fast.index.snapshot(), state_of(pair.fast)))
                pair.slow.index.snapshot()
            case ("read_only", full):
                pair.fast.read_only = pair.slow.read_only = "disk full" if full else None
        assert state_of(pair.fast) == state_of(pair.slow)
    for image, then in snapshots:
        assert state_of(LedgerRules(image)) == then, "a change reached a checkpoint's snapshot"
    pair.store()
    check_replay(pair.fast, b"".join(pair.journal))


def check_replay(live: LedgerRules, journal: bytes) -> None:
    """What a restart rebuilds from the journal alone (no checkpoint): the same keys, fences, deletions
    and entries; a LAC never above the live one (the adds' LAC fields counted before their fsync are
    not journaled, so a crash only lowers it)."""
    scan = scan_journal(journal)
    assert scan.stop is None and scan.end == len(journal)
    rebuilt = LedgerRules(Index())
    for i, rec in enumerate(scan.records):
        if rec.kind is not Kind.ADD:
            rebuilt.replay(rec)
        elif rebuilt.needs_entry(rec.ledger_id, rec.value):
            rebuilt.stored([(rec.ledger_id, rec.value, rec.data, int.from_bytes(rec.data[16:24], "big", signed=True))],
                           [pack_position(2, i + 1)])
    assert sorted(rebuilt.index.deleted) == sorted(live.index.deleted)
    assert sorted(rebuilt.index.ledgers) == sorted(live.index.ledgers)
    for ledger_id, state in live.index.ledgers.items():
        again = rebuilt.index.state(ledger_id)
        assert (again.master_key, again.fenced, again.last_entry) == (state.master_key, state.fenced, state.last_entry)
        assert [e for e, _, _ in again.entries.items()] == [e for e, _, _ in state.entries.items()]
        assert again.lac <= state.lac
