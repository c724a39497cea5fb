"""Write unavailability during a reconfig, Quire beside ZooKeeper.

    python -m bench.reconfig [--rounds N] [--output FILE]

Issue 19's measure: how long writes stop while a voter is added and while the leader is removed,
against the election time after a leader SIGKILL (the target: no longer than that), on Quire and
on Apache ZooKeeper (Debian's `zookeeper` package, 3.8) in the same run.

Each round starts, one after the other (the order alternates from round to round), two fresh
clusters of the same shape, 3 voters plus nodes 4 and 5 as observers, all on 127.0.0.1:

* Quire (bench/quire.py): the 3 shipped voters, no bookies, plus 2 observers, `super_digest` set;
  the writer is our MetaClient (reconnect backoff 50 ms doubling to 1 s, jittered).
* ZooKeeper (bench/zk.py, `ZkEnsemble(reconfig=True, observers=2)`): a dynamic-config ensemble
  (`reconfigEnabled=true`, `standaloneEnabled=false`, 3.5-form server lines with the client
  port, `peerType=observer` on 4 and 5) with a super user; the writer is kazoo, its connection
  retry given the same bounds (50 ms doubling to 1 s, +-25 % jitter; kazoo waits after a full
  cycle over the servers, our client after each server). Roles are read with `srvr`.

In each cluster one writer runs over every node's client port, one setData after another (each
retried at once, after 5 ms, on an error, the way an application would), recording when each was
acknowledged. Three operations follow, each after 2 s of steady writes, and for each the longest
gap between consecutive acknowledgements from 0.5 s before the operation until 3 s after it
ended is its unavailability. The reconfigs go through a client of observer 5 authenticated as
the super user; a ConnectionLoss on them is ignored (the outcome is read back):

* promote: reconfig makes observer 4 a participant (3 -> 4 voters), done once node 4 is a
  follower (ZooKeeper: `reconfig(joining="server.4=...:participant;...")`; the observer sees its
  new role and rejoins the leader as a follower);
* remove leader: reconfig removes the leader (4 -> 3 voters), done once another voter leads
  (ZooKeeper: `reconfig(leaving="<leader id>")`; its leader hands off: it nominates the new
  leader in the committed config instead of an election after a timeout, and keeps running
  as a "non-voting follower", zookeeperReconfig.md "Removing servers" and "Performance
  Impact"; our removed leader steps down likewise and the others elect at once);
* SIGKILL leader: the baseline, the new leader's election after a crash (3 voters, one killed).

Under each operation the writer's errors (and kazoo's connection states) in the window are
printed, in ms from the operation's start, with its next acknowledgement. They show where
ZooKeeper's "remove leader" time goes (first runs, 2026-11-27): the hand-off itself is quick
(another voter leads within ~0.3-0.4 s), but the removed leader, once it commits the reconfig,
stops committing (Leader.tryToCommit: "not the designated leader anymore, setting
allowedToCommit=false") and keeps its client connections until its own quorum check, every
tickTime (2 s, the shipped default here), finds its followers gone and shuts it down. A writer
connected to it waits that long without an error: in the second run the writer saw nothing
until a ConnectionLoss at +1.8 s and was acknowledged by another server 50 ms later (which
server it had been on is not recorded; the other servers drop their clients within ~0.15 s).

Prints a markdown table (median and max over the rounds for each system, each system's ratio to
its own SIGKILL row, and Quire / ZooKeeper of the medians); `--output` also writes it to a file.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench import stats, zk
from bench.machine import cpu_model, mem_total_gib
from bench.quire import QuireCluster
from metastore.client import MetaClient
from metastore.errors import ConnectionLoss, MetastoreError
from zab.core.ensemble import parse_spec

SUPER_DIGEST = zk.SUPER_DIGEST  # "super:test"
STEADY_S = 2.0
BEFORE_S = 0.5
AFTER_S = 3.0
RETRY_AFTER_ERROR_S = 0.005
PROBE = "/bench-reconfig"
SYSTEMS = ("Quire", "ZooKeeper")
PROMOTE, REMOVE, KILL = "promote observer to voter", "remove the leader", "SIGKILL the leader"
# kazoo's reconnect loop, with the bounds of our client's backoff (metastore/client/session.py)
KAZOO_CONNECTION_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_jitter": 0.25, "max_delay": 1.0}


@dataclass
class Acks:
    """Acknowledgement times of one sequential writer."""

    acked: list[float] = field(default_factory=list)
    errors: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)  # errors and connection states, timed

    def note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement within [start, end]."""
        times = [start] + [t for t in list(self.acked) if start <= t <= end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


def _report(writer: Acks, name: str, start: float, end: float) -> float:
    """Prints the operation's gap and what the writer saw in its window (times from the operation's start)."""
    gap = writer.gap(start - BEFORE_S, end + AFTER_S)
    print(f"  {name}: {gap * 1000:.0f} ms without a write (operation took {(end - start) * 1000:.0f} ms)")
    seen = [(t, what) for t, what in list(writer.events) if start - BEFORE_S <= t <= end + AFTER_S]
    if seen:
        resumed = next((t for t in list(writer.acked) if t > seen[-1][0]), None)
        print(f"    writer (ms from the start): {', '.join(f'{what} {1000 * (t - start):+.0f}' for t, what in seen)}"
              + (f"; next ack {1000 * (resumed - start):+.0f}" if resumed else ""))
    return gap


# -- Quire -------------------------------------------------------------------------------------


class Writer(Acks):
    """Our MetaClient, one setData after another."""

    async def run(self, hosts: list[tuple[str, int]], stop: trio.Event) -> None:
        async with MetaClient(hosts, session_timeout_ms=10_000) as c:
            await c.ensure_path(PROBE)
            n = 0
            while not stop.is_set():
                try:
                    await c.set(PROBE, b"%d" % n)
                    self.acked.append(time.monotonic())
                    n += 1
                except MetastoreError as e:
                    self.errors += 1
                    self.note(type(e).__name__)
                    await trio.sleep(RETRY_AFTER_ERROR_S)


async def _operation(writer: Acks, name: str, act) -> float:
    await trio.sleep(STEADY_S)
    start = time.monotonic()
    await act()
    end = time.monotonic()
    await trio.sleep(AFTER_S)
    return _report(writer, name, start, end)


async def _wait_leader(cluster: QuireCluster, among: set[int], timeout_s: float = 30.0) -> int:
    with trio.fail_after(timeout_s):
        while True:
            statuses = await cluster.statuses()
            leaders = [i for i, s in statuses.items() if i in among and s and s["role"] == "leader"
                       and s["phase"] == "broadcast"]
            if leaders:
                return leaders[0]
            await trio.sleep(0.01)


async def _wait_role(cluster: QuireCluster, node: int, role: str, timeout_s: float = 30.0) -> None:
    with trio.fail_after(timeout_s):
        while not ((s := await cluster.status(node)) and s["role"] == role and s["phase"] == "broadcast"):
            await trio.sleep(0.01)


async def _reconfig(admin: MetaClient, **change: str) -> None:
    try:
        await admin.reconfig(**change)
    except ConnectionLoss:
        pass  # through a node that re-elects: the outcome is read back below


async def _round(cluster: QuireCluster) -> dict[str, float]:
    hosts = cluster.client_addresses()
    leader = await _wait_leader(cluster, {1, 2, 3})
    writer, stop = Writer(), trio.Event()
    gaps: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run, hosts, stop)
        async with MetaClient([cluster.client_address(5)], session_timeout_ms=10_000) as admin:
            await admin.add_auth("digest", "super:test")
            node4 = cluster.nodes[4]
            line = f"server.4={node4.host}:{node4.peer_port}:{node4.peer_port}:participant;{node4.host}:{node4.client_port}"

            async def promote() -> None:
                await _reconfig(admin, joining=line)
                await _wait_role(cluster, 4, "follower")
            gaps[PROMOTE] = await _operation(writer, "promote", promote)

            async def remove_leader() -> None:
                await _reconfig(admin, leaving=str(leader))
                await _wait_leader(cluster, {1, 2, 3, 4} - {leader})
            gaps[REMOVE] = await _operation(writer, "remove leader", remove_leader)
            data, _ = await admin.get("/zookeeper/config")
            assert leader not in parse_spec(data).voters, data

        voters = {1, 2, 3, 4} - {leader}
        current = await _wait_leader(cluster, voters)

        async def kill_leader() -> None:
            cluster.kill(current)
            await _wait_leader(cluster, voters - {current})
        gaps[KILL] = await _operation(writer, "SIGKILL leader", kill_leader)
        stop.set()
    print(f"  writes acknowledged: {len(writer.acked)}, errors retried: {writer.errors}")
    return gaps


