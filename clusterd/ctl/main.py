"""`clusterctl`: start, stop, inspect and use a local cluster described by a cluster.toml.

    clusterctl [--config FILE] up | down | status [--json] | demo | node add|remove|replace
    and the metastore commands of clusterd/ctl/zk.py (ls, get PATH, stat, create, set, rm, cas), the
    bookie, ledger, recovery, verify and tls commands.

Exit status: 0 done, 1 the operation failed, 2 the command line or the config was refused,
141 the reader of stdout went away first (`clusterctl status | head -1`; no traceback).
`clusterctl --version` prints the package version.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from functools import partial
from typing import Any, NoReturn

import stamina
import trio

from clusterd import localcluster
from clusterd.ctl import (bookie as bookiectl, ledger as ledgerctl, log as logctl, node as nodectl,
                          recovery as recoveryctl, table as tablectl, tls as tlsctl, verify as verifyctl,
                          zk as zkctl)

from clusterd.demo import main as demo
from clusterd.config import ClusterConfig, ConfigError, NodeConfig, load
from clusterd.ctl.sdk_session import failure_in
from clusterd.localcluster import ClusterError
from clusterd.version import package_version

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CLOSED_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE


def main(argv: list[str] | None = None) -> NoReturn:
    """Run one clusterctl command and exit with its status (module docstring)."""
    # Our retry loops log each retry in our own key=value lines; stamina's default hooks would add a
    # WARNING of theirs and a counter in a registry nothing serves.
    stamina.instrumentation.set_on_retry_hooks([])
    try:
        try:
            status: Any = _run(argv)
        except SystemExit as e:  # argparse's --help, --version and usage errors; _fail
            status = e.code
        # Flushed here, inside the try, so that a reader gone early is seen now and not
        # as an unraisable error while the interpreter shuts down.
        sys.stdout.flush()
    except (BrokenPipeError, BaseExceptionGroup) as e:
        # A socket's EPIPE is a real failure: only our own closed stdout ends quietly.
        if failure_in(e, (BrokenPipeError,)) is None or not _stdout_reader_gone():
            raise
        _exit_on_closed_pipe()
    sys.exit(status)


def _run(argv: list[str] | None) -> Any:
    args = _parser().parse_args(argv)
    # Usage errors argparse cannot see alone (an append's DATA or --stdin) exit 2 here, before connecting.
    if (check_usage := getattr(args, "check_usage", None)) is not None:
        check_usage(args)
    try:
        config = load(args.config)
    except ConfigError as e:
        _fail(EXIT_USAGE, str(e))
    try:
        return args.command(config, args)
    except ClusterError as e:
        _fail(EXIT_FAILED, str(e))


def _stdout_reader_gone() -> bool:
    # The write end of a pipe (or socket) whose reader has closed polls as POLLERR (or POLLHUP).
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _exit_on_closed_pipe() -> NoReturn:
    """The reader of our output went away (`clusterctl status | head -1`): stop quietly, as a C
    tool killed by SIGPIPE would, with the shell's status for that (128 + SIGPIPE's 13), so a
    pipeline under `set -o pipefail` still sees that the output was cut short."""
    # Python still holds the unwritten output and would try it again, noisily, at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_CLOSED_PIPE)


def _fail(status: int, message: str) -> None:
    print(f"clusterctl: {message}", file=sys.stderr)
    sys.exit(status)


def _parser() -> argparse.ArgumentParser:
    # --config is accepted before and after the command; the later one wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="cluster config (default: ./cluster.toml)")
    parser = argparse.ArgumentParser(prog="clusterctl", description="Run and use a local Quire cluster.")
    parser.add_argument("--config", default="cluster.toml", help="cluster config (default: ./cluster.toml)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(command=func)
        return sub

    up = command("up", cmd_up, "start every node that is not running, wait until a leader serves")
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a leader (default 30)")
    down = command("down", cmd_down, "stop every running node (SIGTERM, then SIGKILL after a timeout)")
    down.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL (default 10)")
    status = command("status", cmd_status, "one line per node: pid, role, epoch, zxids, peers")
    status.add_argument("--json", action="store_true", help="a JSON list, one object per node")
    put = command("put", cmd_put, "retired with the kv demo protocol: use create or set")
    put.add_argument("words", nargs="*", help=argparse.SUPPRESS)
    get = command("get", zkctl.cmd_get_zk, "print znode PATH's data as a node sees it (version and zxid on stderr)")
    get.add_argument("key", metavar="PATH")
    get.add_argument("--json", action="store_true", help="print JSON")
    zkctl.add_commands(command)
    nodectl.add_commands(command)
    bookiectl.add_commands(command)
    ledgerctl.add_commands(command)
    logctl.add_commands(command)
    tablectl.add_commands(command)
    recoveryctl.add_commands(command)
    verifyctl.add_commands(command)
    tlsctl.add_commands(command)
    demo = command("demo", cmd_demo, "a fresh cluster under load, its leader SIGKILLed, every write checked")
    demo.add_argument("--writes", type=int, default=2000, help="acknowledged writes to aim for (default 2000)")
    demo.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    demo.add_argument("--ledger-entries", type=int, default=5000,
                      help="entries the ledger part appends with a tailing reader (default 5000)")
    demo.add_argument("--no-verify", action="store_true",
                      help="skip the Spark verifiers at the end (they need Java and take a minute)")
    demo.add_argument("--kill", choices=("leader", "follower", "all"), default="leader",
                      help="what to SIGKILL a third of the way in (default: leader)")
    return parser


# -- up / down ----------------------------------------------------------------

def cmd_up(config: ClusterConfig, args: argparse.Namespace) -> int:
    nodes = _ensemble(config)
    children = {}
    for node in nodes:
        pid = localcluster.running_pid(node)
        if pid is not None:
            print(f"node {node.id}: already running (pid {pid})")
            continue
        children[node.id] = localcluster.spawn(config, node)
        print(f"node {node.id}: started (pid {children[node.id].pid}), log {localcluster.log_path(node)}")
    statuses = trio.run(partial(localcluster.wait_settled, config, nodes, timeout_s=args.timeout, children=children))
    leader = next(i for i, s in statuses.items() if s["role"] == "leader")
    print(f"cluster {config.name!r} is up; node {leader} leads epoch {statuses[leader].get('epoch')}")
    return 0


def _ensemble(config: ClusterConfig) -> list[NodeConfig]:
    """The nodes `up` starts: all of them (bookie-only ones run a bookie and no Zab peer)."""
    return list(config.nodes)


def cmd_down(config: ClusterConfig, args: argparse.Namespace) -> int:
    pids = {n.id: pid for n in config.nodes if (pid := localcluster.running_pid(n)) is not None}
    if not pids:
        print("no node is running")
    outcomes = localcluster.stop(pids, timeout_s=args.timeout)
    for node in config.nodes:
        if node.id in pids:
            # A node killed with SIGKILL could not remove its own pid file.
            localcluster.remove_pid_file(node, pids[node.id])
            print(f"node {node.id}: {outcomes[node.id]} (pid {pids[node.id]})")
    return 0


# -- status -------------------------------------------------------------------

def cmd_status(config: ClusterConfig, args: argparse.Namespace) -> int:
    statuses = trio.run(localcluster.fetch_statuses, config)
    rows = [localcluster.status_row(node_id, status) for node_id, status in statuses.items()]
    print(json.dumps(rows, indent=2) if args.json else localcluster.format_table(rows))
    return 0


# -- put (retired) --------------------------------------------------------------

def cmd_put(config: ClusterConfig, args: argparse.Namespace) -> int:
    return zkctl.refuse_put(config)


def cmd_demo(config: ClusterConfig, args: argparse.Namespace) -> int:
    return demo.run(config, writes=args.writes, clients=args.clients, kill=args.kill,
                    ledger_entries=args.ledger_entries, verify=not args.no_verify)


if __name__ == "__main__":
    main()
