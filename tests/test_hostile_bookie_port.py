"""Hostile input on the bookie port (issue 17): a real BookieService on loopback, raw sockets.

Each test is one way a client that is slow, silent, greedy or malicious could make a bookie
spend what it should not (CPU, memory, connections, time) or lose what it acknowledged; each
checks the bookie still serves a good client afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import trio.testing

from bookie import protocol as P
from bookie.client import BookieClient, BookiePool
from bookie.entry import Digester, DigestType, master_key
from bookie.errors import Overloaded
from bookie.service import BookieServiceConfig
from clusterd import config as cluster_config
from clusterd.daemon.bookie_node import service_config
from bookie_fixtures import serving_bookie, trio_test
from ledger.client import LedgerClient
from metastore.client import MetaClient
from cluster_fixtures import REPO, Cluster, copy_config
from edge.files import ensure_directory

KEY = master_key(b"secret")
DIGESTER = Digester(DigestType.CRC32C, b"secret")
MIB = 1 << 20


def entry(ledger: int, entry_id: int, payload: bytes | None = None) -> bytes:
    payload = payload if payload is not None else f"entry {entry_id}".encode()
    return DIGESTER.package(ledger, entry_id, entry_id - 1, 100 * (entry_id + 1), payload)


# -- 1. frame assembly is linear in the bytes received ------------------------------------

def test_a_trickled_5_mib_frame_is_assembled_with_linear_copying():
    """Fed 4 KiB at a time, a 5 MiB frame used to be re-copied whole on every read (about 3 GB of
    copying on the shared event loop); now each byte is copied a bounded number of times."""
    frame = P.encode_add(1, 7, 0, KEY, entry(7, 0, b"x" * (5 * MIB - 200)))
    splitter = P.FrameSplitter(6 * MIB)
    bodies = []
    for i in range(0, len(frame), 4096):
        bodies += splitter.feed(frame[i:i + 4096])
    assert len(bodies) == 1 and P.decode_request(bodies[0]).data == entry(7, 0, b"x" * (5 * MIB - 200))
    assert splitter.statistics()["bytes_copied"] <= 3 * len(frame)
    assert splitter.statistics()["pending_bytes"] == 0


def test_frames_split_at_every_boundary_still_come_out_whole_and_in_order():
    frames = [P.encode_add(i, 7, i, KEY, entry(7, i, bytes([i]) * (i * 37))) for i in range(20)]
    stream = b"".join(frames)
    for step in (1, 3, 8, 9, 100, 1000):
        splitter = P.FrameSplitter(1 * MIB)
        bodies = []
        for i in range(0, len(stream), step):
            bodies += splitter.feed(stream[i:i + step])
        assert [P.decode_request(b).entry_id for b in bodies] == list(range(20))
        assert splitter.statistics()["bytes_copied"] <= 3 * len(stream)


@trio_test
async def test_the_bookie_port_assembles_a_trickled_5_mib_add_in_linear_work(tmp_path):
    data = entry(7, 0, b"y" * (5 * MIB - 200))
    frame = P.encode_add(1, 7, 0, KEY, data)
    with trio.fail_after(60):
        async with serving_bookie(tmp_path) as service:
            stream = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with stream:
                for i in range(0, len(frame), 16384):
                    await stream.send_all(frame[i:i + 16384])
                    await trio.testing.wait_all_tasks_blocked()  # the bookie has read it: one read per chunk
                splitter = P.FrameSplitter(1 * MIB)
                answers = []
                while not answers:
                    answers += splitter.feed(await stream.receive_some(1 << 16))
                assert P.decode_response(answers[0]).status is P.Status.OK
            assert service.statistics()["frame_bytes_copied"] <= 3 * len(frame)
            async with BookieClient("127.0.0.1", service.port) as good:
                assert await good.read(7, 0) == data


# -- 2. timeouts, connection limits, bytes held per connection --------------------------------

async def _closed_by_bookie(stream: trio.SocketStream) -> bool:
    """Whether the bookie closed the connection (EOF or reset), reading whatever it sent first."""
    try:
        while await stream.receive_some(1 << 16):
            pass
    except trio.BrokenResourceError:
        pass
    return True


async def _served(service) -> None:
    """A good client is still served: an add, then reading it back."""
    async with BookieClient("127.0.0.1", service.port) as good:
        await good.add(99, 0, KEY, entry(99, 0))
        assert DIGESTER.verify(await good.read(99, 0)).payload == b"entry 0"


@trio_test
async def test_a_connection_that_sends_nothing_is_closed_after_the_handshake_timeout(tmp_path):
    config = BookieServiceConfig(handshake_timeout_ms=300)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path, config) as service:
            silent = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with silent:
                start = trio.current_time()
                assert await _closed_by_bookie(silent)
                assert trio.current_time() - start >= 0.25
            assert service.statistics()["timeouts"] == 1
            await _served(service)


@trio_test
async def test_a_connection_that_stops_mid_frame_is_closed_after_the_read_timeout(tmp_path):
    config = BookieServiceConfig(read_timeout_ms=300)
    frame = P.encode_add(2, 7, 1, KEY, entry(7, 1, b"z" * 100_000))
    with trio.fail_after(20):
        async with serving_bookie(tmp_path, config) as service:
            stalled = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with stalled:
                await stalled.send_all(P.encode_add(1, 7, 0, KEY, entry(7, 0)) + frame[:50_000])
                assert await _closed_by_bookie(stalled)  # after the answer to the complete add
            assert service.statistics()["timeouts"] == 1
            assert service.statistics()["connections_open"] == 0
            await _served(service)


@trio_test
async def test_a_connection_idle_between_frames_stays_open(tmp_path):
    """Pooled clients keep connections open between requests: only a stalled frame times out."""
    config = BookieServiceConfig(handshake_timeout_ms=200, read_timeout_ms=200)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path, config) as service:
            async with BookieClient("127.0.0.1", service.port) as pooled:
                await pooled.add(7, 0, KEY, entry(7, 0))
                await trio.sleep(0.6)
                await pooled.add(7, 1, KEY, entry(7, 1))
                assert service.statistics()["connections"] == 1
            assert service.statistics().get("timeouts", 0) == 0


@trio_test
async def test_connections_beyond_the_per_address_limit_are_refused_and_other_addresses_served(tmp_path):
    config = BookieServiceConfig(max_connections_per_address=3)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path, config) as service:
            held = [await trio.open_tcp_stream("127.0.0.1", service.port, local_address="127.0.0.1")
                    for _ in range(3)]
            for s in held:  # each accepted and served
                await s.send_all(P.encode_request(P.ReadLac(1, 5)))
                assert await s.receive_some(1 << 16)
            extra = await trio.open_tcp_stream("127.0.0.1", service.port, local_address="127.0.0.1")
            async with extra:
                assert await _closed_by_bookie(extra)
            assert service.statistics()["connections_refused"] == 1
            other = await trio.open_tcp_stream("127.0.0.1", service.port, local_address="127.0.0.2")
            async with other:
                await other.send_all(P.encode_request(P.ReadLac(1, 5)))
                assert await other.receive_some(1 << 16)
            await held.pop().aclose()
            await service.wait_connections_at_most(2)
            async with BookieClient("127.0.0.1", service.port) as good:  # a slot from 127.0.0.1 again
                await good.add(99, 0, KEY, entry(99, 0))
            for s in held:
                await s.aclose()


@trio_test
async def test_connections_beyond_the_total_limit_are_refused(tmp_path):
    config = BookieServiceConfig(max_connections=4)
    with trio.fail_after(20):
        async with serving_bookie(tmp_path, config) as service:
            held = []
            for i in range(4):
                s = await trio.open_tcp_stream("127.0.0.1", service.port, local_address=f"127.0.0.{i + 1}")
                await s.send_all(P.encode_request(P.ReadLac(1, 5)))
                assert await s.receive_some(1 << 16)
                held.append(s)
            extra = await trio.open_tcp_stream("127.0.0.1", service.port, local_address="127.0.0.9")
            async with extra:
                assert await _closed_by_bookie(extra)
            assert service.statistics()["connections_refused"] == 1
            for s in held:
                await s.aclose()
            await service.wait_connections_at_most(0)
            await _served(service)


@trio_test
async def test_a_client_that_never_reads_its_answers_is_cut_off(tmp_path):
    config = BookieServiceConfig(max_outgoing_bytes=1 * MIB)
    data = entry(7, 0, b"r" * 300_000)
    with trio.fail_after(30):
        async with serving_bookie(tmp_path, config) as service:
            async with BookieClient("127.0.0.1", service.port) as good:
                await good.add(7, 0, KEY, data)
            greedy = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with greedy:
                greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel takes little for it
                reads = b"".join(P.encode_request(P.ReadEntry(i, 7, 0)) for i in range(200))  # 60 MB of answers
                await greedy.send_all(reads)
                await service.wait_connections_at_most(0)
            assert service.statistics()["slow_readers_cut_off"] == 1
            await _served(service)


@contextmanager
def journal_held(service) -> Iterator[threading.Event]:
    """The bookie's journal fsync waits until the event given is set (adds stay in flight meanwhile);
    the real fsync is back after the block."""
    journal = service.storage._journal
    real_sync, release = journal.sync, threading.Event()

    def held_sync() -> None:
        release.wait(20)
        real_sync()

    journal.sync = held_sync
    try:
        yield release
    finally:
        release.set()
        journal.sync = real_sync


@trio_test
async def test_adds_beyond_max_in_flight_bytes_are_overloaded_until_the_journal_catches_up(tmp_path):
    """Adds a connection has in flight (held until their journal fsync) are bounded in bytes: past the
    limit they are answered OVERLOADED, which the writer retries (ledger/writer.py)."""
    config = BookieServiceConfig(max_in_flight_bytes=1_000_000)
    with trio.fail_after(30):
        async with serving_bookie(tmp_path, config) as service:
            async with BookieClient("127.0.0.1", service.port) as c:
                with journal_held(service) as release:
                    adds = [c.start_add(7, i, KEY, entry(7, i, b"a" * 300_000)) for i in range(4)]
                    with pytest.raises(Overloaded):
                        await adds[3].result()
                    release.set()
                    for p in adds[:3]:
                        assert await p.result() is None
                await c.add(7, 3, KEY, entry(7, 3, b"a" * 300_000))
                assert DIGESTER.verify(await c.read(7, 3)).entry_id == 3


@trio_test
async def test_adds_of_all_connections_are_bounded_together_by_max_in_flight_bytes_total(tmp_path):
    """Each connection stays within its own max_in_flight_bytes, but together they pass the bookie's
    max_in_flight_bytes_total: the add that would take them past it is answered OVERLOADED, on
    whichever connection it comes; once the journal catches up, adds are taken again."""
    config = BookieServiceConfig(max_in_flight_bytes=10_000_000, max_in_flight_bytes_total=1_000_000)
    with trio.fail_after(30):
        async with serving_bookie(tmp_path, config) as service:
            async with BookieClient("127.0.0.1", service.port) as one, BookieClient("127.0.0.1", service.port) as two:
                with journal_held(service) as release:
                    first = [one.start_add(7, i, KEY, entry(7, i, b"a" * 300_000)) for i in range(3)]
                    await trio.testing.wait_all_tasks_blocked()
                    with pytest.raises(Overloaded):
                        await two.start_add(8, 0, KEY, entry(8, 0, b"b" * 300_000)).result()
                    release.set()
                    for p in first:
                        assert await p.result() is None
                await two.add(8, 0, KEY, entry(8, 0, b"b" * 300_000))
                while service.in_flight_bytes_total:  # the answer leaves from the writer's thread first
                    await trio.sleep(0.01)


@trio_test
async def test_a_frame_announcing_more_than_the_maximum_is_refused_before_it_is_buffered(tmp_path):
    """BookKeeper's nettyMaxFrameSizeBytes: a header claiming 2 GiB is answered BAD_REQUEST and
    closed at once, without waiting for (or holding) its body."""
    with trio.fail_after(20):
        async with serving_bookie(tmp_path) as service:
            huge = await trio.open_tcp_stream("127.0.0.1", service.port)
            async with huge:
                head = struct.pack(">BBQQQB32s", P.VERSION, P.Kind.ADD, 77, 7, 0, 0, KEY)
                await huge.send_all(struct.pack(">II", 2**31, 0) + head)
                splitter, answers = P.FrameSplitter(MIB), []
                while chunk := await huge.receive_some(1 << 16):
                    answers += [P.decode_response(b) for b in splitter.feed(chunk)]
                assert [(a.request_id, a.status) for a in answers] == [(77, P.Status.BAD_REQUEST)]
            await _served(service)


def test_the_bookie_port_limits_come_from_cluster_toml(tmp_path):
    text = ("[cluster]\nbookie_handshake_timeout_ms = 1500\nbookie_read_timeout_ms = 2500\n"
            "bookie_max_connections = 40\nbookie_max_connections_per_address = 4\n"
            "bookie_max_in_flight_bytes = 9000000\nbookie_max_outgoing_bytes = 8000000\n"
            "bookie_max_in_flight_bytes_total = 70000000\nbookie_max_outgoing_bytes_total = 60000000\n\n")
    for i in (1, 2, 3):
        text += (f'[[node]]\nid = {i}\nhost = "127.0.0.1"\npeer_port = {30000 + i}\nclient_port = {31000 + i}\n'
                 f'admin_port = {32000 + i}\nbookie_port = {33000 + i}\nroles = ["voter", "bookie"]\n'
                 f'data_dir = "data/node{i}"\n\n')
    (tmp_path / "cluster.toml").write_text(text)
    config = service_config(cluster_config.load(tmp_path / "cluster.toml"))
    assert (config.handshake_timeout_ms, config.read_timeout_ms) == (1500, 2500)
    assert (config.max_connections, config.max_connections_per_address) == (40, 4)
    assert (config.max_in_flight_bytes, config.max_outgoing_bytes) == (9_000_000, 8_000_000)
    assert (config.max_in_flight_bytes_total, config.max_outgoing_bytes_total) == (70_000_000, 60_000_000)


# -- 3. fuzz after decoding: well-formed requests with extreme values -------------------------

GOOD_LEDGER = 4242  # the good client's; the fuzz never names it
OTHER_KEY = master_key(b"another password")
def mostly(valid, invalid):
    """`valid` fifteen times in sixteen: most requests pass the decoder and reach the storage."""
    return st.integers(0, 15).flatmap(lambda r: invalid if r == 0 else valid)


# Values at the edges of the range the decoder accepts, sometimes ones it refuses (Java's negative
# longs sent as u64, LACs below -1).
U64_IDS = mostly(st.one_of(st.integers(0, 3), st.sampled_from([P.MAX_ID - 1, P.MAX_ID])),
                 st.sampled_from([2**63, 2**64 - 1]))
I64_LACS = mostly(st.one_of(st.integers(-1, 4), st.sampled_from([P.MAX_ID - 1, P.MAX_ID])),
                  st.sampled_from([-2**63, -2]))
KEYS = st.one_of(st.sampled_from([KEY, OTHER_KEY]), st.binary(min_size=32, max_size=32))
KEY_SIZES = mostly(st.just(32), st.sampled_from([0, 1, 31, 33, 64]))  # odd sizes: the body's length is wrong


def _frame(body: bytes) -> bytes:
    return struct.pack(">II", len(body), P.crc32c(body)) + body


def _key(key: bytes, size: int) -> bytes:
    return (key * 3)[:size]


@st.composite
def packaged_entries(draw, ledger: int, entry_id: int) -> bytes:
    """A packaged entry with extreme fields: a LAC at or beyond the entry, huge lengths, another
    entry's ids, unknown digest types (the storage parses the header, never the digest)."""
    ids = draw(mostly(st.just((ledger, entry_id)), st.tuples(U64_IDS, U64_IDS)))
    lac = draw(mostly(st.sampled_from([-1, min(entry_id - 1, P.MAX_ID), min(max(-1, entry_id - 2), P.MAX_ID)]), I64_LACS))
    length = draw(st.sampled_from([0, 1, 2**63, 2**64 - 1]))
    digest_type = draw(mostly(st.sampled_from([1, 2]), st.sampled_from([0, 3, 255])))
    return struct.pack(">QQqQB", *ids, lac, length, digest_type) + draw(mostly(st.binary(min_size=32, max_size=64), st.binary(max_size=31)))


