"""A SNAP streamed as bounded chunks, with a window of them in flight (issue 19).

The leader sends SYNC(SNAP, zxid) without a snapshot, then SNAPCHUNK(offset, bytes, CRC-32C)
messages of at most `snap_chunk_bytes`, then SNAPEND(total bytes, SHA-256 of them). The learner
answers each chunk with SNAPACK(bytes received) once the chunk is written to its partial
snapshot file; the leader keeps at most `snap_window_chunks` chunks unanswered, so a transfer
never fills the peer link's bounded send queue (which would drop the link), a slow learner (or
its slow disk) slows only its own transfer, and neither side holds more than a window of chunks.

Neither side holds the whole snapshot. The leader's chunks come from an iterator over a frozen
copy-on-write view of the state (StateMachine.freeze, Frozen.chunks), each encoded when the
window opens for it, while the state machine goes on applying. The learner checks each chunk's
CRC, hashes it, feeds it to the state machine's incremental restore (StateMachine.restorer: the
new state grows beside the old one, which stays in use until the install), and has the edge
append it to a temporary file (SnapBegin, SnapWrite); at SNAPEND, with the total and digest
right and the restore complete, the new state replaces the old and the edge makes the file the
node's snapshot (InstallSnapshot). Anything wrong, or the end of the learner's role, discards
the partial file (SnapDiscard) and the partial state, and the learner syncs again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from crc32c import crc32c

from zab.core.messages import SnapChunk, SnapEnd
from zab.core.statemachine import MalformedState, Restore

DIGEST_BYTES = 32


class SnapSender:
    """The leader's side of one learner's transfer: pulls `chunks` (each at most `chunk_bytes`)
    as the learner's acks open the window."""

    def __init__(self, chunks: Iterator[bytes], chunk_bytes: int, window_chunks: int) -> None:
        self._chunks: Iterator[bytes] | None = chunks
        self._chunk = chunk_bytes
        self._window = window_chunks * chunk_bytes
        self._hash = hashlib.sha256()
        self.sent = 0       # bytes sent
        self.acked = 0      # bytes the learner said it has
        self.ended = False  # SNAPEND sent

    def start(self) -> list[SnapChunk | SnapEnd]:
        return self._more()

    def on_ack(self, received: int) -> list[SnapChunk | SnapEnd] | None:
        """The next messages to send; None if the ack claims bytes never sent (a broken learner)."""
        if not self.acked <= received <= self.sent:
            return None
        self.acked = received
        return self._more()

    @property
    def done(self) -> bool:
        """Everything was sent and the learner has it all."""
        return self.ended and self.acked == self.sent

    def _more(self) -> list[SnapChunk | SnapEnd]:
        out: list[SnapChunk | SnapEnd] = []
        while self._chunks is not None and self.sent - self.acked < self._window:
            data = next(self._chunks, None)
            if data is None:
                self._chunks = None  # the view's references go with the iterator
                break
            assert 0 < len(data) <= self._chunk, f"a snapshot chunk of {len(data)} bytes, limit {self._chunk}"
            self._hash.update(data)
            out.append(SnapChunk(self.sent, data, crc32c(data)))
            self.sent += len(data)
        if self._chunks is None and not self.ended:
            self.ended = True
            out.append(SnapEnd(self.sent, self._hash.digest()))
        return out


class SnapReceiver:
    """The learner's side: chunks in order, each checked and fed to the state machine's restore,
    then the end that proves the whole. Holds no chunk after on_chunk returns."""

    def __init__(self, zxid: int, max_bytes: int, restore: Restore) -> None:
        self.zxid = zxid
        self._max_bytes = max_bytes  # what a leader (or a stranger where TLS is off) can make us write
        self._restore = restore
        self._hash = hashlib.sha256()
        self.received = 0
        self.complete = False

    def on_chunk(self, m: SnapChunk) -> str | None:
        """None, or why the chunk is refused (out of order, damaged, too much, not a snapshot)."""
        if self.complete:
            return "SNAPCHUNK after SNAPEND"
        if m.offset != self.received:
            return f"SNAPCHUNK at offset {m.offset}, expected {self.received}"
        if crc32c(m.data) != m.crc:
            return f"SNAPCHUNK at offset {m.offset} fails its CRC-32C"
        if self.received + len(m.data) > self._max_bytes:
            return f"a snapshot larger than snap_max_bytes={self._max_bytes}"
        self._hash.update(m.data)
        self.received += len(m.data)
        try:
            self._restore.feed(m.data)
        except MalformedState as e:  # refused at the first bad chunk, not after gigabytes
            return f"SNAP at offset {m.offset} does not decode: {e}"
        return None

    def on_end(self, m: SnapEnd) -> str | None:
        """None once the snapshot is whole and verified (`complete`), or why it is not."""
        if self.complete:
            return "a second SNAPEND"
        if m.total != self.received:
            return f"SNAPEND says {m.total} bytes, {self.received} arrived"
        if m.digest != self._hash.digest():
            return "the snapshot's SHA-256 does not match SNAPEND's: a chunk was damaged or lost"
        self.complete = True
        return None

    def install(self) -> str | None:
        """Replace the state machine's state with the verified snapshot; None, or why it cannot
        (the state then is as it was)."""
        assert self.complete
        try:
            self._restore.install()
        except MalformedState as e:
            return f"SNAP at {self.zxid:#x} does not decode: {e}"
        return None
