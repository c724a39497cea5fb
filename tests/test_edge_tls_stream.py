"""edge/tls_stream.py on real sockets (a loopback pair) with real TLS, in process.

What the ports rely on: every record one socket read brought comes back from one receive_some;
send_frames puts each frame in records of its own; write_now seals and writes at once, owes the
rest of the ciphertext to the next send_all when the socket is full, and declines off trio's
thread; hostile bytes end the connection with BrokenResourceError, never anything else.
"""

from __future__ import annotations

import socket
import ssl
import struct

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterd.tls_context import client_context
from clusterd.ctl.tls_material import issue, new_authority, node_uri, write_cert, write_pair
from edge.tls_stream import OWED, TlsStream

APPLICATION_DATA = 23


@pytest.fixture(scope="module")
def contexts(tmp_path_factory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    folder = tmp_path_factory.mktemp("tls-stream")
    ca = new_authority("test CA")
    write_cert(folder / "ca.pem", ca.cert)
    key, cert = issue(ca, "quire-node-1", hosts=("127.0.0.1",), uris=(node_uri(1),))
    write_pair(folder / "node.key", folder / "node.pem", key, cert)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(folder / "node.pem", folder / "node.key")
    server.load_verify_locations(folder / "ca.pem")
    server.verify_mode = ssl.CERT_REQUIRED
    return server, client_context(folder / "ca.pem", folder / "node.pem", folder / "node.key", check_hostname=False)


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def connected(contexts) -> tuple[TlsStream, TlsStream]:
    raw_server, raw_client = socket_pair()
    server = TlsStream(raw_server, contexts[0], server_side=True)
    client = TlsStream(raw_client, contexts[1], server_side=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    # TLS 1.3 session tickets follow the handshake: the client reads them with the pong, so that
    # its socket holds nothing unread (a close would reset the connection).
    await client.send_all(b"ping")
    assert await server.receive_some() == b"ping"
    await server.send_all(b"pong")
    assert await client.receive_some() == b"pong"
    return server, client


def records(raw: bytes) -> list[tuple[int, int]]:
    """(content type, length) of each TLS record in `raw`, which must hold whole records."""
    found, at = [], 0
    while at < len(raw):
        kind, _version, length = struct.unpack_from(">BHH", raw, at)
        found.append((kind, length))
        at += 5 + length
    assert at == len(raw)
    return found


def test_send_frames_seals_each_frame_alone_and_one_read_returns_them_all(contexts) -> None:
    frames = [b"reply %03d " % i * 3 for i in range(50)]

    async def main() -> None:
        server, client = await connected(contexts)
        await client.send_frames(frames)
        raw = await server.transport_stream.receive_some(1 << 20)
        sealed = records(raw)
        assert [kind for kind, _ in sealed] == [APPLICATION_DATA] * 50  # one record per frame
        server._incoming.write(raw)  # as if the server's own read had brought them
        assert await server.receive_some() == b"".join(frames)  # all 50 from one call

    trio.run(main)


def test_receive_some_keeps_what_max_bytes_leaves(contexts) -> None:
    async def main() -> None:
        server, client = await connected(contexts)
        await client.send_all(b"0123456789")
        assert await server.receive_some(4) == b"0123"
        assert await server.receive_some(100) == b"456789"

    trio.run(main)


def test_write_now_owes_what_a_full_socket_did_not_take(contexts) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: more than a socket pair buffers

    async def main() -> None:
        server, client = await connected(contexts)
        assert client.write_now(b"small") == b""  # all of it went
        assert await server.receive_some() == b"small"
        assert client.write_now(payload) is OWED  # the socket took part of the ciphertext
        assert len(OWED) == 0 and OWED
        assert client.write_now(b"later") == b"later"  # nothing sealed while ciphertext is owed
        got = bytearray()

        async def read_all() -> None:
            while len(got) < len(payload) + 5:
                got.extend(await server.receive_some())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await client.send_frames([OWED, b"later"])  # the owed ciphertext first, then the rest
        assert bytes(got) == payload + b"later"

    trio.run(main)


def test_write_now_declines_off_trios_thread(contexts) -> None:
    async def main() -> None:
        server, client = await connected(contexts)
        data = b"from a worker thread"
        assert await trio.to_thread.run_sync(client.write_now, data) is data  # not sealed, not sent
        await client.send_all(data)
        assert await server.receive_some() == data

    trio.run(main)


def test_end_without_close_notify_is_an_end(contexts) -> None:
    async def main() -> None:
        server, client = await connected(contexts)
        await client.transport_stream.aclose()  # no close_notify
        assert await server.receive_some() == b""
        server2, client2 = await connected(contexts)
        await client2.aclose()  # close_notify offered
        assert await server2.receive_some() == b""

    trio.run(main)


def test_garbage_after_the_handshake_breaks_the_connection(contexts) -> None:
    async def main() -> None:
        server, client = await connected(contexts)
        await client.transport_stream.send_all(bytes([APPLICATION_DATA, 3, 3, 0, 40]) + b"\x00" * 40)
        with pytest.raises(trio.BrokenResourceError) as caught:
            await server.receive_some()
        assert isinstance(caught.value.__cause__, ssl.SSLError)
        with pytest.raises(trio.BrokenResourceError):
            await server.send_all(b"answer")  # a broken connection stays broken

    trio.run(main)


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600), st.booleans())
def test_hostile_bytes_end_the_handshake_with_broken_resource(contexts, garbage: bytes, record: bool) -> None:
    """Whatever a stranger sends instead of a ClientHello (raw, or inside a handshake record
    header), the server's handshake ends in BrokenResourceError once the stranger hangs up."""
    if record:
        garbage = struct.pack(">BHH", 22, 0x0301, len(garbage)) + garbage

    async def main() -> None:
        raw_server, raw_client = socket_pair()
        server = TlsStream(raw_server, contexts[0], server_side=True)
        raw_client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
        await raw_client.send_all(garbage)
        await raw_client.aclose()
        with trio.fail_after(5):
            with pytest.raises(trio.BrokenResourceError):
                await server.do_handshake()
        await server.aclose()

    trio.run(main)
