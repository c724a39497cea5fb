"""ZooKeeper's four-letter words on the client port, answered as ZooKeeper 3.8 words them
(ruok, srvr, stat, mntr, conf, envi, isro, cons, wchs, dump, srst). kazoo reads the server
version from `envi`; Metricbeat's and Telegraf's ZooKeeper inputs read `mntr`, `srvr` and `cons`.
tests/test_zookeeper_adminserver.py holds each word against a live ZooKeeper 3.8.0's.

Everything here reads the node's state; only `srst` changes anything (it resets the latency
min/avg/max, as ZooKeeper's does). Which words a node answers is `four_letter_words` in its
config (docs/operations.md).
"""

from __future__ import annotations

import getpass
import math
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR

VERSION = "3.8.0-quire-0.1"
# ZooKeeper's full version, as srvr, stat, mntr, envi and the AdminServer print it: Metricbeat's
# srvr reader takes the version up to the comma and the build after "built on".
FULL_VERSION = f"{VERSION}, built on quire"
_STARTED = time.monotonic()


def answer_four_letter_word(word: str, service: Any) -> str:
    status = service.driver.status()
    mode = server_state(service, status)
    if word == "ruok":
        return "imok"
    if word == "isro":
        return service.serving_mode
    if word == "envi":
        return "Environment:\n" + "".join(f"{k}={v}\n" for k, v in environment(service).items())
    if word == "conf":
        return conf_text(service)
    if word == "mntr":
        return "".join(f"{k}\t{v}\n" for k, v in monitor(service, status).items())
    if word == "cons":
        return "".join(f" {line}\n" for line in connection_lines(service)) + "\n"
    if word == "wchs":
        summary = service.watches.summary()
        return (f"{summary['connections']} connections watching {summary['paths']} paths\n"
                f"Total watches:{summary['watches']}\n")
    if word == "dump":
        return dump(service, status)
    if word == "srst":
        service.latency.reset()
        return "Server stats reset.\n"
    return server_stats(service, status, mode, with_clients=word == "stat")


def server_state(service: Any, status: dict) -> str:
    """ZooKeeper's zk_server_state / Mode: leader, follower, observer, read-only or looking."""
    if service.serving_mode == "ro":
        return "read-only"
    return {"leader": "leader", "follower": "follower", "observer": "observer"}.get(status.get("role"), "looking")


def packets(service: Any) -> tuple[int, int]:
    """Requests received and frames sent on the client port since the node started."""
    live = service.connections.values()
    return (service.stats["requests"], service.stats.get("packets_sent", 0) + sum(c.sent for c in live))


def monitor(service: Any, status: dict) -> dict[str, Any]:
    """mntr's keys (ZooKeeper 3.8's names; the leader's three follower keys only on the leader)."""
    tree = service.sm.tree
    lat_min, lat_avg, lat_max = latencies(service)
    received, sent = packets(service)
    open_fds, max_fds = file_descriptors()
    rows: dict[str, Any] = {
        "zk_version": FULL_VERSION, "zk_server_state": server_state(service, status),
        "zk_avg_latency": lat_avg, "zk_max_latency": lat_max, "zk_min_latency": lat_min,
        "zk_packets_received": received, "zk_packets_sent": sent,
        "zk_num_alive_connections": len(service.connections),
        "zk_outstanding_requests": service.stats["outstanding"],
        "zk_znode_count": len(tree), "zk_watch_count": service.watches.count(),
        "zk_ephemerals_count": sum(len(tree.ephemerals(s)) for s in tree.sessions()),
        "zk_approximate_data_size": approximate_data_size(tree),
        "zk_open_file_descriptor_count": open_fds, "zk_max_file_descriptor_count": max_fds,
        "zk_global_sessions": len(tree.sessions()),
        "zk_uptime": int((time.monotonic() - _STARTED) * 1000),
        "zk_last_zxid": status.get("last_committed_zxid", 0),
    }
    if "followers" in status:
        rows["zk_followers"] = sum(1 for f in status["followers"].values() if not f["observer"])
        rows["zk_synced_followers"] = status["synced_followers"]
        rows["zk_pending_syncs"] = status["pending_syncs"]
    return rows


