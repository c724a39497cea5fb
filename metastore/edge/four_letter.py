"""ZooKeeper's four-letter words on the client port (ruok, srvr, stat, mntr, conf,
envi, isro). kazoo reads the server version from `envi`."""

from __future__ import annotations

import platform
from typing import Any

VERSION = "3.8.0-quire-0.1"


def answer_four_letter_word(word: str, service: Any) -> str:
    status = service.driver.status()
    mode = {"leader": "leader", "follower": "follower", "observer": "observer"}.get(status.get("role"), "looking")
    mode = "read-only" if service.serving_mode == "ro" else mode  # as ZooKeeper's srvr and stat say it
    tree = service.sm.tree
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
        rows = {
            "zk_version": VERSION, "zk_server_state": mode, "zk_znode_count": len(tree),
            "zk_watch_count": service.watches.count(), "zk_ephemerals_count": sum(
                len(tree.ephemerals(s)) for s in tree.sessions()),
            "zk_num_alive_connections": len(service.connections), "zk_packets_received": service.stats["requests"],
            "zk_last_zxid": status.get("last_committed_zxid", 0),
        }
        return "".join(f"{k}\t{v}\n" for k, v in rows.items())
    # srvr and stat
    text = (f"Zookeeper version: {VERSION}\n"
            f"Latency min/avg/max: 0/0/0\nReceived: {service.stats['requests']}\n"
            f"Sent: {service.stats['requests'] + service.stats['notifications']}\n"
            f"Connections: {len(service.connections)}\nOutstanding: 0\n"
            f"Zxid: 0x{status.get('last_committed_zxid', 0):x}\nMode: {mode}\nNode count: {len(tree)}\n")
    if word == "stat":
        clients = "".join(f" {c.peer}[1](queued=0,recved=0,sent=0)\n" for c in service.connections.values())
        text = text.replace("Latency", f"Clients:\n{clients}\nLatency", 1)
    return text
