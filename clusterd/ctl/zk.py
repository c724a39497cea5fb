"""`clusterctl` commands for the metastore.

    clusterctl [--config FILE] ls PATH | get PATH | stat PATH
                               | create PATH [DATA] [--ephemeral] [--sequential]
                               | set PATH DATA [--version N] | rm PATH [--version N] [--recursive]
                               | cas PATH (--increment [BY] | --expect OLD --value NEW)
    each with --json for machine-readable output.

`put` belonged to the retired kv demo protocol: it now says to use create or
set (exit 2).

Each command opens a session through any node's client port (SyncMetaClient),
runs, and closes it; so an --ephemeral node is deleted as soon as the command
exits (useful only to check that creating it is allowed). Data on the command
line is UTF-8 text. Exit status: 0 done, 1 the metastore refused (NoNode,
BadVersion, a cas whose expectation failed, ...) or was unreachable, 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable
from typing import Any

from clusterd.daemon import identity as daemon_identity, tls_node
from clusterd.config import ClusterConfig
from metastore.client.core import ANY_VERSION
from metastore.client.ops import stat_dict
from metastore.client.sync import SyncMetaClient
from metastore.errors import MetastoreError, NoNode
from metastore.core.stat import Stat

EXIT_FAILED = 1
EXIT_USAGE = 2
SESSION_TIMEOUT_MS = 10_000
START_TIMEOUT_S = 15.0

Command = Callable[[ClusterConfig, argparse.Namespace], int]


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Register the metastore commands with clusterctl's parser (`command` is ctl's factory)."""
    ls = command("ls", _zk(cmd_ls), "zookeeper: list the children of znode PATH")
    ls.add_argument("path")
    stat = command("stat", _zk(cmd_stat), "zookeeper: print the Stat of znode PATH")
    stat.add_argument("path")
    create = command("create", _zk(cmd_create), "zookeeper: create znode PATH holding DATA (default empty)")
    create.add_argument("path")
    create.add_argument("data", nargs="?", default="")
    create.add_argument("--ephemeral", action="store_true", help="deleted when this command's session ends")
    create.add_argument("--sequential", action="store_true", help="append the parent's 10-digit counter")
    set_ = command("set", _zk(cmd_set), "zookeeper: replace znode PATH's data (compare-and-set with --version)")
    set_.add_argument("path")
    set_.add_argument("data")
    set_.add_argument("--version", type=int, default=None, help="only if PATH is at this version")
    rm = command("rm", _zk(cmd_rm), "zookeeper: delete znode PATH")
    rm.add_argument("path")
    rm.add_argument("--version", type=int, default=None, help="only if PATH is at this version")
    rm.add_argument("--recursive", action="store_true", help="delete everything below PATH too")
    cas = command("cas", _zk(cmd_cas), "zookeeper: read-modify-write znode PATH, retried on version conflicts")
    cas.add_argument("path")
    how = cas.add_mutually_exclusive_group(required=True)
    how.add_argument("--increment", type=int, nargs="?", const=1, metavar="BY",
                     help="add BY (default 1) to a decimal counter; a missing node counts as 0")
    how.add_argument("--expect", metavar="OLD", help="with --value: write NEW only if the data is OLD")
    cas.add_argument("--value", metavar="NEW", help="the data to write when --expect matches")
    for sub in (ls, stat, create, set_, rm, cas):
        sub.add_argument("--json", action="store_true", help="print JSON")


def _zk(func: Command) -> Command:
    """Turn metastore errors into exit status 1."""
    def run(config: ClusterConfig, args: argparse.Namespace) -> int:
        try:
            return func(config, args)
        except MetastoreError as e:
            print(f"clusterctl: {e}", file=sys.stderr)
            return EXIT_FAILED
    return run


def refuse_put(config: ClusterConfig) -> int:
    print("clusterctl: put belonged to the retired kv demo protocol: use `create PATH DATA` or `set PATH DATA`",
          file=sys.stderr)
    return EXIT_USAGE


def _client(config: ClusterConfig) -> SyncMetaClient:
    return SyncMetaClient(config.client_addresses(), session_timeout_ms=SESSION_TIMEOUT_MS,
                          start_timeout_s=START_TIMEOUT_S, tls=tls_node.operator_tls(config),
                          auth=daemon_identity.operator_auth(config.path))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _data_fields(data: bytes | None) -> dict[str, Any]:
    if data is None:  # null data (a ZooKeeper client's create or set with no payload), not b""
        return {"data": None, "data_base64": None}
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"data": text, "data_base64": base64.b64encode(data).decode("ascii")}


