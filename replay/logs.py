"""Cross-node checks over transaction logs read back from disk.

Pure: callers read the logs (zab.storage.txnlog / zab.storage.recovery) and pass the records.
Shared by the multi-process tests now and the Spark verifiers later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from replay.invariants import InvariantViolation, check_log
from zab.core import zxid as Z
from zab.core.txn import Txn


def check_logs_agree(logs: Mapping[int, Sequence[Txn]]) -> None:
    """Agreement and PrefixConsistency over logs: a zxid names the same bytes on every
    node, and each log is a gap-free sequence. Raises InvariantViolation."""
    seen: dict[int, tuple[int, Txn]] = {}
    for node, txns in logs.items():
        check_log(node, [t.zxid for t in txns])
        for t in txns:
            other = seen.setdefault(t.zxid, (node, t))
            if other[1] != t:
                raise InvariantViolation(f"Agreement: zxid {Z.fmt(t.zxid)} differs between node {other[0]} and {node}")


def check_logs_converged(logs: Mapping[int, Sequence[Txn]]) -> None:
    """After every node caught up: the same last zxid everywhere, and the same records
    above the newest point every log still reaches back to."""
    check_logs_agree(logs)
    lasts = {node: (txns[-1].zxid if txns else 0) for node, txns in logs.items()}
    if len(set(lasts.values())) != 1:
        raise InvariantViolation(f"logs end at different zxids: { {n: Z.fmt(z) for n, z in lasts.items()} }")
    floor = max((txns[0].zxid for txns in logs.values() if txns), default=0)
    tails = {node: [t.zxid for t in txns if t.zxid >= floor] for node, txns in logs.items()}
    first = next(iter(tails.values()))
    for node, zxids in tails.items():
        if zxids != first:
            raise InvariantViolation(f"node {node}'s log above {Z.fmt(floor)} differs from the others'")
