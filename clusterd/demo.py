"""`clusterctl demo`: a fresh local cluster does real work through a crash, then proves it.

The story: start every node of the config on fresh data directories; several
clients write through different nodes (unique keys, plus compare-and-set
increments of one shared counter); a third of the way in, SIGKILL the leader
(or a follower, or every node); keep writing, retrying NoLeader and counting
OutcomeUnknown apart; restart what was killed with `clusterd` again; wait until
every node has committed the same zxid; then read every acknowledged write
back from every node. Exit status 1 if any acknowledged write is missing.

The demo never touches the config's own data directories: it runs on a copy
of the config under `<config folder>/data/demo/<timestamp>/`, kept afterwards
for inspection (`clusterctl --config <that>/cluster.toml status` and the logs).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from clusterd import config as cfg
from clusterd import localcluster
from clusterd.config import ClusterConfig, NodeConfig
from clusterd.kvclient import BadVersion, KVClient, KVError, OutcomeUnknown
from clusterd.localcluster import ClusterError
from zab.zxid import fmt

COUNTER = "demo/counter"
COUNTER_EVERY = 5  # one write in five is a counter increment
START_TIMEOUT_S = 30.0
CONVERGE_TIMEOUT_S = 60.0
CLIENT_RETRY_S = 60.0
READERS_PER_NODE = 4


@dataclass
class Record:
    """What the clients were told. Only acknowledged writes are promised to survive."""

    acked: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    counter_acked: int = 0
    counter_unknown: int = 0
    cas_conflicts: int = 0
    done: int = 0
    _milestones: list[tuple[int, trio.Event]] = field(default_factory=list)

    def finished_one(self) -> None:
        self.done += 1
        for threshold, event in self._milestones:
            if self.done >= threshold:
                event.set()

    async def wait_done(self, threshold: int) -> None:
        """Wait until `threshold` writes have finished (acknowledged or not)."""
        event = trio.Event()
        self._milestones.append((threshold, event))
        if self.done >= threshold:
            event.set()
        await event.wait()


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


def run(config: ClusterConfig, *, writes: int, clients: int, kill: str) -> int:
    """Run the demo on a copy of `config` with fresh data; the process exit status."""
    if len(config.voters) < 3 or writes < 3 or clients < 1:
        raise ClusterError("the demo needs at least 3 voters (a quorum survives a SIGKILL), 3 writes and 1 client")
    _refuse_if_running(config)
    demo = Demo(_fresh_copy(config))
    demo.say(f"demo cluster: {len(demo.nodes)} nodes, data and logs in {demo.config.path.parent}")
    try:
        return trio.run(_main, demo, writes, clients, kill)
    finally:
        demo.stop_all()
        demo.say("cluster stopped")


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


async def _main(demo: Demo, writes: int, clients: int, kill: str) -> int:
    demo.start(demo.nodes)
    statuses = await localcluster.wait_settled(demo.config, demo.nodes, timeout_s=START_TIMEOUT_S,
                                               children=demo.children)
    demo.say(f"cluster is up; node {_leader(statuses)} leads")
    addresses = demo.config.client_addresses()
    async with KVClient(addresses, retry_for_s=CLIENT_RETRY_S) as client:
        await client.put(COUNTER, "0", version=0)
    try:
        await _write_through_a_crash(demo, addresses, writes, clients, kill)
    except KVError as e:
        demo.say(f"verdict: FAIL: a client gave up: {type(e).__name__}: {e}")
        return 1
    await _wait_converged(demo)
    return await _verify(demo)


async def _write_through_a_crash(demo: Demo, addresses: list[tuple[str, int]], writes: int,
                                 clients: int, kill: str) -> None:
    victims = {"leader": "the leader", "follower": "a follower", "all": "every node"}[kill]
    demo.say(f"writing {writes} times from {clients} clients through different nodes; "
             f"SIGKILL of {victims} after {writes // 3}")
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_nemesis, demo, writes, kill)
        for i in range(clients):
            client = KVClient(addresses, start=i, retry_for_s=CLIENT_RETRY_S)
            nursery.start_soon(_writer, demo.record, client, range(i, writes, clients))
    elapsed = time.monotonic() - started
    r = demo.record
    demo.say(f"writes done in {elapsed:.1f} s ({r.done / elapsed:.0f}/s): {len(r.acked) + r.counter_acked} "
             f"acknowledged, {len(r.unknown) + r.counter_unknown} outcome unknown, "
             f"{r.cas_conflicts} counter CAS conflicts retried")


async def _writer(record: Record, client: KVClient, ops: range) -> None:
    async with client:
        for op in ops:
            if op % COUNTER_EVERY == 0:
                await _increment_counter(record, client)
            else:
                await _put_unique(record, client, f"demo/{op:06d}", f"value-{op}")
            record.finished_one()


async def _put_unique(record: Record, client: KVClient, key: str, value: str) -> None:
    try:
        await client.put(key, value)
    except OutcomeUnknown:
        record.unknown[key] = value
        return
    record.acked[key] = value


async def _increment_counter(record: Record, client: KVClient) -> None:
    """Compare-and-set loop: read, write value+1 at the version read, retry on conflict."""
    while True:
        item = await client.get(COUNTER)
        if item is None:  # created through another node: not visible on this one yet
            await trio.sleep(0.01)
            continue
        try:
            await client.put(COUNTER, str(int(item.value) + 1), version=item.version)
        except BadVersion:
            record.cas_conflicts += 1
            continue
        except OutcomeUnknown:
            record.counter_unknown += 1
            return
        record.counter_acked += 1
        return


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


async def _verify(demo: Demo) -> int:
    statuses = await localcluster.fetch_statuses(demo.config)
    print(localcluster.format_table([localcluster.status_row(i, s) for i, s in statuses.items()]), flush=True)
    views = {n.id: await _read_all(n, [COUNTER, *demo.record.acked, *demo.record.unknown]) for n in demo.nodes}
    problems = _check(demo.record, views)
    for problem in problems[:10]:
        demo.say(f"  {problem}")
    demo.say(_verdict(demo.record, views, problems))
    return 1 if problems else 0


async def _read_all(node: NodeConfig, keys: list[str]) -> dict[str, str | None]:
    """Every key's value as `node` alone sees it (None: absent)."""
    values: dict[str, str | None] = {}

    async def reader(share: list[str]) -> None:
        async with KVClient([(node.host, node.client_port)], retry_for_s=10.0) as client:
            for key in share:
                item = await client.get(key)
                values[key] = None if item is None else item.value

    async with trio.open_nursery() as nursery:
        for i in range(READERS_PER_NODE):
            nursery.start_soon(reader, keys[i::READERS_PER_NODE])
    return values


