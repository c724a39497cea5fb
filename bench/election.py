"""Leader failover: SIGKILL the leader of 3 nodes, time until a new leader serves; repeat.

Two instants are recorded after the SIGKILL:

* leader: Quire, the first admin /status of a survivor that says role
  leader with phase broadcast; ZooKeeper, the first `srvr` of a survivor
  that says `Mode: leader` (ZooKeeper reports that as soon as it starts
  leading, before its followers have synced, so it is earlier in the
  protocol than Quire's phase broadcast);
* write: the first write acknowledged through the new leader: a fresh
  session opened on it once it was seen (Quire: the project's MetaClient;
  ZooKeeper: kazoo), then a setData of PROBE_ZNODE, retrying the connection
  every poll interval on both.

Survivors are polled every `poll_interval_s`. Between runs the killed node is
restarted and the benchmark waits until all three serve again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from bench import zk
from bench.quire import QuireCluster
from metastore.client import MetaClient
from metastore.errors import ZooKeeperError

LEADER_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 30.0
PROBE_ZNODE = "/bench-election"


@dataclass
class Sample:
    killed: str
    new_leader: str
    leader_s: float | None  # SIGKILL -> new leader seen; None if none within LEADER_TIMEOUT_S
    write_s: float | None  # SIGKILL -> first write acknowledged; None if it failed
    rejoin_s: float  # restart of the killed node -> all three serving again
    note: str = ""


# -- Quire -------------------------------------------------------------------------------


def run_quire(cluster: QuireCluster, runs: int, poll_interval_s: float) -> list[Sample]:
    cluster.start()
    return trio.run(_quire_runs, cluster, runs, poll_interval_s)


async def _quire_runs(cluster: QuireCluster, runs: int, poll_interval_s: float) -> list[Sample]:
    await cluster.wait_all_broadcast()
    async with MetaClient(cluster.client_addresses()) as client:  # the probe exists before the first kill
        await client.ensure_path(PROBE_ZNODE)
    samples = []
    for run in range(runs):
        samples.append(await _quire_one(cluster, run, poll_interval_s))
    return samples


async def _quire_one(cluster: QuireCluster, run: int, poll_interval_s: float) -> Sample:
    old = await cluster.leader()  # waits until all three are in broadcast
    survivors = [nid for nid in cluster.nodes if nid != old]
    t0 = trio.current_time()
    cluster.kill(old)
    new, leader_at = await _wait_quire_leader(cluster, survivors, poll_interval_s)
    write_at, note = None, ""
    if new is not None:
        try:
            write_at = await _quire_write(cluster.client_address(new), run, poll_interval_s)
        except ZooKeeperError as e:
            note = f"first write failed: {type(e).__name__}: {e}"
    else:
        note = f"no leader in broadcast within {LEADER_TIMEOUT_S:g} s"
    restarted = trio.current_time()
    cluster.start(old)
    await cluster.wait_all_broadcast(timeout_s=60.0)
    return Sample(f"node{old}", f"node{new}" if new else "-", leader_at and leader_at - t0,
                  write_at and write_at - t0, trio.current_time() - restarted, note)


async def _quire_write(address: tuple[str, int], run: int, poll_interval_s: float) -> float:
    """Open a session on the new leader and set the probe znode; returns when the set was acknowledged.

    Retries the connection within a poll interval, as kazoo does on the ZooKeeper side, so that
    neither client's backoff shows in the figure.
    """
    async with MetaClient([address], start_timeout_s=WRITE_TIMEOUT_S,
                          backoff_s=(poll_interval_s, poll_interval_s)) as client:
        await client.set(PROBE_ZNODE, str(run).encode())
        return trio.current_time()  # before the close: the figure is the write's acknowledgement


async def _wait_quire_leader(cluster: QuireCluster, survivors: list[int],
                             poll_interval_s: float) -> tuple[int | None, float | None]:
    found: list[tuple[int, float]] = []

    async def poll(nid: int, cancel: trio.CancelScope) -> None:
        while True:
            status = await cluster.status(nid, timeout_s=0.5)
            if status and status["role"] == "leader" and status.get("phase") == "broadcast":
                found.append((nid, trio.current_time()))
                cancel.cancel()
                return
            await trio.sleep(poll_interval_s)

    with trio.move_on_after(LEADER_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for nid in survivors:
                nursery.start_soon(poll, nid, nursery.cancel_scope)
    return found[0] if found else (None, None)


# -- ZooKeeper -----------------------------------------------------------------------------


def run_zk(ensemble: zk.ZkEnsemble, runs: int, poll_interval_s: float) -> list[Sample]:
    from kazoo.client import KazooClient

    ensemble.start()
    leader = ensemble.wait_serving()
    client = KazooClient(hosts=ensemble.hosts(leader))
    client.start(timeout=30)
    client.ensure_path(PROBE_ZNODE)
    client.stop()
    client.close()
    return [_zk_one(ensemble, run, poll_interval_s) for run in range(runs)]


def _zk_one(ensemble: zk.ZkEnsemble, run: int, poll_interval_s: float) -> Sample:
    old = ensemble.wait_serving()
    survivors = [i for i in ensemble.ids if i != old]
    t0 = time.monotonic()
    ensemble.kill(old)
    new, leader_at = _wait_zk_leader(ensemble, survivors, poll_interval_s)
    write_at, note = None, ""
    if new is not None:
        try:
            _zk_write(ensemble.hosts(new), run, poll_interval_s)
            write_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - kazoo raises many types; the sample records which
            note = f"first write failed: {type(e).__name__}: {e}"
    else:
        note = f"no `Mode: leader` within {LEADER_TIMEOUT_S:g} s"
    restarted = time.monotonic()
    ensemble.start(old)
    ensemble.wait_serving(timeout_s=120.0)
    return Sample(f"zk{old}", f"zk{new}" if new else "-", leader_at and leader_at - t0,
                  write_at and write_at - t0, time.monotonic() - restarted, note)


def _wait_zk_leader(ensemble: zk.ZkEnsemble, survivors: list[int],
                    poll_interval_s: float) -> tuple[int | None, float | None]:
    deadline = time.monotonic() + LEADER_TIMEOUT_S
    while time.monotonic() < deadline:
        for i in survivors:
            if zk.mode(ensemble.client_ports[i], timeout_s=0.5) == "leader":
                return i, time.monotonic()
        time.sleep(poll_interval_s)
    return None, None


def _zk_write(hosts: str, run: int, poll_interval_s: float) -> None:
    """Open a session on the new leader and set one znode; retries connecting every poll interval."""
    from kazoo.client import KazooClient

    retry = {"max_tries": -1, "delay": poll_interval_s, "backoff": 1, "max_jitter": 0.0,
             "max_delay": poll_interval_s}
    client = KazooClient(hosts=hosts, timeout=10.0, connection_retry=retry)
    try:
        client.start(timeout=WRITE_TIMEOUT_S)
        client.set(PROBE_ZNODE, str(run).encode())
    finally:
        client.stop()
        client.close()
