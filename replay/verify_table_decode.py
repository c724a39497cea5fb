"""Tablespaces for the table verifier (replay/verify_tables.py): pure functions over the replayed
metastore tree and the stored entries of their ledgers.

A tablespace's state is its last checkpoint (a ledger of CheckpointDecoder pieces, checked
against the SHA-256 its record names) plus every change of its log after the checkpoint's
position, applied in log order: what every replica that applied the log to that point holds
(docs/tablespace.md). The replay goes through the table service's own decoders.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from metastore.core.tree import DataTree
from replay.verify_stream_decode import LogView
from replay.znode_data import record_bytes
from stream.errors import StreamError
from stream.position import Position
from stream.record_set import decode
from tablespace import change
from tablespace.errors import CorruptChange
from tablespace.paths import ROOT, checkpoint_path, log_name
from tablespace.state import CheckpointDecoder, TableState

CHECKPOINT, REPLAY, STATE = "TableCheckpoint", "TableReplay", "TableState"


@dataclass
class TablespaceView:
    """A tablespace's checkpoint record (None if it has none yet) and its log."""
    name: str
    checkpoint: dict | None
    log: LogView | None


@dataclass
class Replayed:
    """What replaying a tablespace gave: its state, the position of its last change, the problems."""
    state: TableState
    position: Position | None
    changes: int
    problems: dict[str, list[str]]


def tablespaces_in(tree: DataTree, logs: list[LogView]) -> tuple[list[TablespaceView], list[str]]:
    """Every tablespace under /tablespaces, with its checkpoint record and its log; broken records."""
    found, broken = [], []
    if tree.node(ROOT) is None:
        return found, broken
    by_name = {v.name: v for v in logs}
    for name in tree.children(ROOT):
        record = None
        if tree.node(checkpoint_path(name)) is not None:
            try:
                record = json.loads(record_bytes(tree, checkpoint_path(name)))
                record["position"] = Position.parse(record["position"])
                int(record["ledger_id"]), str(record["digest"])
            except (ValueError, KeyError, TypeError) as e:
                broken.append(f"tablespace {name}: checkpoint record: {e}")
                continue
        found.append(TablespaceView(name, record, by_name.get(log_name(name))))
    return found, broken


def replay_tablespace(view: TablespaceView, payloads: dict[tuple[int, int], bytes], lacs: dict[int, int],
                      last_entries: dict[int, int]) -> Replayed:
    """The checkpoint's state, then the log's changes after its position. `payloads`: an entry's
    payload by (ledger, entry); `last_entries`: a closed ledger's last entry."""
    problems: dict[str, list[str]] = {CHECKPOINT: [], REPLAY: []}
    state, position, changes = TableState(), None, 0
    if view.checkpoint is not None:
        ledger, position = view.checkpoint["ledger_id"], view.checkpoint["position"]
        decoder, digest = CheckpointDecoder(), hashlib.sha256()
        try:
            for entry in range(last_entries.get(ledger, -1) + 1):
                piece = payloads.get((ledger, entry))
                if piece is None:
                    raise CorruptChange(f"checkpoint ledger {ledger} entry {entry} is on no bookie")
                digest.update(piece)
                decoder.feed(piece)
            state = decoder.finish()
            if digest.hexdigest() != view.checkpoint["digest"]:
                raise CorruptChange(f"checkpoint ledger {ledger} does not match the digest its record names")
            if state.keys != view.checkpoint.get("keys", state.keys):
                raise CorruptChange(f"checkpoint ledger {ledger} holds {state.keys} keys, its record says "
                                    f"{view.checkpoint['keys']}")
        except CorruptChange as e:
            problems[CHECKPOINT].append(f"tablespace {view.name}: {e}")
            return Replayed(state, position, 0, problems)
    if view.log is None:
        problems[REPLAY].append(f"tablespace {view.name}: no log {log_name(view.name)}")
        return Replayed(state, position, 0, problems)
    start = view.log.log.truncated_before
    if position is None and start > Position(0, 0, 0):
        problems[REPLAY].append(f"tablespace {view.name}: its log is truncated before {start} but it has no checkpoint")
    for s in view.log.segments:
        end = s.last_entry if s.completed else lacs.get(s.ledger_id, -1)
        for entry in range(end + 1):
            data = payloads.get((s.ledger_id, entry))
            if data is None:
                problems[REPLAY].append(f"tablespace {view.name}: segment {s.seq} entry {entry} is on no bookie")
                return Replayed(state, position, changes, problems)
            try:
                record_set = decode(data)
                for slot, payload in enumerate(record_set.payloads):
                    at = Position(s.seq, entry, slot)
                    if position is not None and at <= position:
                        continue
                    state.apply(change.decode(payload))
                    position, changes = at, changes + 1
            except (StreamError, CorruptChange) as e:
                problems[REPLAY].append(f"tablespace {view.name}: segment {s.seq} entry {entry}: {e}")
                return Replayed(state, position, changes, problems)
    return Replayed(state, position, changes, problems)
