"""`clusterctl node add|remove|replace`: change the running ensemble with reconfig.

    clusterctl [--config FILE] node add ID [--observer] [--super USER:PASSWORD]
                               node remove ID
                               node replace OLD NEW

The node's `[[node]]` table must be in FILE (its address and client port go into the
reconfig's server line); start it first (`clusterctl up` starts what is not running). `add`
makes it an observer of the ensemble (the members learn its address, it syncs), waits until it
has caught up, then makes it a participant unless `--observer`. `remove` takes it out, the
leader included (the others elect at once). `replace` adds NEW in OLD's role, waits until NEW
is synced, then removes OLD. Reconfig is for the super user: `--super`, or the environment
variable QUIRE_SUPER_AUTH, gives the digest credentials of `super_digest`. docs/operations.md
"Changing the ensemble".

Exit status: 0 done, 1 refused or not done in time, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from clusterd import localcluster
from clusterd.config import ClusterConfig, NodeConfig
from clusterd.daemon import tls_node
from metastore.client.sync import SyncMetaClient
from metastore.errors import ConnectionLoss, MetastoreError
from zab.core.ensemble import OBSERVER, PARTICIPANT, Ensemble, parse_spec

EXIT_FAILED = 1
EXIT_USAGE = 2
SUPER_ENV = "QUIRE_SUPER_AUTH"
SYNC_TIMEOUT_S = 120.0
POLL_S = 0.2

Command = Callable[[ClusterConfig, argparse.Namespace], int]


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    node = command("node", cmd_node, "change the running ensemble: node add ID | remove ID | replace OLD NEW")
    node.add_argument("action", choices=("add", "remove", "replace"))
    node.add_argument("ids", nargs="+", type=int, metavar="ID")
    node.add_argument("--observer", action="store_true", help="add: stay an observer (default: a voter)")
    node.add_argument("--super", dest="super_auth", default=None, metavar="USER:PASSWORD",
                      help=f"digest credentials of super_digest (default: ${SUPER_ENV})")
    node.add_argument("--timeout", type=float, default=SYNC_TIMEOUT_S,
                      help=f"seconds to wait for a node to sync or a leader to serve (default {SYNC_TIMEOUT_S:.0f})")


def cmd_node(config: ClusterConfig, args: argparse.Namespace) -> int:
    wanted = {"add": 1, "remove": 1, "replace": 2}[args.action]
    if len(args.ids) != wanted:
        return _usage(f"node {args.action} takes {wanted} id(s)")
    credentials = args.super_auth or os.environ.get(SUPER_ENV)
    if not credentials:
        return _usage(f"reconfig is for the super user: give --super USER:PASSWORD or set ${SUPER_ENV}")
    try:
        nodes = [config.node(i) for i in args.ids]
        with _client(config, exclude=set(args.ids) if args.action == "remove" else set()) as c:
            c.add_auth("digest", credentials)
            if args.action == "add":
                _add(config, c, nodes[0], OBSERVER if args.observer else PARTICIPANT, args.timeout)
            elif args.action == "remove":
                _remove(config, c, nodes[0], args.timeout)
            else:
                old, new = nodes
                role = _ensemble(c).by_id.get(old.id)
                _add(config, c, new, role.role if role else PARTICIPANT, args.timeout)
                _remove(config, c, old, args.timeout)
    except (MetastoreError, NodeChangeFailed) as e:
        print(f"clusterctl: {e}", file=sys.stderr)
        return EXIT_FAILED
    return 0


class NodeChangeFailed(Exception):
    """A node did not reach the state a change waits for; the message says which and what to check."""


def _add(config: ClusterConfig, c: SyncMetaClient, node: NodeConfig, role: str, timeout_s: float) -> None:
    current = _ensemble(c).by_id.get(node.id)
    if current is None:  # first an observer: the members learn its address, it syncs without a vote
        _reconfig(c, joining=_line(node, OBSERVER))
        _wait(config, node, "observer", timeout_s)
        print(f"node {node.id}: observer, synced")
    if role == PARTICIPANT and (current is None or current.role != PARTICIPANT):
        _reconfig(c, joining=_line(node, PARTICIPANT))
        _wait(config, node, "follower", timeout_s)
        print(f"node {node.id}: voter, following")


def _remove(config: ClusterConfig, c: SyncMetaClient, node: NodeConfig, timeout_s: float) -> None:
    if node.id not in _ensemble(c).by_id:
        print(f"node {node.id}: not a member")
        return
    _reconfig(c, leaving=str(node.id))
    deadline = time.monotonic() + timeout_s
    while node.id in _ensemble(c).by_id:  # a ConnectionLoss left the outcome unknown: read it
        if time.monotonic() > deadline:
            raise NodeChangeFailed(f"node {node.id} is still in /zookeeper/config after {timeout_s:.0f} s")
        time.sleep(POLL_S)
    print(f"node {node.id}: removed (it serves nobody now; stop it with SIGTERM)")


def _reconfig(c: SyncMetaClient, **change: str) -> None:
    try:
        c.reconfig(**change)
    except ConnectionLoss:
        # Removing the leader makes its followers elect anew and drop their clients; the
        # session reconnects, and the caller reads /zookeeper/config to learn the outcome.
        pass


def _ensemble(c: SyncMetaClient) -> Ensemble:
    c.sync("/zookeeper/config")
    return parse_spec(c.get("/zookeeper/config")[0])


def _line(node: NodeConfig, role: str) -> str:
    return f"server.{node.id}={node.host}:{node.peer_port}:{node.peer_port}:{role};{node.host}:{node.client_port}"


def _wait(config: ClusterConfig, node: NodeConfig, role: str, timeout_s: float) -> None:
    """Until `node` is in `role` and has committed what the leader has (from admin /status)."""
    deadline = time.monotonic() + timeout_s
    target: int | None = None  # the leader's committed zxid when we first saw one
    while True:
        statuses = trio.run(localcluster.fetch_statuses, config)
        if target is None:
            target = _leader_committed(statuses)
        if target is not None and _synced(statuses.get(node.id), role, target):
            return
        if time.monotonic() > deadline:
            raise NodeChangeFailed(f"node {node.id} is not a synced {role} after {timeout_s:.0f} s: is it running? "
                                   f"see {localcluster.log_path(node)}")
        time.sleep(POLL_S)


def _leader_committed(statuses: dict[int, dict[str, Any] | None]) -> int | None:
    leaders = [s for s in statuses.values() if s is not None and s["role"] == "leader"]
    return leaders[0]["last_committed_zxid"] if len(leaders) == 1 else None


def _synced(status: dict[str, Any] | None, role: str, target: int) -> bool:
    """In `role`, broadcasting, and caught up with what the leader had committed when we began."""
    return (status is not None and status["role"] == role and status["phase"] == "broadcast"
            and status["last_committed_zxid"] >= target)


def _client(config: ClusterConfig, exclude: set[int]) -> SyncMetaClient:
    """A session through the ensemble's client ports but `exclude`'s (a node being removed
    drops its clients)."""
    hosts = [(n.host, n.client_port) for n in config.ensemble if n.id not in exclude]
    return SyncMetaClient(hosts, session_timeout_ms=10_000, start_timeout_s=15.0, tls=tls_node.operator_tls(config))


def _usage(message: str) -> int:
    print(f"clusterctl: {message}", file=sys.stderr)
    return EXIT_USAGE
