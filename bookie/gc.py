"""Garbage-collection policy: which local ledgers may be destroyed (pure: no I/O, no clock).

Bookies that trusted one metadata listing have deleted live ledgers when that
listing was wrong or partial (FAULTS.md: YahooArchive/bookkeeper #15/#17,
#870, #4607). Rule: **absence from one metadata scan is never enough to destroy
bytes.** A local ledger is eligible for deletion only when

1. it is absent from at least two metadata scans, the first and the last of
   them taken at least `min_interval_ms` apart, with no scan in between (or
   after) that lists it; and
2. a direct exists-check of that ledger, taken at or after the latest of
   those scans (by zxid), confirmed that it does not exist.

The caller (the bookie service) lists the metastore's ledgers periodically,
feeds each listing to observe_scan(), asks the metastore about each
candidate, and deletes what eligible() returns with BookieStorage.delete_ledgers.
Time is an input (`taken_at_ms`), as STYLE.md wants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetadataScan:
    """One complete listing of the ledgers that exist, as of metastore zxid `zxid`."""

    zxid: int
    taken_at_ms: int
    live: frozenset[int]


@dataclass(frozen=True, slots=True)
class ExistsCheck:
    """The answer of a direct exists-check of one ledger, as of metastore zxid `zxid`."""

    ledger_id: int
    exists: bool
    zxid: int


class GcPolicy:
    """Tracks, per local ledger, the scans that did not list it."""

    def __init__(self, min_interval_ms: int, *, max_scans: int = 16) -> None:
        if min_interval_ms < 0:
            raise ValueError(f"min_interval_ms must not be negative, got {min_interval_ms}")
        self.min_interval_ms = min_interval_ms
        self.max_scans = max_scans
        self._scans: list[MetadataScan] = []

    def observe_scan(self, scan: MetadataScan) -> None:
        """Record a complete listing. Scans must come in zxid order (an older one is ignored)."""
        if self._scans and scan.zxid < self._scans[-1].zxid:
            return
        self._scans.append(scan)
        del self._scans[: -self.max_scans]

    def candidates(self, local_ledgers: Iterable[int]) -> set[int]:
        """Local ledgers that satisfy rule 1 and now need a direct exists-check."""
        found = set()
        for ledger_id in local_ledgers:
            absent = []
            for scan in reversed(self._scans):
                if ledger_id in scan.live:
                    break
                absent.append(scan)
            if len(absent) >= 2 and absent[0].taken_at_ms - absent[-1].taken_at_ms >= self.min_interval_ms:
                found.add(ledger_id)
        return found

    def eligible(self, local_ledgers: Iterable[int], checks: Mapping[int, ExistsCheck]) -> set[int]:
        """Ledgers that may be deleted now: candidates whose exists-check (no older than the latest
        scan) says they do not exist. A candidate without a check is kept."""
        latest = self._scans[-1].zxid if self._scans else None
        result = set()
        for ledger_id in self.candidates(local_ledgers):
            check = checks.get(ledger_id)
            if check is not None and not check.exists and latest is not None and check.zxid >= latest:
                result.add(ledger_id)
        return result
