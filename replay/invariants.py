"""Zab's invariants as checkers over observations (FAULTS.md, ZooKeeper's TLA+ names).

Pure and shared: the simulator feeds them every delivery and every leader
establishment as they happen; multi-process tests and the verifiers feed them
what they read back from logs.
"""

from __future__ import annotations

from collections.abc import Iterable

from zab.core import zxid as Z
from zab.core.txn import Txn


class InvariantViolation(AssertionError):
    """A protocol guarantee was broken. The message names the invariant."""


class DeliveryOracle:
    """PrefixConsistency, Agreement, TotalOrder and Integrity over all deliveries.

    The global committed history is the sequence of transactions in delivery
    order. Each node incarnation delivers from the point its state started at
    (0 or a snapshot zxid); every delivery must be the successor of the
    previous one in that global history, or extend it.
    """

    def __init__(self) -> None:
        self.order: list[int] = []
        self.index: dict[int, int] = {}
        self.data: dict[int, Txn] = {}

    def delivered(self, node: int, prev_zxid: int, txn: Txn) -> None:
        known = self.data.get(txn.zxid)
        if known is not None and known != txn:
            raise InvariantViolation(f"Agreement: node {node} delivered {Z.fmt(txn.zxid)} with other contents")
        if prev_zxid and prev_zxid not in self.index:
            raise InvariantViolation(
                f"PrefixConsistency: node {node} delivered after {Z.fmt(prev_zxid)}, which nobody delivered")
        position = self.index[prev_zxid] + 1 if prev_zxid else 0
        if known is not None:
            if self.index[txn.zxid] != position:
                raise InvariantViolation(
                    f"TotalOrder: node {node} delivered {Z.fmt(txn.zxid)} right after {Z.fmt(prev_zxid)}, "
                    f"elsewhere it follows {Z.fmt(self.order[self.index[txn.zxid] - 1]) if self.index[txn.zxid] else 'nothing'}")
            return
        if position != len(self.order):
            raise InvariantViolation(
                f"PrefixConsistency: node {node} delivered new {Z.fmt(txn.zxid)} after {Z.fmt(prev_zxid)} where "
                f"{Z.fmt(self.order[position])} was delivered elsewhere")
        if self.order and txn.zxid <= self.order[-1]:
            raise InvariantViolation(f"GlobalPrimaryOrder: {Z.fmt(txn.zxid)} delivered after {Z.fmt(self.order[-1])}")
        self.index[txn.zxid] = len(self.order)
        self.order.append(txn.zxid)
        self.data[txn.zxid] = txn

    def lost(self, acknowledged: Iterable[int], delivered_by_all: Iterable[int]) -> list[int]:
        """Acknowledged zxids missing from a fully caught-up node's history."""
        have = set(delivered_by_all)
        return [z for z in acknowledged if z not in have]


class LeadershipOracle:
    """Leadership: at most one established leader per epoch."""

    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}

    def established(self, epoch: int, leader: int) -> None:
        other = self.leaders.setdefault(epoch, leader)
        if other != leader:
            raise InvariantViolation(f"Leadership: nodes {other} and {leader} both established in epoch {epoch}")


def check_log(node: int, zxids: Iterable[int]) -> None:
    """Zxids in a log strictly increase with no gap inside an epoch."""
    prev = 0
    for z in zxids:
        if prev and not Z.follows(prev, z):
            raise InvariantViolation(f"log of node {node}: {Z.fmt(z)} cannot follow {Z.fmt(prev)}")
        prev = z


def check_epochs(node: int, accepted: int, current: int) -> None:
    if current > accepted:
        raise InvariantViolation(f"node {node}: currentEpoch {current} > acceptedEpoch {accepted} on disk")
