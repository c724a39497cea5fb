"""A TLS connection over a trio socket stream (trio edge), with `ssl.SSLObject` and memory BIOs.

Used on every TLS port instead of `trio.SSLStream` for what the ports do most, measured under
load (docs/benchmarks.md, section 9):
- `receive_some` decrypts every record that one socket read brought, not one record per call:
  a ZooKeeper client sends a record per request, so a busy connection delivers dozens per read,
  and one call per record cost a scheduler pass each.
- `send_frames` seals each frame in records of its own (kazoo needs that, see
  metastore/edge/client_conn.py) and hands them all to the socket in one write.
- `write_now` lets the write-through of edge/sockets.py work under TLS: a lone reply or proposal
  is encrypted and handed to the kernel at once instead of a scheduler pass later.

Semantics are trio's `SSLStream(https_compatible=True)`: a peer may end the connection without
close_notify (our frames carry their own lengths, so truncation is seen above). Renegotiation is
refused (TLS 1.2) and not part of TLS 1.3. A TLS error ends the connection as
`trio.BrokenResourceError`, with the `ssl.SSLError` as its cause.

What a peer can make it hold is bounded: it reads from the socket only when everything decrypted
before has been returned, RECEIVE_BYTES at a time.
"""

from __future__ import annotations

import os
import ssl
import threading

import trio

RECEIVE_BYTES = 256 * 1024  # one socket read; plaintext returned is never more than one read's worth
_RECORD_BYTES = 16 * 1024  # the largest TLS record's plaintext (SSLObject.read returns one record at most)


class _Owed(bytes):
    """What `write_now` returns when the socket took only part of the ciphertext: no plaintext is
    left (its length is 0) but it is true, so the caller queues it and wakes its writer task, whose
    next send_all on this stream writes the owed ciphertext first."""

    def __bool__(self) -> bool:
        return True


OWED = _Owed()