def latencies(service: Any) -> tuple[int, float, int]:
    """min/avg/max request latency in ms as ZooKeeper gives them: min and max whole milliseconds
    (older Metricbeats read them as integers), min rounded down and max up so they still bound
    every latency; avg as measured."""
    lat_min, lat_avg, lat_max = service.latency.min_avg_max_ms()
    return math.floor(lat_min), lat_avg, math.ceil(lat_max)


def client_port_status(service: Any) -> dict[str, Any]:
    """The client port's figures for /status and /metrics (the counters of service.stats, and
    what mntr reads of the tree, the watches and the connections)."""
    tree = service.sm.tree
    lat_min, lat_avg, lat_max = service.latency.min_avg_max_ms()
    received, sent = packets(service)
    return dict(service.stats, reply_bytes=service.reply_budget.used, reply_refusals=service.reply_budget.refusals,
                packets_received=received, packets_sent=sent, connections_open=len(service.connections),
                sessions=len(tree.sessions()), watches=service.watches.count(), znodes=len(tree),
                approximate_data_size=approximate_data_size(tree),
                latency_min_ms=lat_min, latency_avg_ms=lat_avg, latency_max_ms=lat_max,
                latency_count=service.latency.count, latency_total_s=round(service.latency.total_s, 6))


def approximate_data_size(tree: Any) -> int:
    """ZooKeeper's approximate data size: the bytes of every znode's path and data, kept by the
    tree as it changes (metastore/core/tree.py)."""
    return tree.data_bytes


def file_descriptors() -> tuple[int, int]:
    """(open, the soft limit) of this process, as ZooKeeper reports them on Unix."""
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = -1
    return open_fds, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_lines(service: Any, *, brief: bool = False) -> list[str]:
    """One line per client connection, as ZooKeeper's cons (stat's are `brief`): the address
    with Java's leading slash (Metricbeat's cons reader needs it), and the session's figures only
    for a connection with a session."""
    timeouts = service.sm.tree.sessions()
    out = []
    for c in list(service.connections.values()):
        line = f"/{c.peer}[1](queued={len(c.replies)},recved={c.received},sent={c.sent}"
        if c.session_id and not brief:
            line += (f",sid=0x{c.session_id:x},lop=NA,est=0,to={timeouts.get(c.session_id, 0)},lcxid=0x0,"
                     f"lzxid=0x{service.sm.last_zxid:x},lresp=0,llat=0,minlat=0,avglat=0,maxlat=0")
        out.append(line + ")")
    return out


def dump(service: Any, status: dict) -> str:
    """Sessions with their timeouts, as a ZooKeeper follower words them (its leader prints expiry
    buckets instead; Quire expires by ticks), then the ephemerals."""
    tree = service.sm.tree
    sessions = tree.sessions()
    lines = [f"SessionTracker dump:\nGlobal Sessions({len(sessions)}):"]
    lines += [f"0x{sid:x}\t{timeout}ms" for sid, timeout in sorted(sessions.items())]
    lines.append("ephemeral nodes dump:")
    owners = [(sid, tree.ephemerals(sid)) for sid in sorted(tree.sessions())]
    owners = [(sid, paths) for sid, paths in owners if paths]
    lines.append(f"Sessions with Ephemerals ({len(owners)}):")
    for sid, paths in owners:
        lines.append(f"0x{sid:x}:")
        lines += [f"\t{p}" for p in paths]
    return "\n".join(lines) + "\n"


def server_figures(service: Any, status: dict) -> dict[str, Any]:
    """What srvr and stat print, and the AdminServer's server_stats answers (ZooKeeper's JSON names)."""
    lat_min, lat_avg, lat_max = latencies(service)
    received, sent = packets(service)
    return {"packets_sent": sent, "packets_received": received, "max_latency": lat_max, "min_latency": lat_min,
            "avg_latency": lat_avg, "num_alive_client_connections": len(service.connections),
            "outstanding_requests": service.stats["outstanding"], "server_state": server_state(service, status),
            "last_processed_zxid": status.get("last_committed_zxid", 0), "node_count": len(service.sm.tree),
            "uptime": int((time.monotonic() - _STARTED) * 1000)}


