"""Closing a ledger as its writer, exactly as seed 001 says ("Closing a ledger as a writer").

"The writer makes a CAS write to the metadata, changing the state to CLOSED,
and setting the last entry of the ledger to the last entry which we have
acknowledged to the client. If the CAS write fails ... We reread the metadata,
and retry closing as long as the state of the ledger is still OPEN. If the
state is IN_RECOVERY we send an error to the client. If the state is CLOSED
and the last entry is the same as the last entry we have acknowledged to the
client, we complete the close operation successfully. If the last entry is
different to what we have acknowledged to the client, we send an error to the
client."

A CAS whose outcome is unknown (lost answer) is reported as
MetadataBadVersion: the re-read then finds our own CLOSED record with our last
entry, which is the success branch.
"""

from __future__ import annotations

from ledger.actions import (Action, Completed, Event, Failed, MetadataBadVersion, MetadataRead, MetadataWritten,
                            ReadMetadata, WriteMetadata)
from ledger.errors import CloseConflict, LedgerInRecovery
from ledger.metadata import LedgerMetadata, LedgerState


class CloseOp:
    """One writer close: CAS to CLOSED at `last_entry` (with the ledger `length` in bytes)."""

    def __init__(self, metadata: LedgerMetadata, version: int, last_entry: int, length: int) -> None:
        self.metadata = metadata
        self.version = version
        self.last_entry = last_entry
        self.length = length
        self.done = False
        self.attempts = 0

    def start(self) -> list[Action]:
        return self._write()

    def _write(self) -> list[Action]:
        self.attempts += 1
        self._proposed = self.metadata.closed(self.last_entry, self.length)
        return [WriteMetadata(self._proposed, self.version)]

    def step(self, event: Event) -> list[Action]:
        if self.done:
            return []
        if isinstance(event, MetadataWritten):
            self.metadata, self.version = self._proposed, event.version
            return self._finish(Completed(self.metadata))
        if isinstance(event, MetadataBadVersion):
            return [ReadMetadata()]
        if isinstance(event, MetadataRead):
            return self._on_reread(event.metadata, event.version)
        return []

    def _on_reread(self, metadata: LedgerMetadata, version: int) -> list[Action]:
        self.metadata, self.version = metadata, version
        lid = metadata.ledger_id
        if metadata.state is LedgerState.OPEN:
            return self._write()  # someone changed something else (re-replication): close again
        if metadata.state is LedgerState.IN_RECOVERY:
            return self._finish(Failed(LedgerInRecovery(
                f"ledger {lid} is being recovered by another client; its close decides the last entry")))
        if metadata.last_entry == self.last_entry:
            return self._finish(Completed(metadata))
        return self._finish(Failed(CloseConflict(
            f"ledger {lid} was closed by someone else at entry {metadata.last_entry}, but this writer "
            f"acknowledged up to {self.last_entry}; the metadata is authoritative")))

    def _finish(self, action: Action) -> list[Action]:
        self.done = True
        return [action]
