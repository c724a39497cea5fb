"""Running the nodes of a cluster.toml as local processes: choose ports, start, find, stop, observe.

Each node keeps two files in its data directory: `clusterd.pid`, written by the
daemon itself (so a node started by hand is found as well as one started by
`clusterctl up`) and removed on a clean exit; and `clusterd.log`, where
`clusterctl` sends the daemon's output.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

import clusterd
from clusterd.daemon import tls_node
from clusterd.daemon.admin import AdminUnavailable, fetch_status
from clusterd.config import BOOKIE, BOOKIE_PORT, PORT_KEYS, ClusterConfig, NodeConfig
from clusterd.tables import text_table
from edge.files import FILE_MODE, ensure_directory
from zab.core.zxid import fmt

PID_FILE = "clusterd.pid"
LOG_FILE = "clusterd.log"
# The fields of `clusterctl status --json`, one object per node.
STATUS_FIELDS = ("id", "pid", "role", "epoch", "last_zxid", "last_committed_zxid", "peers")
# The source tree that holds the clusterd package: children import from the same
# place as this process, installed or not.
_SOURCE_ROOT = Path(clusterd.__file__).resolve().parent.parent


class ClusterError(Exception):
    """A local cluster operation failed; the message says what and where to look."""


def pid_path(node: NodeConfig) -> Path:
    return node.data_dir / PID_FILE


def log_path(node: NodeConfig) -> Path:
    return node.data_dir / LOG_FILE


def write_pid_file(node: NodeConfig, pid: int) -> None:
    """Record `pid` as the node's daemon (tmp + rename, so readers never see half a file)."""
    ensure_directory(node.data_dir)
    tmp = pid_path(node).with_suffix(".pid.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w") as file:
        file.write(f"{pid}\n")
    tmp.replace(pid_path(node))


def remove_pid_file(node: NodeConfig, pid: int) -> None:
    """Remove the pid file if it still names `pid` (a newer daemon may have replaced it)."""
    if read_pid_file(node) == pid:
        pid_path(node).unlink(missing_ok=True)