@st.composite
def hostile_requests(draw, rid: int) -> bytes:
    """The body of one well-framed request whose fields take extreme values."""
    kind = draw(st.sampled_from(list(P.Kind)))
    ledger = draw(U64_IDS)
    key = _key(draw(KEYS), draw(KEY_SIZES))
    head = struct.pack(">BBQQ", P.VERSION, kind, rid, ledger)
    if kind is P.Kind.ADD:
        entry_id = draw(U64_IDS)
        flags = draw(mostly(st.sampled_from([0, 0, P.FLAG_RECOVERY_ADD]), st.just(0x80)))
        return head + struct.pack(">QB", entry_id, flags) + key + draw(packaged_entries(ledger, entry_id))
    if kind is P.Kind.READ:
        flags = draw(mostly(st.sampled_from([0, P.FLAG_FENCE]), st.just(0x02)))
        return head + struct.pack(">QB", draw(U64_IDS), flags) + (key if flags else b"")
    if kind is P.Kind.LONG_POLL:
        return head + struct.pack(">qI", draw(I64_LACS), draw(st.sampled_from([0, 1, 30, 2**32 - 1])))
    if kind is P.Kind.WRITE_LAC:
        return head + struct.pack(">q", draw(I64_LACS)) + key
    if kind is P.Kind.FENCE:
        return head + key
    return head  # READ_LAC


