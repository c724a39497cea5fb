"""`clusterctl demo`: a fresh local cluster runs the metastore through a crash, then proves it.

The story: start every node of the config on fresh data directories; several
metastore clients (metastore.client.MetaClient, ZooKeeper's protocol), each
holding a session through a different node with an ephemeral node of its own,
create znodes, increment one shared counter with compare-and-set, and create a
few sequential znodes; a third of the way in, SIGKILL the leader (or a follower,
or every node); keep writing through the election, resolving every write whose
connection was lost in flight by reading it back; restart what was killed with
`clusterd` again; wait until every node has committed the same zxid; then read
every write back from every node, each through a session with that node alone,
and check that the ephemeral nodes lived as long as their sessions. Exit status 1
if anything acknowledged is missing. clusterd/demo/writers.py has the clients and
the naming scheme that makes every outcome knowable; clusterd/demo/check.py the
reading back.

The demo never touches the config's own data directories: it runs on a copy of the config
under `<config folder>/data/demo/<timestamp>/`, kept afterwards for inspection
(`clusterctl --config <that>/cluster.toml status` and the logs).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import trio

from clusterd import config as cfg
from clusterd.demo import check as demo_check, ledgers as demo_ledgers
from clusterd import localcluster
from clusterd.config import ClusterConfig, NodeConfig
from clusterd.demo.writers import COUNTER, COUNTER_LOG, MEMBERS, ROOT, SEQUENTIAL, DemoClients, GaveUp, Record
from clusterd.localcluster import ClusterError
from metastore.errors import MetastoreError
from zab.core.zxid import fmt

START_TIMEOUT_S = 30.0
CONVERGE_TIMEOUT_S = 60.0


class Demo:
    """One demo run: its cluster processes, its clock and its output."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.nodes = list(config.ensemble)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.record = Record()
        self._started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self._started:6.2f}s] {text}", flush=True)

    def start(self, nodes: Iterable[NodeConfig]) -> None:
        for node in nodes:
            self.children[node.id] = localcluster.spawn(self.config, node)

    def stop_all(self) -> None:
        pids = {i: c.pid for i, c in self.children.items() if c.poll() is None}
        localcluster.stop(pids)
        for node_id, child in self.children.items():
            child.wait()
            localcluster.remove_pid_file(self.config.node(node_id), child.pid)

    async def kill(self, node_ids: list[int]) -> None:
        for node_id in node_ids:
            self.children[node_id].send_signal(signal.SIGKILL)
        for node_id in node_ids:
            while self.children[node_id].poll() is None:  # our child: exits within moments
                await trio.sleep(0.01)

    def node_of(self, address: tuple[str, int] | None) -> str:
        return next((str(n.id) for n in self.nodes if (n.host, n.client_port) == address), "?")


def run(config: ClusterConfig, *, writes: int, clients: int, kill: str, ledger_entries: int = 5000,
        verify: bool = True) -> int:
    """Run the demo on a copy of `config` with fresh data; the process exit status."""
    if len(config.voters) < 3 or writes < 3 or clients < 1:
        raise ClusterError("the demo needs at least 3 voters (a quorum survives a SIGKILL), 3 writes and 1 client")
    _refuse_if_running(config)
    demo = Demo(_fresh_copy(config))
    demo.say(f"demo cluster: {len(demo.nodes)} nodes, data and logs in {demo.config.path.parent}")
    try:
        status = trio.run(_main, demo, writes, clients, kill, ledger_entries)
    finally:
        demo.stop_all()
        demo.say("cluster stopped")
    if not verify:
        return status
    return _verify_on_spark(demo) or status


def _verify_on_spark(demo: Demo) -> int:
    """The Spark verifiers (docs/verify.md) over the data the demo's nodes left: 0 if both pass."""
    worst = 0
    for target in ("zab", "ledgers"):
        demo.say(f"clusterctl verify {target}: checking every node's files on Spark (local mode)")
        done = subprocess.run([sys.executable, "-m", "clusterd.ctl.main", "--config", str(demo.config.path),
                               "verify", target], stdin=subprocess.DEVNULL)
        demo.say(f"verify {target}: " + ("every check passed" if done.returncode == 0
                                         else f"FAILED (exit status {done.returncode})"))
        worst = max(worst, done.returncode)
    return worst


