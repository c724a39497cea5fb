"""Named logs for the log verifier (replay/verify_logs.py): pure functions over trees, entry
bytes and the summaries of record sets.

Every znode goes through stream/'s own decoders (LogMetadata, Segment, Position) and every entry
through the bookie's (bookie/entry.py) and the record-set codec (stream/record_set.py). The
checks take, per segment ledger, one summary per entry (what its record set says), so that the
Spark side ships a few numbers per entry, not the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.metadata import LedgerMetadata
from metastore.core.tree import DataTree
from replay.znode_data import record_bytes
from stream.errors import StreamError
from stream.log_metadata import LogMetadata, LogPaths
from stream.position import HEAD, Position
from stream.record_set import decode
from stream.segment import Segment

SEGMENTS, RECORDS, TRUNCATION, SUBSCRIPTIONS = "LogSegments", "LogRecords", "LogTruncation", "LogSubscriptions"


@dataclass
class LogView:
    """One log as the metastore holds it at the end of the committed history."""
    name: str
    log: LogMetadata
    segments: list[Segment]
    subscriptions: dict[str, Position] = field(default_factory=dict)


@dataclass(frozen=True)
class EntrySummary:
    """What one entry's record set says: its records before it in the segment, its count, first
    and last txid, the payload bytes before it and its own, and whether its txids increase."""
    records_before: int
    count: int
    first_txid: int
    last_txid: int
    bytes_before: int
    payload_bytes: int
    increasing: bool


def logs_in(tree: DataTree, root: str) -> tuple[list[LogView], list[str]]:
    """Every log under `root` and the znodes that do not decode."""
    logs: list[LogView] = []
    broken: list[str] = []
    if tree.node(root) is None:
        return logs, broken
    for name in tree.children(root):
        p = LogPaths(root, name)
        try:
            metadata = LogMetadata.decode(record_bytes(tree, p.log), f"log {name!r}")
            segments = []
            for child in tree.children(p.segments) if tree.node(p.segments) else []:
                if p.seq_of(child) is not None:
                    segments.append(Segment.decode(record_bytes(tree, p.segment(p.seq_of(child))), f"{name} {child}"))
            subscriptions = {}
            for sub in tree.children(p.subscribers) if tree.node(p.subscribers) else []:
                raw = record_bytes(tree, p.subscriber(sub)).decode("ascii", "replace")
                subscriptions[sub] = Position.parse(raw)
        except (StreamError, ValueError, KeyError) as e:
            broken.append(f"log {name}: {e}")
            continue
        logs.append(LogView(name, metadata, sorted(segments, key=lambda s: s.seq), subscriptions))
    return logs, broken


def summarize(payload: bytes) -> EntrySummary | None:
    """The summary of an entry's record set (its payload, digest checked); None if it is no
    record set (LogRecords then finds the entry missing)."""
    try:
        record_set = decode(payload)
    except (StreamError, ValueError):
        return None
    txids = record_set.txids
    return EntrySummary(record_set.records_before, record_set.count, txids[0], txids[-1], record_set.bytes_before,
                        record_set.payload_bytes, all(a < b for a, b in zip(txids, txids[1:])))


@dataclass
class LogFindings:
    """Violations per check, and how many things each check looked at."""
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in (SEGMENTS, RECORDS,
                                                                                          TRUNCATION, SUBSCRIPTIONS)})
    checked: dict[str, int] = field(default_factory=lambda: {c: 0 for c in (SEGMENTS, RECORDS, TRUNCATION,
                                                                              SUBSCRIPTIONS)})
    records: int = 0


def check_log(view: LogView, summaries: dict[tuple[int, int], EntrySummary], lacs: dict[int, int],
              ledgers: dict[int, LedgerMetadata], found: LogFindings) -> None:
    """Segments contiguous and each on its own ledger; each completed segment's entries 0..last
    chain their counts to its totals, first and last txid; txids strictly increase along the
    log; the truncation point and subscriptions at positions the log has."""
    v = found.violations
    name, segs = view.name, view.segments
    found.checked[SEGMENTS] += len(segs)
    seqs = [s.seq for s in segs]
    if seqs != sorted(set(seqs)) or (seqs and seqs[-1] >= view.log.next_segment):
        v[SEGMENTS].append(f"log {name}: segment numbers {seqs} (next {view.log.next_segment})")
    if len({s.ledger_id for s in segs}) != len(segs):
        v[SEGMENTS].append(f"log {name}: a ledger holds two segments: {[s.ledger_id for s in segs]}")
    if any(not s.completed for s in segs[:-1]):
        v[SEGMENTS].append(f"log {name}: a segment before the last is in progress")
    last_txid, last_position = -1, None
    for s in segs:
        meta = ledgers.get(s.ledger_id)
        if s.completed:
            end = s.last_entry
            if meta is None and s.records:
                v[SEGMENTS].append(f"log {name} segment {s.seq}: ledger {s.ledger_id} has no metadata")
            if meta is not None and meta.is_closed and meta.last_entry != end:
                v[SEGMENTS].append(f"log {name} segment {s.seq}: ends at entry {end}, ledger {s.ledger_id} "
                                   f"closed at {meta.last_entry}")
        else:
            end = lacs.get(s.ledger_id, -1)
        count = size = 0
        for entry in range(end + 1):
            found.checked[RECORDS] += 1
            e = summaries.get((s.ledger_id, entry))
            where = f"log {name} segment {s.seq} (ledger {s.ledger_id}) entry {entry}"
            if e is None:
                v[RECORDS].append(f"{where}: no valid record set on any bookie")
                break
            if (e.records_before, e.bytes_before) != (count, size):
                v[RECORDS].append(f"{where}: says {e.records_before} records and {e.bytes_before} bytes before it, "
                                  f"the entries before hold {count} and {size}")
            if not e.increasing or e.first_txid <= last_txid:
                v[RECORDS].append(f"{where}: transaction ids {e.first_txid}..{e.last_txid} do not increase "
                                  f"(after {last_txid})")
            count, size, last_txid = count + e.count, size + e.payload_bytes, e.last_txid
            last_position = Position(s.seq, entry, e.count - 1)
        found.records += count
        if s.completed and (count, size) != (s.records, s.bytes):
            v[RECORDS].append(f"log {name} segment {s.seq}: metadata says {s.records} records / {s.bytes} bytes, "
                              f"its entries hold {count} / {size}")
        if s.completed and s.records and (s.first_txid, s.last_txid) != (
                summaries[(s.ledger_id, 0)].first_txid if (s.ledger_id, 0) in summaries else None, last_txid):
            v[RECORDS].append(f"log {name} segment {s.seq}: txids {s.first_txid}..{s.last_txid} in the metadata, "
                              f"not the entries'")
    point = view.log.truncated_before
    found.checked[TRUNCATION] += 1
    end_position = Position(last_position.segment, last_position.entry, last_position.slot + 1) \
        if last_position else HEAD
    at_a_start = point.entry == point.slot == 0 and point.segment <= view.log.next_segment
    if point > end_position and not at_a_start:
        v[TRUNCATION].append(f"log {name}: truncated before {point}, past its last record ({last_position})")
    stale = [s.seq for s in segs if s.completed and s.seq < point.segment]
    if stale:
        v[TRUNCATION].append(f"log {name}: segments {stale} lie wholly before the truncation point {point}")
    for sub, position in view.subscriptions.items():
        found.checked[SUBSCRIPTIONS] += 1
        if last_position is None or position > last_position:
            v[SUBSCRIPTIONS].append(f"log {name} subscription {sub}: at {position}, past the last record "
                                    f"({last_position})")
        elif not any(s.seq == position.segment for s in segs) and position >= point:
            v[SUBSCRIPTIONS].append(f"log {name} subscription {sub}: at {position}, in no segment")