def _stat_line(stat: Stat) -> str:
    return f"version={stat.version} mzxid={stat.mzxid:#x} children={stat.num_children}"


# -- the commands -----------------------------------------------------------------------

def cmd_ls(config: ClusterConfig, args: argparse.Namespace) -> int:
    with _client(config) as c:
        children = c.children(args.path)
    if args.json:
        _print_json({"path": args.path, "children": children})
    else:
        for name in children:
            print(name)
    return 0


def cmd_get(config: ClusterConfig, args: argparse.Namespace) -> int:
    """clusterctl get PATH on a zookeeper cluster (ctl.cmd_get dispatches here)."""
    path = args.key
    with _client(config) as c:
        data, stat = c.get(path)
    if getattr(args, "json", False):
        _print_json({"path": path, **_data_fields(data), "stat": stat_dict(stat)})
    else:
        sys.stdout.buffer.write((data or b"") + b"\n")  # null data prints as empty; --json tells them apart
        sys.stdout.flush()
        print(_stat_line(stat), file=sys.stderr)
    return 0


cmd_get_zk = _zk(cmd_get)


def cmd_stat(config: ClusterConfig, args: argparse.Namespace) -> int:
    with _client(config) as c:
        stat = c.exists(args.path)
    if stat is None:
        raise NoNode(args.path)
    if args.json:
        _print_json({"path": args.path, "stat": stat_dict(stat)})
    else:
        for name, value in stat_dict(stat).items():
            shown = f"{value:#x}" if name.endswith("zxid") or name == "ephemeral_owner" else value
            print(f"{name} = {shown}")
    return 0


def cmd_create(config: ClusterConfig, args: argparse.Namespace) -> int:
    with _client(config) as c:
        path, stat = c.run(c.client.create_with_stat, args.path, args.data.encode(), ephemeral=args.ephemeral,
                           sequential=args.sequential)
    if args.json:
        _print_json({"path": path, "stat": stat_dict(stat)})
    else:
        print(path)
    return 0


def cmd_set(config: ClusterConfig, args: argparse.Namespace) -> int:
    version = ANY_VERSION if args.version is None else args.version
    with _client(config) as c:
        stat = c.set(args.path, args.data.encode(), version)
    if args.json:
        _print_json({"path": args.path, "stat": stat_dict(stat)})
    else:
        print(_stat_line(stat))
    return 0


def cmd_rm(config: ClusterConfig, args: argparse.Namespace) -> int:
    if args.recursive and args.version is not None:
        print("clusterctl: rm takes --version or --recursive, not both", file=sys.stderr)
        return EXIT_USAGE
    with _client(config) as c:
        if args.recursive:
            if c.exists(args.path) is None:
                raise NoNode(args.path)
            c.delete_recursive(args.path)
        else:
            c.delete(args.path, ANY_VERSION if args.version is None else args.version)
    if args.json:
        _print_json({"path": args.path, "deleted": True})
    else:
        print(f"deleted {args.path}")
    return 0


class _Unexpected(MetastoreError):
    """cas --expect found other data."""


def cmd_cas(config: ClusterConfig, args: argparse.Namespace) -> int:
    if args.expect is not None and args.value is None or args.increment is not None and args.value is not None:
        print("clusterctl: cas takes --increment [BY], or --expect OLD --value NEW", file=sys.stderr)
        return EXIT_USAGE
    if args.increment is not None:
        update, create = _incrementer(args.path, args.increment), True
    else:
        update, create = _expecter(args.path, args.expect.encode(), args.value.encode()), False
    with _client(config) as c:
        data, stat = c.cas(args.path, update, create=create)
    if args.json:
        _print_json({"path": args.path, **_data_fields(data), "stat": stat_dict(stat)})
    else:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
        print(_stat_line(stat), file=sys.stderr)
    return 0


def _incrementer(path: str, by: int) -> Callable[[bytes | None], bytes]:
    def update(data: bytes | None) -> bytes:
        try:
            current = int(data or b"0")
        except ValueError:
            raise _Unexpected(f"{path} holds {data!r}, not a decimal counter") from None
        return str(current + by).encode()
    return update


def _expecter(path: str, old: bytes, new: bytes) -> Callable[[bytes | None], bytes]:
    def update(data: bytes | None) -> bytes:
        if data != old:
            raise _Unexpected(f"{path} holds {data!r}, not {old!r}: nothing written")
        return new
    return update