def _refuse_if_running(config: ClusterConfig) -> None:
    running = {n.id: pid for n in config.nodes if (pid := localcluster.running_pid(n)) is not None}
    if running:
        raise ClusterError(f"nodes {sorted(running)} of {config.path} are running and the demo uses the same "
                           "ports: run `clusterctl down` first, or give the demo a config with other ports")


def _fresh_copy(config: ClusterConfig) -> ClusterConfig:
    run_dir = config.path.parent / "data" / "demo" / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():
        run_dir = run_dir.with_name(run_dir.name + "+")
    run_dir.mkdir(parents=True)
    nodes = tuple(dataclasses.replace(n, data_dir=run_dir / f"node{n.id}") for n in config.nodes)
    path = run_dir / "cluster.toml"
    path.write_text(cfg.to_toml(dataclasses.replace(config, nodes=nodes), run_dir))
    return cfg.load(path)


async def _main(demo: Demo, writes: int, clients: int, kill: str, ledger_entries: int) -> int:
    demo.start(demo.nodes)
    statuses = await localcluster.wait_settled(demo.config, demo.nodes, timeout_s=START_TIMEOUT_S,
                                               children=demo.children)
    demo.say(f"cluster is up; node {_leader(statuses)} leads")
    async with DemoClients(demo.config.client_addresses(), clients, demo.record, demo.say) as sessions:
        through = ", ".join(demo.node_of(c.meta.server if c.meta else None) for c in sessions.clients)
        demo.say(f"{clients} client sessions through nodes {through}, each with an ephemeral node {MEMBERS}/c<i>")
        try:
            await _write_through_a_crash(demo, sessions, writes, kill)
        except BaseExceptionGroup as group:
            error = _first_leaf(group)
            if not isinstance(error, (GaveUp, MetastoreError)):
                raise error from group  # ClusterError: clusterctl reports it
            demo.say(f"verdict: FAIL: a client gave up: {type(error).__name__}: {error}")
            return 1
        await _wait_converged(demo)
        status = await _verify(demo, sessions)
    demo.say("ledgers: a pipelined writer with a tailing reader, then a writer process SIGKILLed and its ledger "
             "recovered")
    problems = await demo_ledgers.run(demo.config, ledger_entries, demo.say)
    for problem in problems[:10]:
        demo.say(f"  {problem}")
    demo.say("ledger verdict: " + ("FAIL" if problems else "OK: every acknowledged entry read back intact, "
                                   "the killed writer's included"))
    return status or (1 if problems else 0)


async def _write_through_a_crash(demo: Demo, sessions: DemoClients, writes: int, kill: str) -> None:
    victims = {"leader": "the leader", "follower": "a follower", "all": "every node"}[kill]
    demo.say(f"writing {writes} times: znodes {ROOT}/w-<client>-<n>, compare-and-set increments of {COUNTER} "
             f"(each with its entry in {COUNTER_LOG} in the same multi), sequential znodes in {SEQUENTIAL}; "
             f"SIGKILL of {victims} after {writes // 3}")
    started = time.monotonic()
    count = len(sessions.clients)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_nemesis, demo, writes, kill)
        for i, client in enumerate(sessions.clients):
            nursery.start_soon(client.run, range(i, writes, count))
    elapsed = time.monotonic() - started
    r = demo.record
    redone = f"{r.redone} had not and {'was' if r.redone == 1 else 'were'} sent again"
    demo.say(f"writes done in {elapsed:.1f} s ({r.done / elapsed:.0f}/s): {sum(r.acked.values())} acknowledged; "
             f"{r.unknown} had an unknown outcome (connection lost in flight), resolved by reading back: "
             f"{sum(r.landed.values())} had landed, {redone}; {r.cas_conflicts} counter CAS conflicts retried")