@st.composite
def hostile_sessions(draw) -> list[bytes]:
    return [draw(hostile_requests(rid)) for rid in range(draw(st.integers(1, 12)))]


async def _answers_until_done_or_closed(stream: trio.SocketStream, expected: int) -> list[P.Response]:
    """The bookie's answers, until there is one per request or it closes the connection."""
    splitter, answers = P.FrameSplitter(8 * MIB), []
    while len(answers) < expected:
        try:
            chunk = await stream.receive_some(1 << 16)
        except trio.BrokenResourceError:
            break
        if not chunk:
            break
        answers += [P.decode_response(b) for b in splitter.feed(chunk)]  # the bookie never sends a bad frame
    return answers


@settings(derandomize=True, database=None, max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_sessions())
def test_well_formed_requests_with_extreme_values_get_a_declared_answer_and_lose_nothing(tmp_path_factory, bodies):
    """Each request is answered with a declared status, or its connection is closed (BAD_REQUEST first
    when its id is readable); the bookie keeps serving a good client; every add it acknowledged, the
    fuzz's own included, reads back after a restart of the storage (its journal replayed)."""
    tmp_path = tmp_path_factory.mktemp("extreme")
    config = BookieServiceConfig(max_long_poll_ms=30, max_entry_bytes=4096)
    acked: dict[tuple[int, int], set[bytes]] = {}

    async def main():
        with trio.fail_after(30):
            async with serving_bookie(tmp_path, config) as service:
                async with BookieClient("127.0.0.1", service.port) as good:
                    await good.add(GOOD_LEDGER, 0, KEY, entry(GOOD_LEDGER, 0))
                    stream = await trio.open_tcp_stream("127.0.0.1", service.port)
                    async with stream:
                        await stream.send_all(b"".join(_frame(b) for b in bodies))
                        answers = await _answers_until_done_or_closed(stream, len(bodies))
                    rids = [a.request_id for a in answers]
                    assert len(set(rids)) == len(rids) and set(rids) <= set(range(len(bodies)))
                    for a in answers:
                        assert a.status in P.Status
                        if a.kind is P.Kind.ADD and a.status is P.Status.OK:
                            add = P.decode_request(bodies[a.request_id])
                            acked.setdefault((add.ledger_id, add.entry_id), set()).add(add.data)
                    await good.add(GOOD_LEDGER, 1, KEY, entry(GOOD_LEDGER, 1))
                    assert await good.read_lac(GOOD_LEDGER) == 0
            async with serving_bookie(tmp_path, config) as service:  # the storage reopened from its files
                async with BookieClient("127.0.0.1", service.port) as good:
                    for i in (0, 1):
                        assert await good.read(GOOD_LEDGER, i) == entry(GOOD_LEDGER, i)
                    for (ledger, entry_id), datas in acked.items():
                        assert await good.read(ledger, entry_id) in datas
                    await good.add(GOOD_LEDGER, 2, KEY, entry(GOOD_LEDGER, 2))
    trio.run(main)


