"""Memory bounds of the client port's state on a real 3-node cluster (issue 19, item 2).

Each story drives one bound past its limit with real clients (kazoo, raw sockets speaking
ZooKeeper's protocol) and checks the clear refusal, that the node is still up, and that
other clients, on the same node and on others, go on unharmed (docs/operations.md,
"Memory bounds").
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest
from kazoo.exceptions import QuotaExceededError

from clusterd import config as cfg
from metastore.core.watches import watch_cost
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode, Xid
from cluster_fixtures import Cluster, closed_by_server, copy_config, kazoo_session

pytestmark = pytest.mark.multiprocess

PER_CONNECTION = 64 << 10
PER_NODE = 160 << 10
MAX_SESSIONS = 40
LIMITS = f"""max_watch_bytes_per_connection = {PER_CONNECTION}
max_watch_bytes = {PER_NODE}
max_sessions = {MAX_SESSIONS}
"""
PATH = "/no-such-znode/" + "w" * 1000  # a long path: each exists watch costs watch_cost(PATH), about 1.5 kB


@pytest.fixture(scope="module")
def bounded(tmp_path_factory) -> Iterator[Cluster]:
    path = copy_config(tmp_path_factory.mktemp("bounds"))
    path.write_text(path.read_text().replace("[cluster]\n", "[cluster]\n" + LIMITS, 1))
    cluster = Cluster(path)
    up = cluster.ctl("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield cluster
    cluster.ctl("down", "--timeout", "5")


def nodes(cluster: Cluster) -> list[cfg.NodeConfig]:
    return list(cfg.load(cluster.path).nodes)


def client_stats(node: cfg.NodeConfig) -> dict:
    with urllib.request.urlopen(f"http://{node.host}:{node.admin_port}/status", timeout=10) as r:
        return json.load(r)["clients"]


def watch_until_refused(zk, prefix: str) -> int:
    """Exists watches on missing znodes `<PATH>-<prefix>-<i>` until one is refused; how many were set."""
    for i in range(10_000):
        try:
            zk.exists(f"{PATH}-{prefix}-{i}", watch=lambda event: None)
        except QuotaExceededError:
            return i
    pytest.fail("no watch was refused")


def test_a_connection_past_its_watch_bytes_is_refused_and_firing_makes_room(bounded: Cluster):
    """max_watch_bytes_per_connection (64 KiB here): exists watches on missing 1 kB paths are
    admitted until the next would pass it, then the read is refused with QUOTA_EXCEEDED (no
    watch set, nothing answered as if it were). A watch that fires frees its bytes; reads
    without a watch, and writes, go on meanwhile."""
    node = nodes(bounded)[0]
    cost = watch_cost(f"{PATH}-a-00")
    with kazoo_session(bounded, node.id) as zk:
        admitted = watch_until_refused(zk, "a")
        assert PER_CONNECTION // cost - 2 <= admitted <= PER_CONNECTION // cost, admitted
        assert zk.exists("/") is not None  # a read without a watch is served
        zk.ensure_path("/no-such-znode")
        zk.create(f"{PATH}-a-0")  # fires (and spends) the first exists watch: room for one more
        zk.exists(f"{PATH}-a-{admitted}", watch=lambda event: None)
        with pytest.raises(QuotaExceededError):
            zk.exists(f"{PATH}-a-{admitted + 1}", watch=lambda event: None)


def test_the_nodes_watch_bytes_bound_all_its_connections_and_not_other_nodes(bounded: Cluster):
    """max_watch_bytes (160 KiB here) bounds a node's connections together: two connections
    fill their own 64 KiB, a third is refused once the node's 160 KiB are held (before its
    own bound), a fourth at once; a client of another node is not. Closing the connections
    gives their watches' bytes back."""
    first, second = nodes(bounded)[1], nodes(bounded)[2]
    cost = watch_cost(f"{PATH}-b1-00")
    with kazoo_session(bounded, first.id) as one, kazoo_session(bounded, first.id) as two, \
            kazoo_session(bounded, first.id) as three:
        counts = [watch_until_refused(zk, f"b{i}") for i, zk in enumerate((one, two, three), start=1)]
        assert PER_NODE // cost - 4 <= sum(counts) <= PER_NODE // cost, counts
        assert counts[2] < counts[0] - 10, f"the third connection was not stopped by the node's bound: {counts}"
        with kazoo_session(bounded, first.id) as four:
            assert watch_until_refused(four, "b4") == 0
        with kazoo_session(bounded, second.id) as elsewhere:
            assert watch_until_refused(elsewhere, "b5") >= PER_CONNECTION // cost - 2
    with kazoo_session(bounded, first.id) as after:  # the closed connections' watches are gone
        assert watch_until_refused(after, "b6") >= PER_CONNECTION // cost - 2


