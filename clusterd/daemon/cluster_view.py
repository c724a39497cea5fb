"""`/cluster` on the admin port: every node's /status as this node sees it now (what the
status page, clusterd/daemon/status_page.py, polls), a node that does not answer as null."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from clusterd import localcluster
from clusterd.config import ClusterConfig, NodeConfig
from clusterd.daemon import tls_node

PEER_TIMEOUT_S = 1.0  # a page polls every 2 s: a node slower than this shows as down


def cluster_view(config: ClusterConfig, node: NodeConfig,
                 own_status: Callable[[], dict[str, Any]]) -> Callable[[], Awaitable[dict[str, Any]]]:
    """The `/cluster` handler of `node`: its own status directly, the others' over their admin
    ports (with the node's certificate where [tls] admin is on)."""
    tls = tls_node.admin_client_tls(config, node)

    async def view() -> dict[str, Any]:
        found = await localcluster.fetch_statuses(config, timeout_s=PEER_TIMEOUT_S, tls=tls,
                                                  known={node.id: own_status()})
        return {"cluster": config.name, "from": node.id,
                "nodes": [{"id": n.id, "host": n.host, "roles": sorted(n.roles), "status": found[n.id]}
                          for n in config.nodes]}

    return view