# -- 4. files: 0600, directories 0700, each directory fsynced into its parent ------------------

DAEMON_PACKAGES = ("edge", "bookie", "zab", "metastore", "ledger", "clusterd", "stream", "tablespace")
# Files written outside any data dir, with modes of their own: TLS material (keys 0600, certificates
# 0644, in a 0700 directory) and the demo's scratch directory with its cluster.toml.
OUTSIDE_DATA_DIRS = ("clusterd/ctl/tls_material.py", "clusterd/demo/main.py")
_CREATES_DIRECTORY = re.compile(r"\.mkdir\(|os\.makedirs\(|os\.mkdir\(")
_CREATES_FILE = re.compile(r"O_CREAT|\.write_text\(|\.write_bytes\(|\bopen\([^)]*[\"'][wax]b?\+?[\"']")


def _creation_sites(pattern: re.Pattern[str]) -> list[str]:
    sites = []
    for package in DAEMON_PACKAGES:
        for path in sorted((REPO / package).glob("**/*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line.split("#")[0]):
                    sites.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return sites


def test_every_directory_is_created_through_ensure_directory():
    """ensure_directory makes it 0700 and fsyncs it into its parent (a directory entry not fsynced
    can vanish in a crash with everything written inside it); nothing else calls mkdir."""
    sites = [s for s in _creation_sites(_CREATES_DIRECTORY) if not s.startswith(OUTSIDE_DATA_DIRS + ("edge/files.py",))]
    assert sites == [], "create directories with edge.files.ensure_directory:\n" + "\n".join(sites)


def test_every_file_is_created_with_the_private_mode():
    sites = [s for s in _creation_sites(_CREATES_FILE) if "FILE_MODE" not in s and not s.startswith(OUTSIDE_DATA_DIRS)]
    assert sites == [], "create files with edge.files.FILE_MODE (0600):\n" + "\n".join(sites)


def test_ensure_directory_creates_each_missing_directory_0700_and_fsyncs_it_into_its_parent(tmp_path):
    old_umask = os.umask(0)  # the modes are the code's, not the umask's
    try:
        created = ensure_directory(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old_umask)
    assert created == [tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in created)
    assert ensure_directory(tmp_path / "a" / "b" / "c") == []  # nothing to create, nothing to fsync


def _modes_under(root: Path) -> dict[str, int]:
    """Every file and directory under root (root included; links not followed) and its permission bits."""
    modes = {".": stat.S_IMODE(root.stat().st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if not path.is_symlink():
                modes[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return modes


@trio_test
async def test_a_fresh_bookie_creates_private_files_and_directories(tmp_path):
    old_umask = os.umask(0)
    try:
        async with serving_bookie(tmp_path) as service, BookieClient("127.0.0.1", service.port) as c:
            for i in range(3):
                await c.add(7, i, KEY, entry(7, i))
            await service.storage.checkpoint()
    finally:
        os.umask(old_umask)
    modes = _modes_under(tmp_path / "bookie")
    assert {"journal", "entrylogs"} <= modes.keys()
    loose = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o700 if (tmp_path / "bookie" / name).is_dir() else 0o600)}
    assert loose == {}


@pytest.mark.multiprocess
def test_a_real_node_keeps_everything_under_its_data_dir_private(tmp_path):
    """Three real clusterd nodes with a fresh data dir (snapshots often): znode writes and a ledger
    append, then a clean stop; every file under each data dir is 0600 and every directory 0700."""
    path = copy_config(tmp_path)
    path.write_text(re.sub(r"(?m)^snapshot_every_txns = .*$", "snapshot_every_txns = 5", path.read_text()))
    cluster = Cluster(path)
    old_umask = os.umask(0o022)  # the usual umask: the modes must not come from it
    try:
        up = cluster.ctl("up", timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr

        async def writes():
            with trio.fail_after(60):
                async with MetaClient(cluster.config.client_addresses()) as meta, BookiePool(timeout_s=5.0) as pool, \
                        LedgerClient(meta, pool) as ledgers:
                    for i in range(20):
                        await meta.create(f"/private-{i}", b"x" * 100)
                    handle = await ledgers.create(3, 3, 2, password=b"pw")
                    for i in range(5):
                        await handle.append(f"entry {i}".encode())
                    await handle.close()
        trio.run(writes)
    finally:
        down = cluster.ctl("down", "--timeout", "10")
        os.umask(old_umask)
    assert down.returncode == 0, down.stdout + down.stderr
    for node in cluster.config.nodes:
        modes = _modes_under(node.data_dir)
        assert {"txnlog", "snapshots", "acceptedEpoch", "currentEpoch", "clusterd.log", "bookie", "bookie/cookie",
                "bookie/entrylogs"} <= modes.keys(), sorted(modes)
        assert any(name.startswith("snapshots/snapshot.") for name in modes), sorted(modes)
        assert any(name.startswith("bookie/journal/") for name in modes), sorted(modes)
        loose = {name: oct(mode) for name, mode in modes.items()
                 if mode != (0o700 if (node.data_dir / name).is_dir() else 0o600)}
        assert loose == {}, f"node {node.id}: {loose}"