def server_stats(service: Any, status: dict, mode: str, *, with_clients: bool) -> str:
    """srvr, and stat (srvr with the client list)."""
    f = server_figures(service, status)
    text = (f"Zookeeper version: {FULL_VERSION}\n"
            f"Latency min/avg/max: {f['min_latency']}/{f['avg_latency']}/{f['max_latency']}\n"
            f"Received: {f['packets_received']}\nSent: {f['packets_sent']}\n"
            f"Connections: {f['num_alive_client_connections']}\nOutstanding: {f['outstanding_requests']}\n"
            f"Zxid: 0x{f['last_processed_zxid']:x}\nMode: {mode}\nNode count: {f['node_count']}\n")
    if with_clients:
        clients = "".join(f" {line}\n" for line in connection_lines(service, brief=True))
        text = text.replace("Latency", f"Clients:\n{clients}\nLatency", 1)
    return text


def dir_sizes(service: Any) -> tuple[int, int]:
    """(snapshot dir, txn-log dir) bytes: ZooKeeper's dataDirSize and dataLogSize."""
    data_dir = service.driver.data_dir
    return _bytes_in(data_dir / SNAPSHOT_DIR), _bytes_in(data_dir / TXNLOG_DIR)


def _bytes_in(directory: Path) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
    except OSError:  # not made yet, or a file gone while counting (a purge)
        return 0


def configuration(service: Any) -> dict[str, Any]:
    """The node's settings by the AdminServer's configuration names (conf prints them too)."""
    cfg, data_dir = service.cfg, service.driver.data_dir
    return {"client_port": cfg.port, "client_port_address": cfg.host, "server_id": cfg.node_id,
            "tick_time": cfg.tick_ms, "min_session_timeout": cfg.min_session_timeout_ms,
            "max_session_timeout": cfg.max_session_timeout_ms, "data_dir": str(data_dir / SNAPSHOT_DIR),
            "data_log_dir": str(data_dir / TXNLOG_DIR), "max_client_cnxns": cfg.limits.max_client_connections,
            "client_port_listen_backlog": -1}  # -1: the system's default, as ZooKeeper says when unset


def conf_text(service: Any) -> str:
    """conf, in ZooKeeper 3.8's order (and clientPortAddress, which it leaves out)."""
    c = configuration(service)
    data_size, log_size = dir_sizes(service)
    tls = service.cfg.tls is not None  # a TLS client port is ZooKeeper's secureClientPort in place of clientPort
    rows = {"clientPort": -1 if tls else c["client_port"], "clientPortAddress": c["client_port_address"],
            "secureClientPort": c["client_port"] if tls else -1,
            "dataDir": c["data_dir"], "dataDirSize": data_size, "dataLogDir": c["data_log_dir"],
            "dataLogSize": log_size, "tickTime": c["tick_time"], "maxClientCnxns": c["max_client_cnxns"],
            "minSessionTimeout": c["min_session_timeout"], "maxSessionTimeout": c["max_session_timeout"],
            "clientPortListenBacklog": c["client_port_listen_backlog"], "serverId": c["server_id"]}
    return "".join(f"{k}={v}\n" for k, v in rows.items())


def environment(service: Any) -> dict[str, str]:
    """envi's lines and the AdminServer's environment (no JVM: python.version for java.*)."""
    uname = platform.uname()
    return {"zookeeper.version": FULL_VERSION, "host.name": service.cfg.host,
            "python.version": platform.python_version(), "os.name": uname.system, "os.arch": uname.machine,
            "os.version": uname.release, "user.name": _user_name(), "user.home": os.path.expanduser("~"),
            "user.dir": os.getcwd()}


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a name (some containers)
        return str(os.getuid())