def quire_round(folder: Path) -> dict[str, float]:
    cluster = QuireCluster(folder, bookies=False, observers=2)
    path = cluster.config.path
    path.write_text(path.read_text().replace("[cluster]\n", f'[cluster]\nsuper_digest = "{SUPER_DIGEST}"\n', 1))
    with cluster:
        cluster.start()
        trio.run(cluster.wait_all_broadcast)
        return trio.run(_round, cluster)


# -- ZooKeeper -------------------------------------------------------------------------------------


def _kazoo(hosts: str, **options):
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=10.0, **options)
    client.start(timeout=30)
    return client


def _close(client) -> None:
    try:
        client.stop()
    finally:
        client.close()


class ZkWriter(Acks):
    """A kazoo client over every server, one set() after another, in a thread of its own."""

    def __init__(self, hosts: str) -> None:
        super().__init__()
        from kazoo.exceptions import KazooException

        self.client = _kazoo(hosts, connection_retry=dict(KAZOO_CONNECTION_RETRY))
        self.client.add_listener(lambda state: self.note(str(state)))  # SUSPENDED, CONNECTED, LOST
        try:
            self.client.ensure_path(PROBE)
        except BaseException:
            _close(self.client)
            raise
        self._failures = (KazooException, self.client.handler.timeout_exception)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="zk-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.client.set_async(PROBE, b"%d" % n).get(timeout=10.0)
                self.acked.append(time.monotonic())
                n += 1
            except self._failures as e:
                self.errors += 1
                self.note(type(e).__name__)
                time.sleep(RETRY_AFTER_ERROR_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15.0)
        _close(self.client)


