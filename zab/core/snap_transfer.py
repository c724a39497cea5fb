"""A SNAP sent as a stream of bounded chunks, with a window of them in flight (issue 19).

A snapshot used to travel in the SYNC message itself, one frame: once the tree outgrew
`max_frame_bytes` a wiped, new or lagging follower could never rejoin. Now the leader sends
SYNC(SNAP, zxid) without a snapshot, then SNAPCHUNK(offset, bytes) messages of at most
`snap_chunk_bytes`, then SNAPEND(total bytes, SHA-256 of them). The learner answers each chunk
with SNAPACK(bytes received); the leader keeps at most `snap_window_chunks` chunks unanswered,
so a transfer never fills the peer link's bounded send queue (which would drop the link) and a
slow learner slows only its own transfer. Every frame has its own checksum; the digest covers
the whole, so a chunk lost or reordered by a bug is caught before anything is installed.

What is not streamed yet: the leader holds the serialized snapshot in memory for the transfer
and the learner gathers it in memory before installing it (both bounded by the tree's size, not
by a frame; the learner refuses one beyond `snap_max_bytes`). A transfer interrupted by either side's failure leaves nothing behind: the partial
state lives in the role objects, which the next election replaces.
"""

from __future__ import annotations

import hashlib

from zab.core.messages import SnapChunk, SnapEnd

DIGEST_BYTES = 32


class SnapSender:
    """The leader's side of one learner's transfer of `data`."""

    def __init__(self, data: bytes, chunk_bytes: int, window_chunks: int) -> None:
        self._data = memoryview(data)
        self._chunk = chunk_bytes
        self._window = window_chunks * chunk_bytes
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
        return self.ended and self.acked == len(self._data)

    def _more(self) -> list[SnapChunk | SnapEnd]:
        out: list[SnapChunk | SnapEnd] = []
        while self.sent < len(self._data) and self.sent - self.acked < self._window:
            end = min(self.sent + self._chunk, len(self._data))
            out.append(SnapChunk(self.sent, bytes(self._data[self.sent:end])))
            self.sent = end
        if self.sent == len(self._data) and not self.ended:
            self.ended = True
            out.append(SnapEnd(len(self._data), hashlib.sha256(self._data).digest()))
        return out


class SnapReceiver:
    """The learner's side: chunks in order, then the end that proves the whole."""

    def __init__(self, zxid: int, max_bytes: int) -> None:
        self.zxid = zxid
        self._max_bytes = max_bytes  # what a leader (or a stranger where TLS is off) can make us hold
        self._parts: list[bytes] = []
        self._hash = hashlib.sha256()
        self.received = 0
        self.complete: bytes | None = None

    def on_chunk(self, m: SnapChunk) -> str | None:
        """None, or why the chunk is refused (out of order, after the end)."""
        if self.complete is not None:
            return "SNAPCHUNK after SNAPEND"
        if m.offset != self.received:
            return f"SNAPCHUNK at offset {m.offset}, expected {self.received}"
        if self.received + len(m.data) > self._max_bytes:
            return f"a snapshot larger than snap_max_bytes={self._max_bytes}"
        self._parts.append(m.data)
        self._hash.update(m.data)
        self.received += len(m.data)
        return None

    def on_end(self, m: SnapEnd) -> str | None:
        """None once the snapshot is whole and verified (`complete`), or why it is not."""
        if self.complete is not None:
            return "a second SNAPEND"
        if m.total != self.received:
            return f"SNAPEND says {m.total} bytes, {self.received} arrived"
        if m.digest != self._hash.digest():
            return "the snapshot's SHA-256 does not match SNAPEND's: a chunk was damaged or lost"
        self.complete = b"".join(self._parts)
        self._parts = []
        return None
