"""Null znode data, kept apart from empty data end to end (issue 20, item 5), as ZooKeeper keeps it.

kazoo's own tests expect `create(path, None)` and `set(path, None)` to read back None, while
`create(path, b"")` reads back b"": ZooKeeper's jute buffer of length -1 is null, not empty. The
story, on a real 3-node cluster with real kazoo: a client writes null and empty data through a
follower (create, setData, a multi's create and setData); every node, read alone, answers None
for null and b"" for empty, with dataLength 0 for both; the nodes take snapshots meanwhile (every
20 transactions) and more null writes follow the last one, so a restart of every node restores
from a snapshot and replays the log; a follower whose data directory is wiped comes back through
a SNAP from the leader (snapshot format version 4); our own client (MetaClient) reads None too.
Then the pure parts: the transaction codec, the replay decoders, the getData and multiRead
answers on the wire."""

from __future__ import annotations

import os
import re
import shutil
import signal

import pytest
import trio

from bookie.registration import BookieInfo
from cluster_fixtures import Cluster, copy_config, kazoo_session, start_cluster, wait_for
from clusterd import localcluster
from ledger.autorecovery.planning import ReplicationTask
from ledger.manager import DEFAULT_ROOT
from ledger.metadata import ledger_path
from ledger.metadata import LedgerMetadataError, decode as decode_ledger
from metastore.client import MetaClient, ops
from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.core.responses import read_reply
from metastore.core.tree import DataTree
from metastore.core.txn import Create, SetData, Transaction, apply
from metastore.wire import jute
from metastore.wire.jute_defs import OpCode
from metastore.wire.snapshot_codec import decode_snapshot
from metastore.wire.txn_codec import decode_txn, encode_txn
from replay.verify_ledger_decode import ledgers_in
from stream.errors import CorruptMetadata
from stream.log_metadata import LogMetadata
from stream.segment import Segment
from zab.storage.recovery import SNAPSHOT_DIR
from zab.storage.snapshot import SnapshotStore

NULL_PATHS = ("/null/created", "/null/set", "/null/multi-created", "/null/multi-set")
EMPTY_PATHS = ("/null/empty", "/null/set-empty")
SNAPSHOT_EVERY_TXNS = 20


def null_data_cluster(tmp_path) -> Cluster:
    """Three voters (no bookies: a wiped node is then a Zab follower alone) that snapshot every 20
    transactions and send a SNAP to a follower more than 10 transactions behind (instead of the
    shipped 50,000 and 100,000)."""
    path = copy_config(tmp_path)
    text = re.sub(r"(?m)^bookie_port = .*\n", "", path.read_text()).replace('"voter", "bookie"', '"voter"')
    for key, value in {"snapshot_every_txns": SNAPSHOT_EVERY_TXNS, "sync_window_txns": 10}.items():
        text, found = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert found == 1, f"cluster.toml has no {key} line"
    path.write_text(text)
    return start_cluster(Cluster(path))


def leader_and_followers(cluster: Cluster) -> tuple[int, list[int]]:
    rows = cluster.status()
    leader = next(r["id"] for r in rows if r["role"] == "leader")
    return leader, [r["id"] for r in rows if r["id"] != leader]


async def multi_with_null_data(node) -> None:
    async with MetaClient([(node.host, node.client_port)]) as client:
        await client.multi([ops.Create("/null/multi-created", None), ops.SetData("/null/multi-set", None)])


def write_null_and_empty(cluster: Cluster, through: int) -> None:
    with kazoo_session(cluster, through, timeout=15) as zk:
        zk.create("/null")
        zk.create("/null/created", None)
        zk.create("/null/empty", b"")
        zk.create("/null/set", b"some data")
        zk.set("/null/set", None)
        zk.create("/null/set-empty", b"some data")
        zk.set("/null/set-empty", b"")
        zk.create("/null/multi-set", b"x")
        trio.run(multi_with_null_data, cluster.config.node(through))  # kazoo's transaction takes only bytes
        for i in range(2 * SNAPSHOT_EVERY_TXNS):  # snapshots on every node, holding the znodes above
            zk.create(f"/null/filler-{i}", None if i % 2 else b"")
        zk.set("/null/set", b"overwritten")  # after the last snapshot: the log alone says null again
        zk.set("/null/set", None)


def assert_every_node_keeps_null_apart(cluster: Cluster) -> None:
    for node in cluster.config.nodes:
        with kazoo_session(cluster, node.id, timeout=15) as zk:
            zk.sync("/null")
            for path in NULL_PATHS:
                data, stat = zk.get(path)
                assert data is None, f"node {node.id}: {path} reads {data!r}, not None"
                assert stat.dataLength == 0
            for path in EMPTY_PATHS:
                data, stat = zk.get(path)
                assert data == b"" and stat.dataLength == 0, f"node {node.id}: {path} reads {data!r}"
            assert zk.get("/null/filler-1")[0] is None and zk.get("/null/filler-2")[0] == b""


def newest_snapshot_tree(cluster: Cluster, node_id: int) -> tuple[int, DataTree]:
    zxid, body = SnapshotStore(cluster.config.node(node_id).data_dir / SNAPSHOT_DIR).newest_valid()
    return zxid, decode_snapshot(body)


def sigkill_wipe_and_restart(cluster: Cluster, node_id: int) -> None:
    node = cluster.config.node(node_id)
    os.kill(cluster.pids()[node_id], signal.SIGKILL)
    assert wait_for(lambda: not localcluster.is_clusterd(localcluster.read_pid_file(node)), 10)
    shutil.rmtree(node.data_dir)
    localcluster.spawn(cluster.config, node)


