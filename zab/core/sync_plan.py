"""Choosing how to synchronize a learner: DIFF, TRUNC or SNAP.

The learner reported its last logged zxid in ACKEPOCH. Under Zab's invariants a
zxid names one transaction ensemble-wide, so the learner's history agrees with
the leader's up to the largest point of the leader's history at or below that
zxid; anything the learner has above that point was never committed (the
skipped proposals of the paper's figures 3 and 4) and is truncated.
"""

from __future__ import annotations

from dataclasses import dataclass

from zab.core.history import History
from zab.core.messages import SyncMode


@dataclass(frozen=True, slots=True)
class SyncPlan:
    mode: SyncMode
    zxid: int  # DIFF: the learner's last zxid; TRUNC: where to cut; SNAP: the snapshot's zxid


def plan_sync(history: History, last_committed: int, peer_last_zxid: int) -> SyncPlan:
    if history.contains(peer_last_zxid) or peer_last_zxid == history.last_zxid:
        return SyncPlan(SyncMode.DIFF, peer_last_zxid)
    point = history.floor(peer_last_zxid)
    # Cut only at a transaction we still hold in memory (or an empty history): a
    # trimmed base proves nothing about the learner's history, so send a snapshot.
    if point is not None and (point > history.base_zxid or history.base_zxid == 0):
        return SyncPlan(SyncMode.TRUNC, point)
    return SyncPlan(SyncMode.SNAP, last_committed)