async def _nemesis(demo: Demo, writes: int, kill: str) -> None:
    """A third of the way in, SIGKILL; restart two thirds in (at once if every node died)."""
    await demo.record.wait_done(writes // 3)
    leader = _leader(await localcluster.wait_settled(demo.config, demo.nodes, timeout_s=START_TIMEOUT_S))
    victims = {"leader": [leader], "all": [n.id for n in demo.nodes],
               "follower": [next(n.id for n in demo.nodes if n.id != leader)]}[kill]
    await demo.kill(victims)
    killed_at = time.monotonic()
    what = {"leader": "the leader", "follower": f"a follower of node {leader}", "all": "every node"}[kill]
    demo.say(f"SIGKILL node {', '.join(map(str, victims))} ({what}) after {demo.record.done} writes")
    if kill == "leader":
        new_leader = await _wait_new_leader(demo, leader)
        demo.say(f"node {new_leader} leads after {time.monotonic() - killed_at:.2f} s")
    if kill != "all":
        await demo.record.wait_done(2 * writes // 3)
    demo.start(demo.config.node(v) for v in victims)
    demo.say(f"restarted node {', '.join(map(str, victims))} after {demo.record.done} writes")


async def _wait_new_leader(demo: Demo, old: int) -> int:
    deadline = trio.current_time() + START_TIMEOUT_S
    while trio.current_time() < deadline:
        statuses = await localcluster.fetch_statuses(demo.config, timeout_s=0.5)
        leaders = [i for i, s in statuses.items() if s and s.get("role") == "leader" and i != old]
        if leaders:
            return leaders[0]
        await trio.sleep(0.02)
    raise ClusterError(f"no new leader within {START_TIMEOUT_S:g} s of killing node {old}")


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def _leader(statuses: dict[int, Any]) -> int:
    return next(i for i, s in statuses.items() if s and s.get("role") == "leader")


async def _wait_converged(demo: Demo) -> None:
    """Until every node is settled and reports the same last committed zxid."""
    demo.say("waiting until every node has committed the same zxid")
    deadline = trio.current_time() + CONVERGE_TIMEOUT_S
    while True:
        statuses = await localcluster.fetch_statuses(demo.config, timeout_s=1.0)
        committed = {s["last_committed_zxid"] for s in statuses.values() if s}
        if localcluster.is_settled(statuses) and len(committed) == 1:
            demo.say(f"every node has committed {fmt(committed.pop())}; reading every write back from every node")
            return
        if trio.current_time() > deadline:
            raise ClusterError(f"nodes did not converge within {CONVERGE_TIMEOUT_S:g} s: {statuses}")
        await trio.sleep(0.1)


async def _verify(demo: Demo, sessions: DemoClients) -> int:
    statuses = await localcluster.fetch_statuses(demo.config)
    print(localcluster.format_table([localcluster.status_row(i, s) for i, s in statuses.items()]), flush=True)
    record = demo.record
    views = [await demo_check.read_node(node, record) for node in demo.nodes]
    problems = demo_check.check(record, sessions.clients, views)
    view = views[0]
    created = sum(path.startswith(f"{ROOT}/w-") for path in view.children[ROOT])
    demo.say(f"each node, alone after a sync: {created} znodes {ROOT}/w-*, {COUNTER} = "
             f"{(view.data[COUNTER] or b'?').decode()}, {len(view.children[COUNTER_LOG])} entries in {COUNTER_LOG}, "
             f"{len(view.children[SEQUENTIAL])} sequential znodes, {len(view.owners)} ephemeral nodes held by "
             f"the live sessions" + ("" if not problems else " (node 1's view; see the problems below)"))
    members = len(sessions.clients)
    await sessions.close()
    for node in demo.nodes:
        left = await demo_check.read_members(node)
        if left:
            problems.append(f"node {node.id}: ephemeral nodes {left} outlived their closed sessions")
    if not any("outlived" in p for p in problems):
        demo.say(f"closed the {members} client sessions: their ephemeral nodes are gone on every node")
    for problem in problems[:10]:
        demo.say(f"  {problem}")
    demo.say(demo_check.verdict(record, views, members, problems))
    return 1 if problems else 0