def converged(cluster: Cluster) -> bool:
    rows = cluster.status()
    return all(r["role"] in ("leader", "follower") for r in rows) and len({r["last_committed_zxid"] for r in rows}) == 1


@pytest.mark.multiprocess
def test_kazoo_null_data_reads_back_none_on_every_node_after_restarts_and_a_snap(tmp_path):
    cluster = null_data_cluster(tmp_path)
    try:
        leader, followers = leader_and_followers(cluster)
        write_null_and_empty(cluster, through=followers[0])  # forwarded to the leader
        assert_every_node_keeps_null_apart(cluster)

        zxid, snapshot = newest_snapshot_tree(cluster, followers[1])
        assert snapshot.get("/null/created")[0] is None and snapshot.get("/null/empty")[0] == b""
        assert snapshot.get("/null/set")[0] is None  # as of the snapshot; the log then sets it twice

        down = cluster.ctl("down", "--timeout", "10")
        assert down.returncode == 0, down.stdout + down.stderr
        start_cluster(cluster)  # every node: its newest snapshot, then its log after it
        assert_every_node_keeps_null_apart(cluster)

        leader, followers = leader_and_followers(cluster)
        sigkill_wipe_and_restart(cluster, followers[0])  # nothing left: a SNAP from the leader
        assert wait_for(lambda: converged(cluster), 60), cluster.status()
        zxid, snapped = newest_snapshot_tree(cluster, followers[0])  # the SNAP's, as the follower stored it
        assert snapped.get("/null/created")[0] is None and snapped.get("/null/empty")[0] == b""
        assert_every_node_keeps_null_apart(cluster)

        async def read_with_metaclient() -> tuple:
            node = cluster.config.node(followers[0])
            async with MetaClient([(node.host, node.client_port)]) as client:
                await client.create("/null/ours", b"to be nulled")
                await client.set("/null/ours", None)
                await client.create("/null/ours-empty", None)
                await client.set("/null/ours-empty", b"")
                return (await client.get("/null/created"), await client.get("/null/empty"),
                        await client.get("/null/ours"), await client.get("/null/ours-empty"))

        created, empty, ours, ours_empty = trio.run(read_with_metaclient)
        assert created[0] is None and created[1].data_length == 0
        assert empty[0] == b"" and ours[0] is None and ours_empty[0] == b""
    finally:
        cluster.down()


def test_the_transaction_codec_keeps_null_data_apart_from_empty_data():
    for body in (Create("/a", None, OPEN_ACL_UNSAFE, 0, 1), Create("/a", b"", OPEN_ACL_UNSAFE, 0, 1),
                 SetData("/a", None, 1), SetData("/a", b"", 1)):
        raw = encode_txn(Transaction(5, body))
        assert decode_txn(raw).body == body
        assert raw[0] == 1  # the format version stays 1: null data is a length no old decoder takes
    null, empty = (encode_txn(Transaction(5, Create("/a", d, OPEN_ACL_UNSAFE, 0, 1))) for d in (None, b""))
    assert null != empty and b"\xff\xff\xff\xff" in null


def test_a_ledger_znode_with_null_data_is_reported_broken_by_the_verifier_not_a_crash():
    tree = DataTree()
    ledger = ledger_path(DEFAULT_ROOT, 1)
    parts = ledger.split("/")[1:]
    for zxid, depth in enumerate(range(1, len(parts) + 1), 1):  # /quire, /quire/ledgers, ..., the ledger
        path = "/" + "/".join(parts[:depth])
        parent = tree.parent_cversion(path.rsplit("/", 1)[0] or "/") + 1
        apply(tree, zxid, Transaction(zxid, Create(path, None, OPEN_ACL_UNSAFE, 0, parent)))
    found, broken = ledgers_in(tree, DEFAULT_ROOT)
    assert found == [] and len(broken) == 1 and "null data" in broken[0] and ledger in broken[0]


def test_get_data_and_multi_read_answer_null_data_as_length_minus_one_on_the_wire():
    tree = DataTree()
    apply(tree, 1, Transaction(1, Create("/n", None, OPEN_ACL_UNSAFE, 0, 1)))
    apply(tree, 2, Transaction(2, Create("/e", b"", OPEN_ACL_UNSAFE, 0, 2)))
    get = read_reply(tree, OpCode.GET_DATA, jute.GetDataRequest("/n", False), 0, ())
    payload = jute.encode_reply(jute.ReplyHeader(1, 2, 0), get.body)
    assert payload[16:20] == b"\xff\xff\xff\xff"  # after the reply header: the null buffer
    assert jute.decode_reply(payload, OpCode.GET_DATA)[1].data is None
    many = jute.MultiRequest(((OpCode.GET_DATA, jute.GetDataRequest("/n", False)),
                              (OpCode.GET_DATA, jute.GetDataRequest("/e", False))))
    reply = read_reply(tree, OpCode.MULTI_READ, many, 0, ())
    results = jute.decode_reply(jute.encode_reply(jute.ReplyHeader(1, 2, 0), reply.body), OpCode.MULTI_READ)[1]
    assert [r.data for r in results.results] == [None, b""]
    assert [r.stat.data_length for r in results.results] == [0, 0]


def test_quires_own_records_holding_null_data_are_refused_by_name_not_by_a_type_error():
    # A ZooKeeper client (ACLs permitting) can write null data into any znode: each of Quire's
    # record decoders must refuse it with its own error, as it refuses other garbage.
    with pytest.raises(LedgerMetadataError, match="null"):
        decode_ledger(None)
    for decode in (LogMetadata.decode, Segment.decode):
        with pytest.raises(CorruptMetadata, match="null"):
            decode(None)
    for decode in (BookieInfo.from_json, ReplicationTask.from_json):
        with pytest.raises(ValueError):
            decode(None)