def read_pid_file(node: NodeConfig) -> int | None:
    try:
        return int(pid_path(node).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def running_pid(node: NodeConfig) -> int | None:
    """The pid of the node's live daemon, or None (no pid file, or a stale one)."""
    pid = read_pid_file(node)
    return pid if pid is not None and is_clusterd(pid) else None


def is_clusterd(pid: int) -> bool:
    """True if `pid` is a live clusterd process (not a zombie, not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else; we cannot tell more
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.exists():
        return True  # no procfs: trust the pid file
    try:
        # Zombies have an empty command line; a reused pid runs something else.
        return b"clusterd" in cmdline.read_bytes()
    except OSError:
        return False


def spawn(config: ClusterConfig, node: NodeConfig, *, log_level: str = "warning") -> subprocess.Popen[bytes]:
    """Start `clusterd --id N` detached from this terminal, output appended to its log file."""
    ensure_directory(node.data_dir)  # 0700, as everything under it (edge/files.py)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SOURCE_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "clusterd.daemon.main", "--id", str(node.id),
               "--config", str(config.path), "--log-level", log_level]
    fd = os.open(log_path(node), os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    with os.fdopen(fd, "ab") as log:
        # A new session: Ctrl-C in this terminal must not kill the cluster.
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def signal_nodes(pids: dict[int, int], signum: int) -> None:
    for pid in pids.values():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def stop(pids: dict[int, int], *, timeout_s: float = 10.0) -> dict[int, str]:
    """SIGTERM every node in `pids` (id -> pid), SIGKILL those still alive after the timeout.

    Returns id -> "stopped" or "killed". Polls because these processes need not be
    our children: there is nothing to wait on but their pid.
    """
    signal_nodes(pids, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {i: pid for i, pid in alive.items() if is_clusterd(pid)}
    signal_nodes(alive, signal.SIGKILL)
    return {i: "killed" if i in alive else "stopped" for i in pids}


async def fetch_statuses(config: ClusterConfig, *, timeout_s: float = 2.0, tls: Any = "operator",
                         known: dict[int, dict[str, Any]] | None = None) -> dict[int, dict[str, Any] | None]:
    """Every node's admin /status, None for a node that does not answer (over HTTPS when [tls]
    admin is on: with clusterctl's certificate, or the ClientTls given as `tls`). `known`: the
    statuses already in hand (a node's own), not fetched."""
    statuses: dict[int, dict[str, Any] | None] = dict(known or {})
    if tls == "operator":
        tls = tls_node.operator_tls(config, "admin")

    async def one(node: NodeConfig) -> None:
        try:
            statuses[node.id] = await fetch_status(node.host, node.admin_port, timeout_s=timeout_s, tls=tls)
        except AdminUnavailable:
            statuses[node.id] = None

    async with trio.open_nursery() as nursery:
        for node in config.nodes:
            if node.id not in statuses:
                nursery.start_soon(one, node)
    return {n.id: statuses[n.id] for n in config.nodes}


def is_settled(statuses: dict[int, dict[str, Any] | None]) -> bool:
    """Every node answers, one leads, every other ensemble member follows or observes it,
    and every bookie that runs is registered in the metastore."""
    if any(s is None for s in statuses.values()):
        return False
    roles = [s["role"] for s in statuses.values() if s is not None]
    bookies_ready = all(s["bookie"].get("registered") for s in statuses.values() if s is not None and "bookie" in s)
    return (roles.count("leader") == 1 and all(r in ("leader", "follower", "observer", "bookie") for r in roles)
            and bookies_ready)


def status_row(node_id: int, status: dict[str, Any] | None) -> dict[str, Any]:
    """The STATUS_FIELDS of one node; a node that does not answer is "down" with no pid."""
    if status is None:
        return {"id": node_id, "pid": None, "role": "down", "epoch": None, "last_zxid": None,
                "last_committed_zxid": None, "peers": []}
    return {field: status.get(field) for field in STATUS_FIELDS} | {"id": node_id}


def format_table(rows: list[dict[str, Any]]) -> str:
    """The status rows as an aligned text table, zxids as 0x<epoch>_<counter>."""
    return text_table(["node", "pid", "role", "epoch", "last_zxid", "last_committed", "peers"],
                      [[str(row["id"]), _show(row["pid"]), row["role"], _show(row["epoch"]),
                        _show_zxid(row["last_zxid"]), _show_zxid(row["last_committed_zxid"]),
                        ",".join(map(str, row["peers"] or [])) or "-"] for row in rows])


def _show(value: Any) -> str:
    return "-" if value is None else str(value)


def _show_zxid(value: Any) -> str:
    return fmt(value) if isinstance(value, int) else "-"


async def wait_settled(config: ClusterConfig, nodes: list[NodeConfig], *, timeout_s: float,
                       children: dict[int, subprocess.Popen[bytes]] | None = None) -> dict[int, dict[str, Any]]:
    """Poll /status until `nodes` have settled (see `is_settled`); ClusterError after the timeout.

    A child in `children` that exits meanwhile fails the wait at once, pointing at its log.
    """
    wanted = {n.id for n in nodes}
    deadline = trio.current_time() + timeout_s
    while True:
        _check_children(config, children or {})
        statuses = {i: s for i, s in (await fetch_statuses(config, timeout_s=1.0)).items() if i in wanted}
        if is_settled(statuses):
            return statuses  # type: ignore[return-value]
        if trio.current_time() > deadline:
            raise ClusterError(_not_settled_message(config, statuses, timeout_s))
        await trio.sleep(0.1)


def _check_children(config: ClusterConfig, children: dict[int, subprocess.Popen[bytes]]) -> None:
    for node_id, child in children.items():
        if child.poll() is not None:
            node = config.node(node_id)
            raise ClusterError(f"node {node_id} exited with status {child.returncode} while starting; "
                               f"see {log_path(node)}:\n{tail(log_path(node))}")


def _not_settled_message(config: ClusterConfig, statuses: dict[int, Any], timeout_s: float) -> str:
    problems = []
    for node_id, status in statuses.items():
        node = config.node(node_id)
        if status is None:
            problems.append(f"node {node_id} does not answer on {node.host}:{node.admin_port} (see {log_path(node)})")
        elif status["role"] == "looking":
            problems.append(f"node {node_id} is still looking for a leader (see {log_path(node)})")
        elif "bookie" in status and not status["bookie"].get("registered"):
            problems.append(f"node {node_id}'s bookie is not registered yet: {status['bookie'].get('phase')} "
                            f"(see {log_path(node)})")
    if not problems:
        leaders = [i for i, s in statuses.items() if s and s["role"] == "leader"]
        problems.append(f"leaders: {leaders or 'none'}")
    return f"cluster not ready after {timeout_s:g} s: " + "; ".join(problems)


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file, indented, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "    (no log file)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


_HANDED_OUT: set[int] = set()


def free_ports(count: int) -> list[int]:
    """Distinct ports free on 127.0.0.1 now, below the kernel's ephemeral range.

    Not ports the kernel handed out for port 0: those come from the ephemeral range, where any
    outgoing connection made before a server binds its port (a kazoo client, a Quire peer link)
    may take it. A ZooKeeper server of a benchmark run exited at start that way, most likely.
    Never the same port twice in one process: two clusters (a ZooKeeper ensemble and a Quire
    cluster, or the clusters of two tests) may choose theirs before either starts."""
    low = _ephemeral_start()
    chosen: list[int] = []
    sockets: list[socket.socket] = []
    try:
        for port in random.sample(range(max(1024, low - 12_000), low), min(4_000, low - 1024)):
            if port in _HANDED_OUT:  # to an earlier call whose servers may not have bound it yet
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            chosen.append(port)
            if len(chosen) == count:
                _HANDED_OUT.update(chosen)
                return chosen
        raise RuntimeError(f"fewer than {count} free ports below {low} on 127.0.0.1")
    finally:
        for s in sockets:
            s.close()


_PORT_LINE = re.compile(r"(?m)^(\w+_port)[ \t]*=[ \t]*\d+[ \t]*$")


def with_free_ports(text: str) -> str:
    """A cluster.toml's text with every `*_port = N` line given a port of its own from free_ports.

    One pass over the lines, not a search for each old value: a free port can equal a port the
    file gives another node (the shipped ports lie in free_ports' range), and replacing by value
    would then rewrite both lines to one port."""
    ports = iter(free_ports(len(_PORT_LINE.findall(text))))
    return _PORT_LINE.sub(lambda m: f"{m[1]} = {next(ports)}", text)


def extra_node(node_id: int, role: str) -> str:
    """A `[[node]]` table, with free ports, for one more node on 127.0.0.1 with one role ("bookie": a
    spare bookie that holds no Zab vote; "observer": a Zab observer that serves clients) and its data
    under data/node<id>: what tests and benchmarks append to a cluster.toml."""
    ports = PORT_KEYS + ((BOOKIE_PORT,) if role == BOOKIE else ())
    lines = "".join(f"{key} = {port}\n" for key, port in zip(ports, free_ports(len(ports))))
    return f'\n[[node]]\nid = {node_id}\nhost = "127.0.0.1"\n{lines}roles = ["{role}"]\ndata_dir = "data/node{node_id}"\n'


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
