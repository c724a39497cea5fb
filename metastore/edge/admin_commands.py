"""ZooKeeper's AdminServer commands (`/commands/<name>` as JSON), read-only ones, answered from
the same figures as the four-letter words (metastore/edge/four_letter.py).

Names and short names as ZooKeeper 3.8 has them (`monitor` or `mntr`, `stats` or `stat`, ...);
every answer holds "command" (the full name) and "error" (null), as ZooKeeper's do. Commands
that change state (stat_reset, set_trace_mask, snapshot, restore) or need the JVM are not
served: their names answer 404 with the list of what is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metastore.edge import four_letter as F


def _monitor(service: Any, status: dict) -> dict:
    rows = F.monitor(service, status)
    out = {key[3:]: value for key, value in rows.items()}  # zk_avg_latency -> avg_latency, as ZooKeeper's JSON
    if "followers" in out:
        out["learners"] = out["followers"]  # ZooKeeper's JSON names it so; mntr says zk_followers
    return out


def _server_stats(service: Any, status: dict) -> dict:
    figures = F.server_figures(service, status)
    data_dir_size, log_dir_size = F.dir_sizes(service)
    figures.update(data_dir_size=data_dir_size, log_dir_size=log_dir_size,
                   auth_failed_count=service.stats.get("sasl_failed", 0))
    return {"server_stats": figures, "node_count": figures["node_count"], "version": F.FULL_VERSION,
            "read_only": service.serving_mode == "ro"}


def _dirs(service: Any, status: dict) -> dict:
    data_dir_size, log_dir_size = F.dir_sizes(service)
    return {"datadir_size": data_dir_size, "logdir_size": log_dir_size}


def _stats(service: Any, status: dict) -> dict:
    return {**_server_stats(service, status), **_connections(service, status)}


def _connections(service: Any, status: dict) -> dict:
    timeouts = service.sm.tree.sessions()
    # Session ids are JSON numbers, as ZooKeeper's Jackson writes a long (cons prints them in hex).
    conns = [{"remote_socket_address": c.peer, "packets_received": c.received, "packets_sent": c.sent,
              "outstanding_requests": len(c.replies), "session_id": c.session_id,
              "session_timeout": timeouts.get(c.session_id, 0)}
             for c in list(service.connections.values())]
    return {"connections": conns, "secure_connections": []}


def _watch_summary(service: Any, status: dict) -> dict:
    s = service.watches.summary()
    return {"num_connections": s["connections"], "num_paths": s["paths"], "num_total_watches": s["watches"]}


def _dump(service: Any, status: dict) -> dict:
    tree = service.sm.tree
    sessions = tree.sessions()
    return {"expiry_time_to_session_ids": {},  # Quire expires sessions by ticks, not in time buckets
            # Keyed by the session id in decimal, as ZooKeeper's JSON map of longs.
            "session_id_to_ephemeral_paths": {str(sid): tree.ephemerals(sid) for sid in sorted(sessions)
                                              if tree.ephemerals(sid)},
            "session_timeouts_ms": {str(sid): timeout for sid, timeout in sorted(sessions.items())}}


def _environment(service: Any, status: dict) -> dict:
    return F.environment(service)


def _configuration(service: Any, status: dict) -> dict:
    return F.configuration(service)


def _is_read_only(service: Any, status: dict) -> dict:
    return {"read_only": service.serving_mode == "ro"}


def _leader(service: Any, status: dict) -> dict:
    leader = status.get("leader")
    address = service.driver.transport.addresses.get(leader) if leader is not None else None
    return {"is_leader": status.get("role") == "leader", "leader_id": leader,
            "leader_ip": address[0] if address else None}


def _zabstate(service: Any, status: dict) -> dict:
    return {"voting": status.get("role") in ("leader", "follower"), "zabstate": str(status.get("phase", "")).lower()}


def _ruok(service: Any, status: dict) -> dict:
    return {}


COMMANDS: dict[str, tuple[str, Callable[[Any, dict], dict]]] = {
    "monitor": ("mntr", _monitor), "server_stats": ("srvr", _server_stats), "stats": ("stat", _stats),
    "connections": ("cons", _connections), "watch_summary": ("wchs", _watch_summary), "dump": ("dump", _dump),
    "environment": ("envi", _environment), "configuration": ("conf", _configuration),
    "is_read_only": ("isro", _is_read_only), "leader": ("lead", _leader), "zabstate": ("zabstate", _zabstate),
    "ruok": ("ruok", _ruok), "dirs": ("dirs", _dirs),
}
_BY_SHORT = {short: name for name, (short, _) in COMMANDS.items()}


def run_command(name: str, service: Any) -> dict | None:
    """The JSON answer of command `name` (full or short name); None if it is not served."""
    name = _BY_SHORT.get(name, name)
    entry = COMMANDS.get(name)
    if entry is None:
        return None
    status = service.driver.status()
    return {**entry[1](service, status), "command": name, "error": None}


def command_names() -> list[str]:
    return sorted(COMMANDS)
