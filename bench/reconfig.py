"""Write unavailability during a reconfig: `python -m bench.reconfig [--rounds N] [--output FILE]`.

Issue 19's measure: how long writes stop while a voter is added and while the leader is removed,
against the election time after a leader SIGKILL (the target: no longer than that).

Each round starts a fresh cluster (bench/quire.py: the 3 shipped voters, no bookies, plus
nodes 4 and 5 as observers, `super_digest` set) and runs one writer: our MetaClient over every
node's client port, one setData after another (each retried at once after an error, the way
an application would), recording when each was acknowledged. Three operations follow, each
after 2 s of steady writes, and for each the longest gap between consecutive acknowledgements
from 0.5 s before the operation until 3 s after it ended is its unavailability:

* promote: reconfig makes observer 4 a participant (3 -> 4 voters);
* remove leader: reconfig removes the leader (4 -> 3 voters; the others elect at once);
* SIGKILL leader: the baseline, the new leader's election after a crash (3 voters, one killed).

Prints a markdown table (median and max over the rounds) and the ratios to the SIGKILL row.
ZooKeeper is not run beside it: its reconfig needs a dynamic-config ensemble that bench/zk.py
does not start yet.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench import stats
from bench.machine import cpu_model, mem_total_gib
from bench.quire import QuireCluster
from metastore.client import MetaClient
from metastore.errors import ConnectionLoss, MetastoreError
from zab.core.ensemble import parse_spec

SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # "super:test"
STEADY_S = 2.0
BEFORE_S = 0.5
AFTER_S = 3.0
PROBE = "/bench-reconfig"


@dataclass
class Writer:
    """Acknowledgement times of one sequential writer."""

    acked: list[float] = field(default_factory=list)
    errors: int = 0

    async def run(self, hosts: list[tuple[str, int]], stop: trio.Event) -> None:
        async with MetaClient(hosts, session_timeout_ms=10_000) as c:
            await c.ensure_path(PROBE)
            n = 0
            while not stop.is_set():
                try:
                    await c.set(PROBE, b"%d" % n)
                    self.acked.append(time.monotonic())
                    n += 1
                except MetastoreError:
                    self.errors += 1
                    await trio.sleep(0.005)

    def gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement within [start, end]."""
        times = [start] + [t for t in self.acked if start <= t <= end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


async def _operation(cluster: QuireCluster, writer: Writer, name: str, act) -> float:
    await trio.sleep(STEADY_S)
    start = time.monotonic()
    await act()
    end = time.monotonic()
    await trio.sleep(AFTER_S)
    gap = writer.gap(start - BEFORE_S, end + AFTER_S)
    print(f"  {name}: {gap * 1000:.0f} ms without a write (operation took {(end - start) * 1000:.0f} ms)")
    return gap


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
            gaps["promote observer to voter"] = await _operation(cluster, writer, "promote", promote)

            async def remove_leader() -> None:
                await _reconfig(admin, leaving=str(leader))
                await _wait_leader(cluster, {1, 2, 3, 4} - {leader})
            gaps["remove the leader"] = await _operation(cluster, writer, "remove leader", remove_leader)
            data, _ = await admin.get("/zookeeper/config")
            assert leader not in parse_spec(data).voters, data

        voters = {1, 2, 3, 4} - {leader}
        current = await _wait_leader(cluster, voters)

        async def kill_leader() -> None:
            cluster.kill(current)
            await _wait_leader(cluster, voters - {current})
        gaps["SIGKILL the leader"] = await _operation(cluster, writer, "SIGKILL leader", kill_leader)
        stop.set()
    print(f"  writes acknowledged: {len(writer.acked)}, errors retried: {writer.errors}")
    return gaps


def one_round(folder: Path) -> dict[str, float]:
    cluster = QuireCluster(folder, bookies=False, observers=2)
    path = cluster.config.path
    path.write_text(path.read_text().replace("[cluster]\n", f'[cluster]\nsuper_digest = "{SUPER_DIGEST}"\n', 1))
    with cluster:
        cluster.start()
        trio.run(cluster.wait_all_broadcast)
        return trio.run(_round, cluster)


def table(rounds: list[dict[str, float]]) -> str:
    base = stats.median([r["SIGKILL the leader"] for r in rounds])
    lines = ["| operation | median ms | max ms | median / SIGKILL median |", "|---|---|---|---|"]
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        lines.append(f"| {name} | {stats.median(values) * 1000:.0f} | {max(values) * 1000:.0f} "
                     f"| {stats.median(values) / base:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconfig", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="quire-bench-reconfig-"))
    try:
        rounds = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}")
            rounds.append(one_round(work / f"round{r}"))
        text = f"{cpu_model()}, {mem_total_gib():.0f} GiB; {args.rounds} rounds\n\n{table(rounds)}\n"
        print(text)
        if args.output:
            Path(args.output).write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
