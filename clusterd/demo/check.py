"""The end of `clusterctl demo`: read everything back from every node, alone, and compare
it with what the clients were told (clusterd/demo/writers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from clusterd.config import NodeConfig
from clusterd.demo.writers import (COUNTER, COUNTER_LOG, MEMBERS, PARENTS, ROOT, SEQUENTIAL,
                                   SESSION_TIMEOUT_MS, DemoClient, Kind, Record)
from metastore.client import MetaClient
from metastore.errors import NoNode

READS_IN_FLIGHT = 64
START_TIMEOUT_S = 15.0


@dataclass
class NodeView:
    """One node's tree as far as the demo cares, read through a session with that node only."""

    node_id: int
    data: dict[str, bytes | None]  # path -> data (None: absent)
    children: dict[str, list[str]]  # each parent of PARENTS -> its children's full paths
    owners: dict[str, int]  # each member node present -> its ephemeral owner (session id)

    def comparable(self) -> tuple[object, ...]:
        return (self.data, {p: sorted(c) for p, c in self.children.items()}, self.owners)


async def read_node(node: NodeConfig, record: Record) -> NodeView:
    """Sync the node with the leader, then read every znode the record names and every child
    of the demo's parents, many reads in flight on one session."""
    async with MetaClient([(node.host, node.client_port)], session_timeout_ms=SESSION_TIMEOUT_MS,
                          start_timeout_s=START_TIMEOUT_S) as meta:
        await meta.sync("/")
        children = {parent: [f"{parent}/{c}" for c in await meta.children(parent)] for parent in PARENTS}
        paths = sorted({COUNTER, *record.znodes, *children[ROOT], *children[COUNTER_LOG], *children[SEQUENTIAL]}
                       - set(PARENTS))
        data: dict[str, bytes | None] = {}
        slots = trio.Semaphore(READS_IN_FLIGHT)

        async def read(path: str) -> None:
            async with slots:
                try:
                    data[path] = (await meta.get(path))[0]
                except NoNode:
                    data[path] = None

        async with trio.open_nursery() as nursery:
            for path in paths:
                nursery.start_soon(read, path)
        owners = {}
        for member in children[MEMBERS]:
            stat = await meta.exists(member)
            if stat is not None:
                owners[member] = stat.ephemeral_owner
    return NodeView(node.id, data, children, owners)


async def read_members(node: NodeConfig) -> list[str]:
    """The member (ephemeral) nodes as `node` sees them after a sync."""
    async with MetaClient([(node.host, node.client_port)], session_timeout_ms=SESSION_TIMEOUT_MS,
                          start_timeout_s=START_TIMEOUT_S) as meta:
        return await meta.children(MEMBERS, linearizable=True)


def check(record: Record, clients: Sequence[DemoClient], views: Sequence[NodeView]) -> list[str]:
    """Every problem found, in words; none means every promise was kept."""
    problems = []
    increments = record.acked[Kind.INCREMENT] + record.landed[Kind.INCREMENT]
    for view in views:
        where = f"node {view.node_id}"
        for path, data in record.znodes.items():
            if view.data[path] != data:
                how = "acknowledged" if path in record.acked_paths else "read back earlier"
                problems.append(f"{where}: {how} {path} = {data!r}, reads {view.data[path]!r}")
        for parent in (ROOT, COUNTER_LOG, SEQUENTIAL):
            extra = sorted(set(view.children[parent]) - set(record.znodes) - {COUNTER, *PARENTS})
            problems += [f"{where}: {path} exists, but no client was told it was written" for path in extra]
        counter = view.data[COUNTER]
        if counter != str(increments).encode():
            problems.append(f"{where}: {COUNTER} = {counter!r}, but {record.acked[Kind.INCREMENT]} increments were "
                            f"acknowledged and {record.landed[Kind.INCREMENT]} more landed with an unknown outcome")
        logged = sorted(int(view.data[p] or b"-1") for p in view.children[COUNTER_LOG])
        if logged != list(range(1, len(logged) + 1)) or len(logged) != increments:
            problems.append(f"{where}: {COUNTER_LOG} holds {len(logged)} entries that are not 1..{increments}")
        expected_members = {c.member: c.session_id for c in clients}
        if view.owners != expected_members:
            problems.append(f"{where}: ephemeral nodes {view.owners} (node: owner session), "
                            f"expected {expected_members}")
    first, *others = views
    problems += [f"nodes {first.node_id} and {view.node_id} disagree" for view in others
                 if view.comparable() != first.comparable()]
    return problems


def verdict(record: Record, views: Sequence[NodeView], members: int, problems: list[str]) -> str:
    acked = sum(record.acked.values())
    if problems:
        return f"verdict: FAIL: {len(problems)} problems with {acked} acknowledged writes on {len(views)} nodes"
    parts = ", ".join(f"{record.acked[k]} {k.value}" for k in Kind)
    landed = sum(record.landed.values())
    also = f" and the {landed} that landed unacknowledged" if landed else ""
    increments = record.acked[Kind.INCREMENT], record.landed[Kind.INCREMENT]
    return (f"verdict: OK: all {acked} acknowledged writes ({parts}){also} read back on all {len(views)} nodes; "
            f"counter = {sum(increments)} = {increments[0]} acknowledged increments + {increments[1]} that landed "
            f"unacknowledged; {members} ephemeral nodes outlived the crash and went with their sessions")