def connect(node: cfg.NodeConfig) -> tuple[socket.socket, jute.ConnectResponse | None]:
    s = socket.create_connection((node.host, node.client_port), timeout=20)
    s.sendall(jute.frame(jute.encode_connect_request(jute.ConnectRequest(0, 0, 30_000, 0, b"\0" * 16, False))))
    reader, frames = jute.FrameReader(), []
    while not frames:
        data = s.recv(65536)
        if not data:
            return s, None
        frames = reader.feed(data)
    return s, jute.decode_connect_response(frames[0])


def test_set_watches_past_the_bound_closes_the_connection_and_sets_none(bounded: Cluster):
    """A setWatches (a reconnecting client's watches) that would pass the bound sets none and
    closes the connection: ZooKeeper's clients do not read its answer, so an error would leave
    them believing their watches set. The node goes on serving."""
    node = nodes(bounded)[0]
    s, resp = connect(node)
    assert resp is not None and resp.time_out > 0
    paths = tuple(f"{PATH}-c-{i}" for i in range(PER_CONNECTION // watch_cost(f"{PATH}-c-00") + 5))
    request = jute.SetWatches2(0, (), paths, (), (), ())
    s.sendall(jute.frame(jute.encode_request(jute.RequestHeader(Xid.SET_WATCHES, OpCode.SET_WATCHES2), request)))
    assert closed_by_server(s)
    s.close()
    with kazoo_session(bounded, node.id) as zk:
        assert watch_until_refused(zk, "c2") >= PER_CONNECTION // watch_cost(f"{PATH}-c2-00") - 2


def close_session(s: socket.socket) -> None:
    s.sendall(jute.frame(jute.encode_request(jute.RequestHeader(1, OpCode.CLOSE_SESSION))))
    closed_by_server(s)
    s.close()


def test_sessions_past_max_sessions_are_refused_and_a_closed_one_makes_room(bounded: Cluster):
    """max_sessions (40 here, the cluster's own services' sessions included): new sessions
    are opened through every node until the tree holds 40; the next ConnectRequest is closed
    unanswered (the client tries another server). A session already open keeps working, and
    once one closes a new one is admitted."""
    held: list[socket.socket] = []
    every = nodes(bounded)
    with kazoo_session(bounded) as zk:
        try:
            refused = None
            for i in range(MAX_SESSIONS + 1):
                s, resp = connect(every[i % 3])
                if resp is None:
                    refused = every[i % 3]
                    s.close()
                    break
                held.append(s)
            assert refused is not None, f"{len(held)} sessions opened past max_sessions {MAX_SESSIONS}"
            assert client_stats(refused)["sessions_refused"] >= 1
            zk.ensure_path("/still-served")  # a session already open is not touched
            for s in held[:3]:
                close_session(s)
            del held[:3]
            admitted = []
            for node in every:  # one of three freed places; the nodes' own services may take others
                s, resp = connect(node)
                admitted.append(resp is not None)
                held.append(s)
            assert any(admitted), "no session was admitted after three closed"
        finally:
            for s in held:
                s.close()
