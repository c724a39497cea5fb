"""Peer links over TCP (trio edge): one dialed connection per direction and pair.

Each node dials every other member to send to it and accepts connections to
receive, so each TCP connection is a FIFO channel in one direction. Whatever
breaks a link (EOF, reset, a corrupt or oversized frame, a full send queue)
is reported to the core as PeerDisconnected before any message of a newer
connection from that peer, because Zab must never see a gap in a channel.
Send queues are bounded: a follower that cannot keep up is disconnected and
resynchronizes instead of growing the leader's memory without limit.

Frames sent during one step of the driver are buffered per peer and flushed
together at its end (flush()) into the peer's Outbox (edge/outbox.py), which
writes them through when the link is idle and otherwise queues them for the
link's writer task. One other thread writes to links: the log writer's, which
sends a follower's ACK the moment its fsync returns (send_from_thread), under
the Outbox's thread/lock protocol, and only when nothing is buffered for the
peer either, so frames never interleave or reorder.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from edge.sockets import open_listeners
from zab.core.actions import PeerDisconnected, Received
from zab.wire.codec import FrameDecoder, decode_hello, decode_message, encode_frame, encode_hello
from zab.errors import FrameError
from zab.core.messages import Message
from edge.outbox import Outbox, OutboxStats

log = logging.getLogger("quire.zab.transport")

HELLO_TIMEOUT_S = 5.0
# A HELLO never displaces a member's live link (issue 17: a stranger's HELLO loop cut them).
# A newer link from the same member waits this long for the old one to end, else is closed;
# the member redials. A member that restarted closed its old connection (FIN or RST), and
# TCP keepalive below ends a half-open one (host gone, partition) within a few seconds.
REPLACE_WAIT_S = 5.0
KEEPALIVE_IDLE_S = 2
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_PROBES = 3
HELLO_MAX_BYTES = 4096
RECONNECT_MIN_S = 0.02
RECONNECT_MAX_S = 1.0
WARN_EVERY_S = 10.0  # a refusal of the same kind is logged at most this often
DEFAULT_SEND_QUEUE_MAX_BYTES = 128 << 20


@dataclass
class _Outgoing:
    box: Outbox
    scope: trio.CancelScope | None = None
    connected: bool = False
    generation: int = 0  # bumped by every loss or disconnect: a link that ends unbumped was lost unannounced
    pending: list[bytes] | None = None  # frames of this step, not yet flushed
    pending_bytes: int = 0

    @property
    def queued(self) -> int:
        return self.box.queued_frames + (len(self.pending) if self.pending else 0)


@dataclass
class TransportStats(OutboxStats):
    frames_received: int = 0
    disconnects: int = 0
    overflows: int = 0
    bad_frames: int = 0
    links_refused: int = 0  # HELLOs of a member whose link was up (see REPLACE_WAIT_S)


class PeerTransport:
    """Dials and accepts peer links; calls `deliver(event)` for everything that arrives
    (a list of Received events for the messages of one socket read). `deliver` is
    synchronous: the driver steps its core inline in the reading task."""

    def __init__(self, cluster: str, my_id: int, addresses: dict[int, tuple[str, int]],
                 deliver: Callable[[object], None], *, max_frame_bytes: int, send_queue_max: int,
                 send_queue_max_bytes: int = DEFAULT_SEND_QUEUE_MAX_BYTES) -> None:
        self.cluster = cluster
        self.my_id = my_id
        self.addresses = addresses
        self.deliver = deliver
        self.max_frame_bytes = max_frame_bytes
        self.send_queue_max = send_queue_max
        self.send_queue_max_bytes = send_queue_max_bytes
        # When set (by the driver): awaited before each read of a peer link, so that a node whose
        # log writer is behind stops taking proposals (TCP pushes back to the sender's queue).
        self.wait_room: Callable[[], Awaitable[None]] | None = None
        self.stats = TransportStats()
        self._warned: dict[str, tuple[float, int]] = {}  # why -> (when last logged, suppressed since)
        self._out: dict[int, _Outgoing] = {}
        self._incoming: dict[int, trio.CancelScope] = {}
        self._incoming_ended: dict[int, trio.Event] = {}  # set once that link's task is done with it
        self._waiting: dict[int, trio.CancelScope] = {}  # the one newer link per member waiting its turn
        self._unflushed: list[_Outgoing] = []  # links with a pending buffer
        self._lost: list[int] = []  # peers whose loss must reach the core
        self._lost_event = trio.Event()
        # Mutual TLS on every link when set (clusterd/daemon/tls_streams.py PeerTls: accept, admit, dial).
        self.tls = None
        self._nursery: trio.Nursery | None = None
        self._dialers: dict[int, trio.CancelScope] = {}

    # -- running ---------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        host, port = self.addresses[self.my_id]
        listeners = await open_listeners(port, host, "peers (Zab and its election)")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(trio.serve_listeners, self._accept, listeners)
            for peer in self.addresses:
                if peer != self.my_id:
                    self._start_dialing(peer)
            nursery.start_soon(self._report_losses)
            task_status.started()

    def _start_dialing(self, peer: int) -> None:
        assert self._nursery is not None
        self._out[peer] = _Outgoing(Outbox(threads=True, stats=self.stats))  # the log writer ACKs
        scope = self._dialers[peer] = trio.CancelScope()

        async def dial() -> None:
            with scope:
                await self._dial_loop(peer)
        self._nursery.start_soon(dial)

    def set_members(self, addresses: dict[int, tuple[str, int]]) -> None:
        """The ensemble changed (a reconfig): dial the new members, drop the links of the
        removed ones, redial moved ones at their new address. Our own listener stays."""
        new = {**addresses, self.my_id: self.addresses[self.my_id]}
        if self._nursery is None:  # not running yet: run() dials whatever is here
            self.addresses = new
            return
        for peer in set(self.addresses) - set(new):
            self.disconnect(peer)
            scope = self._dialers.pop(peer, None)
            if scope is not None:
                scope.cancel()
            self._out.pop(peer, None)
        added = set(new) - set(self.addresses)
        self.addresses = new
        for peer in sorted(added):
            self._start_dialing(peer)

    def sending_to(self, peer: int) -> bool:
        """True while our dialed link to `peer` is established."""
        out = self._out.get(peer)
        return out is not None and out.connected

    def queued(self, peer: int) -> int:
        """Frames waiting for `peer` (bounded by send_queue_max)."""
        out = self._out.get(peer)
        return 0 if out is None else out.queued

    def queued_bytes(self, peer: int) -> int:
        """Bytes waiting for `peer` (bounded by send_queue_max_bytes, plus one frame)."""
        out = self._out.get(peer)
        return 0 if out is None else out.box.queued_bytes + out.pending_bytes

    def connected_peers(self) -> list[int]:
        return sorted(p for p, o in self._out.items() if o.connected and p in self._incoming)

    # -- sending -------------------------------------------------------------------------
    def send(self, peer: int, msg: Message, *, flush: bool = True) -> None:
        """Queue `msg` for `peer`; with flush=False it waits for the next flush()."""
        out = self._out.get(peer)
        if out is None:
            return
        frame = encode_frame(msg)
        queued, queued_bytes = out.queued, out.box.queued_bytes + out.pending_bytes
        # One frame always fits an empty queue, whatever its size (a SNAP may be large).
        if queued and (queued >= self.send_queue_max or queued_bytes + len(frame) > self.send_queue_max_bytes):
            self.stats.overflows += 1
            log.warning("event=send_queue_full peer=%s frames=%s bytes=%s limit_frames=%s limit_bytes=%s "
                        "action=disconnect", peer, queued, queued_bytes, self.send_queue_max,
                        self.send_queue_max_bytes)
            self.disconnect(peer, report=True)
            return
        if out.pending is None:
            out.pending = []
            self._unflushed.append(out)
        out.pending.append(frame)
        out.pending_bytes += len(frame)
        if flush:
            self.flush()

    def flush(self) -> None:
        """Write every peer's buffered frames: directly when its link is idle, else via its queue."""
        unflushed, self._unflushed = self._unflushed, []
        for out in unflushed:
            frames, out.pending, out.pending_bytes = out.pending, None, 0
            if frames:  # (empty: dropped by disconnect())
                out.box.send(frames[0] if len(frames) == 1 else b"".join(frames), len(frames))

    def send_from_thread(self, peer: int, msg: Message) -> bool:
        """Write `msg` to `peer` from a thread other than trio's, if the link is established and
        idle (nothing buffered, queued or being written); False means nothing was written and the
        caller must send it the usual way, from the trio thread. The rest of a frame the socket
        did not take goes to the link's writer task."""
        out = self._out.get(peer)
        if out is None or out.pending is not None:
            return False
        return out.box.send_from_thread(encode_frame(msg))

    def disconnect(self, peer: int, *, report: bool = False) -> None:
        """Drop both links with `peer` and everything queued for it."""
        out = self._out.get(peer)
        if out is not None:
            out.generation += 1
            out.box.detach()  # queued messages of the old link are discarded
            if out.pending is not None:
                out.pending, out.pending_bytes = [], 0  # still listed in _unflushed; flushes nothing
            if out.scope is not None:
                out.scope.cancel()
        scope = self._incoming.pop(peer, None)
        if scope is not None:
            scope.cancel()
        if report:
            self._lose(peer)

    def _lose(self, peer: int) -> None:
        self.stats.disconnects += 1
        self._lost.append(peer)
        self._lost_event.set()

    async def _report_losses(self) -> None:
        while True:
            await self._lost_event.wait()
            self._lost_event = trio.Event()
            self._report_lost_now()

    def _report_lost_now(self) -> None:
        lost, self._lost = self._lost, []
        for peer in lost:
            self.deliver(PeerDisconnected(peer))

    async def _dial_loop(self, peer: int) -> None:
        out = self._out[peer]
        delay = RECONNECT_MIN_S
        while True:
            host, port = self.addresses[peer]
            try:
                stream = await trio.open_tcp_stream(host, port)
                _keepalive(stream)
                if self.tls is not None:  # refused (TlsRefused is an OSError): retried with backoff
                    stream = await self.tls.dial(stream, peer)
            except OSError:
                await trio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            delay = RECONNECT_MIN_S
            # Taken once the link exists: a disconnect() while dialing concerns the links before it.
            generation = out.generation
            with trio.CancelScope() as scope:
                out.scope = scope
                try:
                    await self._pump(stream, out)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    log.info("event=link_down peer=%s direction=out error=%r", peer, e)
            log.info("event=link_down peer=%s direction=out", peer)
            out.scope, out.connected = None, False
            await stream.aclose()
            if out.generation == generation:  # not a deliberate disconnect(): the core must hear of it
                out.generation += 1
                out.box.detach()
                self._lose(peer)
            # Redialed at once even when the other side ended the link at once (it does not know us
            # yet): backing off there made failovers slower (a worst case of 300 ms against 170 in
            # the Zab-layer benchmark); the refusal's log line is rate-limited instead.
            await trio.sleep(RECONNECT_MIN_S)

    async def _pump(self, stream: trio.SocketStream, out: _Outgoing) -> None:
        """Send until the link fails or is replaced; returns when it is over.

        The acceptor never writes on this connection, so a read that completes means
        it closed: watching for that notices a dead link even when nothing is sent
        (followers rarely send to each other), instead of losing the next message.
        """
        await stream.send_all(encode_hello(self.cluster, self.my_id))
        out.connected = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_remote_close, stream, nursery.cancel_scope)
            try:
                await out.box.pump(stream)  # returns once detached (disconnect)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                log.info("event=link_down peer=%s direction=out error=%r", stream, e)
            nursery.cancel_scope.cancel()

    def _warn_rarely(self, why: str, message: str, *args: object) -> None:
        """A refusal's warning at most once per WARN_EVERY_S for each reason, with how many were
        left out: a peer (or a stranger) redialing cannot fill the disk with the same line."""
        now = trio.current_time()
        last, suppressed = self._warned.get(why, (-WARN_EVERY_S, 0))
        if now - last < WARN_EVERY_S:
            self._warned[why] = (last, suppressed + 1)
            return
        self._warned[why] = (now, 0)
        log.warning(message + " suppressed_since_last=%d", *args, suppressed)

    async def _watch_remote_close(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        try:
            await stream.receive_some(1)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    # -- receiving ----------------------------------------------------------------------
    async def _accept(self, stream: trio.SocketStream) -> None:
        # Until a HELLO names a member, a stranger may only make us buffer a small frame.
        decoder = FrameDecoder(HELLO_MAX_BYTES)
        _keepalive(stream)
        if self.tls is not None:
            stream = await self.tls.accept(stream)  # None: refused, closed and logged by the TLS layer
            if stream is None:
                return
        try:
            with trio.fail_after(HELLO_TIMEOUT_S):
                peer, frames = await self._read_hello(stream, decoder)
            # Nothing after the HELLO is decoded before its certificate is known to be the peer's.
            if self.tls is not None and not self.tls.admit(stream, peer):  # another node's certificate
                await stream.aclose()
                return
            # Frames that came with the HELLO are decoded now: a corrupt one ends the connection
            # at once, not after it has waited its turn behind the member's live link.
            early = [decode_message(payload) for payload in frames]
        except (FrameError, trio.TooSlowError, OSError, trio.BrokenResourceError) as e:
            self.stats.bad_frames += 1
            self._warn_rarely("bad hello", "event=peer_rejected error=%r", e)
            await stream.aclose()
            return
        decoder.max_frame_bytes = self.max_frame_bytes
        if not await self._wait_turn(peer):
            self.stats.links_refused += 1
            self._warn_rarely(f"busy {peer}", "event=peer_rejected peer=%s reason=%r", peer, "this member's link is up")
            await stream.aclose()
            return
        ended = self._incoming_ended[peer] = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._incoming[peer] = scope
                try:
                    await self._read_loop(stream, decoder, peer, early)
                except (FrameError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    self.stats.bad_frames += isinstance(e, FrameError)
                    log.warning("event=link_down peer=%s direction=in error=%r", peer, e)
            if self._incoming.get(peer) is scope:
                del self._incoming[peer]
                self._lose(peer)
            await stream.aclose()
        finally:
            if self._incoming_ended.get(peer) is ended:
                del self._incoming_ended[peer]
            ended.set()

    async def _wait_turn(self, peer: int) -> bool:
        """A new link from `peer` waits for its old one to end (never displaces it: a HELLO proves
        nothing without TLS); False after REPLACE_WAIT_S, or once a newer link waits instead.
        Every loss not yet reported reaches the core before the new link's first message."""
        if peer in self._incoming_ended:
            previous = self._waiting.pop(peer, None)
            if previous is not None:
                previous.cancel()
            with trio.move_on_after(REPLACE_WAIT_S) as wait:
                self._waiting[peer] = wait
                while (ended := self._incoming_ended.get(peer)) is not None:
                    await ended.wait()
            if self._waiting.get(peer) is wait:
                del self._waiting[peer]
            if wait.cancelled_caught:
                return False
        self._report_lost_now()
        return True

    async def _read_hello(self, stream: trio.SocketStream, decoder: FrameDecoder) -> tuple[int, list[bytes]]:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise FrameError("connection closed before HELLO")
            frames = decoder.feed(data)
            hello = next(frames, None)
            if hello is not None:
                cluster, peer = decode_hello(hello)
                if cluster != self.cluster:
                    raise FrameError(f"peer belongs to cluster {cluster!r}, we are {self.cluster!r}")
                if peer not in self.addresses or peer == self.my_id:
                    raise FrameError(f"peer id {peer} is not a member of this ensemble")
                # Only the HELLO is held to HELLO_MAX_BYTES: a member's large frame may follow
                # it in this same read (FrameDecoder.feed reads the limit at every frame).
                decoder.max_frame_bytes = self.max_frame_bytes
                return peer, list(frames)

    async def _read_loop(self, stream: trio.SocketStream, decoder: FrameDecoder, peer: int,
                         early: list[Message]) -> None:
        for msg in early:
            self.deliver(Received(peer, msg))
        while True:
            if self.wait_room is not None:
                await self.wait_room()
            data = await stream.receive_some(65536)
            if not data:
                return
            received = [Received(peer, decode_message(payload)) for payload in decoder.feed(data)]
            if received:
                self.stats.frames_received += len(received)
                self.deliver(received)  # one hand-over per read (a FrameError drops them all: the link breaks)


def _keepalive(stream: trio.SocketStream) -> None:
    """TCP keepalive, so that a half-open link (peer host gone, partition) ends within seconds."""
    try:
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                              ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
            if hasattr(socket, option):  # Linux names; elsewhere the system's defaults apply
                stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:
        pass  # a connection reset already: its first read or write ends it the usual way
