"""The table service on a real 3-node cluster: replicas and clients in processes of their own
(`clusterctl table serve`, tests/table_fixtures.py), a leader SIGKILLed while clients write, a
leader SIGSTOPped past its session and resumed, and a replica booting from a checkpoint after
the log's head was truncated."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
import trio

from cluster_fixtures import Cluster, copy_config, start_cluster, wait_for
from metastore.client import MetaClient
from table_fixtures import ReplicaProcess, spawn_client, wait_leader
from tablespace.client import TableClient

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = start_cluster(Cluster(copy_config(tmp_path_factory.mktemp("tables"))), timeout=120)
    yield c
    c.down()


@pytest.fixture
def replicas(cluster, tmp_path) -> Iterator[list]:
    started: list[ReplicaProcess] = []
    yield started
    for r in started:
        r.stop()


def create(cluster: Cluster, name: str) -> None:
    done = cluster.ctl("table", "create", name, "--roll-bytes", "20000")
    assert done.returncode == 0, done.stderr


def converged(replicas: list[ReplicaProcess], timeout_s: float = 30) -> dict:
    """Wait until every live replica reports the same position and digest; that status."""
    def same() -> bool:
        try:
            seen = {(s.get("position"), s.get("digest")) for s in (r.status() for r in replicas)}
        except OSError:
            return False
        return len(seen) == 1
    assert wait_for(same, timeout_s), [r.status() for r in replicas]
    return replicas[0].status()


def concurrent_puts(cluster: Cluster, tablespace: str, count: int) -> int:
    """`count` puts from as many tasks through one TableClient, each answered with version 0 of its
    own new key; the HTTP requests the client needed."""
    async def main() -> int:
        async with MetaClient(cluster.config.client_addresses()) as meta, TableClient(meta, tablespace) as t:
            versions: dict[int, int] = {}

            async def one(i: int) -> None:
                versions[i] = await t.put("c", f"key{i}", "v")
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(one, i)
            assert versions == {i: 0 for i in range(count)}
            assert [await t.get("c", f"key{i}") for i in (0, count - 1)] == [("v", 0), ("v", 0)]
            return t.requests
    return trio.run(main)


def outcomes(output: str) -> dict[str, list]:
    out: dict[str, list] = {"PUT": [], "INC": [], "UNKNOWN": [], "MISMATCH": [], "DONE": []}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0] in out:
            out[parts[0]].append(parts[1:])
    return out


def test_a_leader_sigkilled_under_four_clients_loses_no_acknowledged_change_and_applies_none_twice(
        cluster, replicas, tmp_path):
    create(cluster, "shop")
    replicas += [ReplicaProcess(cluster, "shop", f"r{i}", tmp_path) for i in range(3)]
    first = wait_leader(replicas)
    clients = [spawn_client(cluster, "shop", f"c{i}", 150) for i in range(4)]
    assert wait_for(lambda: first.status()["keys"] >= 100, 60)  # the clients are well into their writes
    first.signal(signal.SIGKILL)
    first.proc.wait(5)
    survivors = [r for r in replicas if r is not first]
    second = wait_leader(survivors)
    assert second is not first
    results = [c.communicate(timeout=120) for c in clients]
    for (out, err), c in zip(results, clients):
        assert c.returncode == 0 and "DONE" in out, err[-3000:]
    state = converged(survivors)
    for i, (out, _) in enumerate(results):
        o = outcomes(out)
        for key, version in o["PUT"]:  # every acknowledged put is there
            status, got = second.request("GET", f"/get?table=kv&key={key}")
            assert status == 200 and got["version"] >= int(version), (key, got)
        incs = [int(v) for (v,) in o["INC"]]
        assert len(set(incs)) == len(incs)  # no increment applied twice
        status, counter = second.request("GET", f"/get?table=kv&key=counter-c{i}")
        final = int(counter["value"])
        assert counter["version"] == final - 1  # each applied increment was one compare-and-set
        unknown = sum(1 for u in o["UNKNOWN"] if u[0] == "inc")
        assert max(incs) <= final <= len(incs) + unknown
    assert state["keys"] >= 4


def test_a_leader_paused_past_its_session_cannot_acknowledge_after_the_takeover(cluster, replicas, tmp_path):
    create(cluster, "paused")
    replicas += [ReplicaProcess(cluster, "paused", f"p{i}", tmp_path) for i in range(2)]
    old = wait_leader(replicas)
    assert old.request("POST", "/tx", {"ops": [{"op": "put", "table": "t", "key": "k", "value": "before"}]})[0] == 200
    old.signal(signal.SIGSTOP)
    try:
        new = wait_leader(replicas, timeout_s=40, exclude=old)  # the old one's session (4 s) expired
        assert new.request("POST", "/tx", {"ops": [{"op": "put", "table": "t", "key": "k", "value": "new"}]})[0] == 200
    finally:
        old.signal(signal.SIGCONT)
    status, answer = old.request("POST", "/tx", {"ops": [{"op": "put", "table": "t", "key": "k", "value": "zombie"}]},
                                 timeout=30)
    assert status in (421, 503), (status, answer)  # not the leader any more, or the write failed as fenced
    assert new.request("GET", "/get?table=t&key=k")[1]["value"] == "new"
    assert wait_for(lambda: old.status()["role"] == "follower", 30)
    converged(replicas)


def test_a_new_replica_boots_from_a_checkpoint_after_the_log_head_was_truncated(cluster, replicas, tmp_path):
    create(cluster, "boot")
    replicas.append(ReplicaProcess(cluster, "boot", "b0", tmp_path, "--checkpoint-every", "40"))
    leader = wait_leader(replicas)
    for i in range(300):
        status, _ = leader.request("POST", "/tx", {"ops": [{"op": "put", "table": "t", "key": f"k{i % 50}",
                                                           "value": "x" * 200 + str(i)}]})
        assert status == 200
    assert wait_for(lambda: leader.status()["checkpoints"] >= 3, 30)
    listed = cluster.ctl("log", "stat", "tablespace.boot", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["truncated_before"] != "0:0:0"  # the head is gone
    assert concurrent_puts(cluster, "boot", 200) < 100  # batched: fewer requests than puts
    too_large = {"ops": [{"op": "put", "table": "t", "key": "big", "value": "x" * 1_048_570}]}
    assert leader.request("POST", "/tx", too_large)[0] == 400 and leader.status()["role"] == "leader"
    fresh = ReplicaProcess(cluster, "boot", "b1", tmp_path)
    replicas.append(fresh)
    state = converged(replicas)
    assert state["keys"] == 250
    assert "event=tablespace_checkpoint_loaded" in fresh.log_text()