def _zk_operation(writer: Acks, name: str, act: Callable[[], None]) -> float:
    time.sleep(STEADY_S)
    start = time.monotonic()
    act()
    end = time.monotonic()
    time.sleep(AFTER_S)
    return _report(writer, name, start, end)


def _zk_wait(ensemble: zk.ZkEnsemble, among: set[int], mode: str, timeout_s: float = 30.0) -> int:
    """The first server of `among` whose `srvr` says `mode`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for i in sorted(among):
            if zk.mode(ensemble.client_ports[i], timeout_s=0.5) == mode:
                return i
        time.sleep(0.01)
    raise TimeoutError(f"no server of {sorted(among)} in mode {mode} after {timeout_s:g} s: {ensemble.modes()}")


def _zk_reconfig(admin, **change: str | None) -> None:
    from kazoo.exceptions import ConnectionLoss as KazooConnectionLoss

    try:
        admin.reconfig_async(change.get("joining"), change.get("leaving"), None, -1).get(timeout=30.0)
    except KazooConnectionLoss:
        pass  # through a server that re-elects (observer 5 drops its clients): the outcome is read back


def _zk_config(admin) -> str:
    admin.sync_async("/zookeeper/config").get(timeout=30.0)
    data, _ = admin.get_async("/zookeeper/config").get(timeout=30.0)
    return data.decode()


def _zk_round(ensemble: zk.ZkEnsemble) -> dict[str, float]:
    leader = ensemble.wait_serving(timeout_s=120.0)
    gaps: dict[str, float] = {}
    writer = ZkWriter(ensemble.hosts())
    try:
        admin = _kazoo(ensemble.hosts(5))
        try:
            admin.add_auth("digest", "super:test")

            def promote() -> None:
                _zk_reconfig(admin, joining=ensemble.server_line(4, "participant"))
                _zk_wait(ensemble, {4}, "follower")
            gaps[PROMOTE] = _zk_operation(writer, "promote", promote)
            assert f"{ensemble.server_line(4, 'participant')}\n" in _zk_config(admin) + "\n"

            def remove_leader() -> None:
                _zk_reconfig(admin, leaving=str(leader))
                _zk_wait(ensemble, {1, 2, 3, 4} - {leader}, "leader")
            gaps[REMOVE] = _zk_operation(writer, "remove leader", remove_leader)
            config = _zk_config(admin)
            assert f"server.{leader}=" not in config, config
        finally:
            _close(admin)
        print(f"  removed leader zk{leader} now: {zk.mode(ensemble.client_ports[leader])}")  # a non-voting follower

        voters = {1, 2, 3, 4} - {leader}
        current = _zk_wait(ensemble, voters, "leader")

        def kill_leader() -> None:
            ensemble.kill(current)
            _zk_wait(ensemble, voters - {current}, "leader")
        gaps[KILL] = _zk_operation(writer, "SIGKILL leader", kill_leader)
    finally:
        writer.stop()
    print(f"  writes acknowledged: {len(writer.acked)}, errors retried: {writer.errors}")
    return gaps


def zk_round(folder: Path) -> dict[str, float]:
    with zk.ZkEnsemble(folder, 5, reconfig=True, observers=2, super_digest=SUPER_DIGEST) as ensemble:
        ensemble.start()
        return _zk_round(ensemble)


# -- report ----------------------------------------------------------------------------------------


def table(rounds: dict[str, list[dict[str, float]]]) -> str:
    """One row per operation: per system median, max and median / its SIGKILL median; then Quire / ZooKeeper."""
    medians = {s: {name: stats.median([r[name] for r in rounds[s]]) for name in rounds[s][0]} for s in SYSTEMS}
    head = "| operation |"
    for s in SYSTEMS:
        head += f" {s} median ms | {s} max ms | {s} median / its SIGKILL |"
    lines = [head + " Quire / ZooKeeper (medians) |", "|---" * (2 + 3 * len(SYSTEMS)) + "|"]
    for name in rounds[SYSTEMS[0]][0]:
        row = f"| {name} |"
        for s in SYSTEMS:
            row += (f" {medians[s][name] * 1000:.0f} | {max(r[name] for r in rounds[s]) * 1000:.0f} "
                    f"| {medians[s][name] / medians[s][KILL]:.2f}x |")
        lines.append(row + f" {medians['Quire'][name] / medians['ZooKeeper'][name]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconfig", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    try:
        zk.classpath()
    except zk.ZkUnavailable as e:
        print(f"ZooKeeper cannot run here: {e}", file=sys.stderr)
        return 2
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # "Connection dropped" on every leader change
    runners = {"Quire": quire_round, "ZooKeeper": zk_round}
    work = Path(tempfile.mkdtemp(prefix="quire-bench-reconfig-"))
    try:
        rounds: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
        for r in range(args.rounds):
            for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                print(f"round {r + 1}/{args.rounds}: {system}")
                rounds[system].append(runners[system](work / f"round{r}-{system.lower()}"))
        text = (f"{cpu_model()}, {mem_total_gib():.0f} GiB; {args.rounds} rounds; "
                f"ZooKeeper {zk.version()}\n\n{table(rounds)}\n")
        print(text)
        if args.output:
            Path(args.output).write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