class TlsStream(trio.abc.Stream):
    """A TLS client or server connection on `transport_stream`; `await do_handshake()` first.

    One task may send and another receive at the same time (trio's Stream contract); the
    handshake must finish before either starts."""

    def __init__(self, transport_stream: trio.SocketStream, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None) -> None:
        self.transport_stream = transport_stream
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._plain = b""  # decrypted and not yet returned
        self._eof = False
        self._owed: bytes | memoryview = b""  # sealed, not yet on the socket; it goes out before anything else
        self._sending = self._receiving = False
        self._broken: BaseException | None = None
        self._loop_thread = threading.get_ident()  # SSLObject is not safe from two threads

    # --- what ssl tells about the connection (tls_context reads the certificate from these)

    def getpeercert(self, binary_form: bool = False):  # noqa: ANN201 (ssl's own return type)
        return self._ssl.getpeercert(binary_form)

    def cipher(self) -> tuple[str, str, int] | None:
        return self._ssl.cipher()

    def version(self) -> str | None:
        return self._ssl.version()

    # --- handshake

    async def do_handshake(self) -> None:
        """The TLS handshake; BrokenResourceError (cause: the ssl.SSLError) when it fails, after the
        alert that says why has been offered to the peer."""
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._send_sealed()
                data = await self.transport_stream.receive_some(RECEIVE_BYTES)
                if not data:
                    raise trio.BrokenResourceError("the peer closed the connection during the TLS handshake") from None
                self._incoming.write(data)
            except ssl.SSLError as e:
                self._write_sealed_now()  # the alert, if the socket takes it; never waited for
                raise trio.BrokenResourceError(f"TLS handshake failed: {e.reason or e}") from e
        await self._send_sealed()

    # --- receiving

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this TLS stream")
        self._receiving = True
        try:
            waited = False
            while not self._plain and not self._eof:
                self._decrypt()
                if self._plain or self._eof:
                    break
                data = await self.transport_stream.receive_some(RECEIVE_BYTES)
                waited = True
                if not data:
                    self._eof = True  # https_compatible: an end without close_notify is an end
                    break
                self._incoming.write(data)
            if not waited:
                await trio.lowlevel.checkpoint()  # a Stream method is always a checkpoint
            return self._take(max_bytes)
        finally:
            self._receiving = False

    def _decrypt(self) -> None:
        """Decrypt every whole record received so far into _plain (empty before)."""
        chunks = []
        while True:
            try:
                chunk = self._ssl.read(_RECORD_BYTES)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify
                self._eof = True
                break
            except ssl.SSLError as e:
                self._broken = e
                raise trio.BrokenResourceError(f"TLS error from the peer: {e.reason or e}") from e
            if not chunk:
                self._eof = True
                break
            chunks.append(chunk)
        self._plain = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._outgoing.pending and not self._sending:  # a post-handshake reply (TLS 1.3 key update)
            self._write_sealed_now()  # what the socket does not take goes out with the next write

    def _take(self, max_bytes: int | None) -> bytes:
        plain = self._plain
        if max_bytes is None or len(plain) <= max_bytes:
            self._plain = b""
            return plain
        self._plain = plain[max_bytes:]
        return plain[:max_bytes]

    # --- sending

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_frames((data,))

    async def send_frames(self, frames) -> None:  # noqa: ANN001 (an iterable of bytes-like)
        """Send each frame in TLS records of its own, all of them in one socket write."""
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this TLS stream")
        self._sending = True
        try:
            if self._broken is not None:
                raise trio.BrokenResourceError("this TLS connection broke earlier") from self._broken
            for frame in frames:
                if len(frame):
                    self._seal(frame)
            await self._send_sealed()
        except BaseException as e:  # cancelled or failed halfway: what is on the socket is unknown
            if self._broken is None:
                self._broken = e
            raise
        finally:
            self._sending = False

    def write_now(self, data: bytes | memoryview) -> bytes | memoryview:
        """edge/sockets.write_now for this stream: seal `data` and hand it to the kernel without
        waiting. Returns b"" when all of it went, `data` itself when none of it was sealed (a send is
        in progress, ciphertext is owed, or the caller is not trio's thread), else OWED (true,
        length 0): the rest of the ciphertext waits for the caller's next send_all."""
        if (self._sending or self._owed or self._broken is not None
                or threading.get_ident() != self._loop_thread):
            return data
        try:
            self._seal(data)
        except ssl.SSLError as e:
            self._broken = e
            return data  # the writer task's send_all meets the broken stream and ends the connection
        self._write_sealed_now()
        return OWED if self._owed else b""

    def _seal(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[self._ssl.write(view):]

    def _write_sealed_now(self) -> None:
        """Hand the owed ciphertext to the kernel without waiting; keep what it does not take."""
        owed = self._take_sealed()
        if not owed:
            return
        try:
            sent = os.write(self.transport_stream.socket.fileno(), owed)
        except OSError:  # full, or broken: the next send_all meets it
            sent = 0
        self._owed = memoryview(owed)[sent:] if sent < len(owed) else b""  # a view: megabytes are not copied again

    def _take_sealed(self) -> bytes | memoryview:
        """All ciphertext not yet on the socket, the owed first; none is left behind."""
        owed, self._owed = self._owed, b""
        if not self._outgoing.pending:
            return owed
        return b"".join((owed, self._outgoing.read())) if owed else self._outgoing.read()

    async def _send_sealed(self) -> None:
        data = self._take_sealed()
        if data:
            await self.transport_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    # --- closing

    async def aclose(self) -> None:
        """Close without waiting for the peer's close_notify (ours is offered if the socket takes it)."""
        if not self._sending and self._broken is None:
            try:
                self._ssl.unwrap()
            except (ssl.SSLError, ValueError):  # no close_notify from the peer yet, or no session at all
                pass
            self._write_sealed_now()
        await self.transport_stream.aclose()
