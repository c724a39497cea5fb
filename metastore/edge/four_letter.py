"""ZooKeeper's four-letter words on the client port, answered as ZooKeeper 3.8 words them
(ruok, srvr, stat, mntr, conf, envi, isro, cons, wchs, dump, srst). kazoo reads the server
version from `envi`; Metricbeat's and Telegraf's ZooKeeper inputs read `mntr`, `srvr` and `cons`.

Everything here reads the node's state; only `srst` changes anything (it resets the latency
min/avg/max, as ZooKeeper's does). Which words a node answers is `four_letter_words` in its
config (docs/operations.md).
"""

from __future__ import annotations

import os
import platform
import resource
import time
from typing import Any

VERSION = "3.8.0-quire-0.1"
_STARTED = time.monotonic()


def answer_four_letter_word(word: str, service: Any) -> str:
    status = service.driver.status()
    mode = server_state(service, status)
    if word == "ruok":
        return "imok"
    if word == "isro":
        return service.serving_mode
    if word == "envi":
        return ("Environment:\n"
                f"zookeeper.version={VERSION}, built on quire\n"
                f"host.name=127.0.0.1\n"
                f"python.version={platform.python_version()}\n"
                f"os.name={platform.system()}\n")
    if word == "conf":
        cfg = service.cfg
        return (f"clientPort={cfg.port}\nclientPortAddress={cfg.host}\nserverId={cfg.node_id}\n"
                f"minSessionTimeout={cfg.min_session_timeout_ms}\nmaxSessionTimeout={cfg.max_session_timeout_ms}\n"
                f"tickTime={cfg.tick_ms}\n")
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
    lat_min, lat_avg, lat_max = service.latency.min_avg_max_ms()
    received, sent = packets(service)
    open_fds, max_fds = file_descriptors()
    rows: dict[str, Any] = {
        "zk_version": VERSION, "zk_server_state": server_state(service, status),
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


def connection_lines(service: Any) -> list[str]:
    """One line per client connection, in cons' format."""
    out = []
    for c in list(service.connections.values()):
        out.append(f"{c.peer}[1](queued={len(c.replies)},recved={c.received},sent={c.sent},"
                   f"sid=0x{c.session_id:x},lop=NA,est=0,to=0,lcxid=0x0,lzxid=0x{service.sm.last_zxid:x},"
                   "lresp=0,llat=0,minlat=0,avglat=0,maxlat=0)")
    return out


def dump(service: Any, status: dict) -> str:
    """Sessions with their ephemerals (ZooKeeper prints the session expiry buckets only on the leader)."""
    tree = service.sm.tree
    lines = []
    if status.get("role") == "leader":
        sessions = tree.sessions()
        lines.append(f"SessionTracker dump:\nGlobal sessions: {len(sessions)}")
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
    lat_min, lat_avg, lat_max = service.latency.min_avg_max_ms()
    received, sent = packets(service)
    return {"packets_sent": sent, "packets_received": received, "max_latency": lat_max, "min_latency": lat_min,
            "avg_latency": lat_avg, "num_alive_client_connections": len(service.connections),
            "outstanding_requests": service.stats["outstanding"], "server_state": server_state(service, status),
            "last_processed_zxid": status.get("last_committed_zxid", 0), "node_count": len(service.sm.tree),
            "uptime": int((time.monotonic() - _STARTED) * 1000)}


def server_stats(service: Any, status: dict, mode: str, *, with_clients: bool) -> str:
    """srvr, and stat (srvr with the client list)."""
    f = server_figures(service, status)
    text = (f"Zookeeper version: {VERSION}\n"
            f"Latency min/avg/max: {f['min_latency']}/{f['avg_latency']}/{f['max_latency']}\n"
            f"Received: {f['packets_received']}\nSent: {f['packets_sent']}\n"
            f"Connections: {f['num_alive_client_connections']}\nOutstanding: {f['outstanding_requests']}\n"
            f"Zxid: 0x{f['last_processed_zxid']:x}\nMode: {mode}\nNode count: {f['node_count']}\n")
    if with_clients:
        clients = "".join(f" {line}\n" for line in connection_lines(service))
        text = text.replace("Latency", f"Clients:\n{clients}\nLatency", 1)
    return text