def _check(record: Record, views: dict[int, dict[str, str | None]]) -> list[str]:
    problems = []
    for node_id, view in views.items():
        problems += [f"node {node_id}: acknowledged {key} = {value!r}, reads {view[key]!r}"
                     for key, value in record.acked.items() if view[key] != value]
        problems += [f"node {node_id}: {key} (outcome unknown) reads {view[key]!r}, never written"
                     for key, value in record.unknown.items() if view[key] not in (None, value)]
        counter = int(view[COUNTER] or -1)
        if not record.counter_acked <= counter <= record.counter_acked + record.counter_unknown:
            problems.append(f"node {node_id}: counter is {counter}, but {record.counter_acked} increments were "
                            f"acknowledged and {record.counter_unknown} had unknown outcome")
    first, *others = views.values()
    problems += [f"nodes disagree about {key}" for key in first for view in others if view[key] != first[key]]
    return problems


def _verdict(record: Record, views: dict[int, dict[str, str | None]], problems: list[str]) -> str:
    acked = len(record.acked) + record.counter_acked
    if problems:
        return f"verdict: FAIL: {len(problems)} problems with {acked} acknowledged writes on {len(views)} nodes"
    view = next(iter(views.values()))  # all views are equal, or there would be problems
    counter = int(view[COUNTER] or 0)
    landed = sum(1 for key in record.unknown if view[key] is not None) + counter - record.counter_acked
    return (f"verdict: OK: all {acked} acknowledged writes ({len(record.acked)} puts, {record.counter_acked} "
            f"counter increments) read back on all {len(views)} nodes; counter = {counter}; "
            f"{len(record.unknown) + record.counter_unknown} writes had an unknown outcome, {landed} of them landed")
