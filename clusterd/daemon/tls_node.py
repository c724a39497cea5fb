"""A node's TLS, from cluster.toml's [tls] table: the hooks clusterd hands to its services, and
the warning about ports that listen in plain text where others can reach them.

Each function returns None when that port (or client) speaks plain TCP.
"""

from __future__ import annotations

import ipaddress
import logging

from clusterd.config import ClusterConfig, NodeConfig
from clusterd.tls_context import client_context, node_client_context, server_context
from clusterd.daemon.tls_streams import ClientTls, PeerTls, ServerTls
from edge.sockets import BOOKIE_CLIENT_TLS, METASTORE_CLIENT_TLS

log = logging.getLogger("clusterd")


def _timeout_s(config: ClusterConfig) -> float:
    assert config.tls is not None
    return config.tls.handshake_timeout_ms / 1000


def peer_tls(config: ClusterConfig, node: NodeConfig) -> PeerTls | None:
    """Mutual TLS for the Zab peer links of `node` ([tls] peer = true)."""
    tls = config.tls
    if tls is None or not tls.peer:
        return None
    return PeerTls(server_context(tls, node.id), node_client_context(tls, node.id), _timeout_s(config))


def client_port_tls(config: ClusterConfig, node: NodeConfig) -> ServerTls | None:
    """TLS on the client port ([tls] client = true), client certificates as client_auth says."""
    tls = config.tls
    if tls is None or not tls.client:
        return None
    return ServerTls(server_context(tls, node.id, client_cert=tls.client_auth), "client", _timeout_s(config))


def bookie_port_tls(config: ClusterConfig, node: NodeConfig) -> ServerTls | None:
    """TLS with a required client certificate on the bookie port ([tls] bookie = true)."""
    tls = config.tls
    if tls is None or not tls.bookie:
        return None
    return ServerTls(server_context(tls, node.id, client_cert="need"), "bookie", _timeout_s(config))


def admin_port_tls(config: ClusterConfig, node: NodeConfig) -> ServerTls | None:
    """HTTPS with a required client certificate of the cluster CA on the admin port ([tls] admin =
    true): its /status names every session's node and load, which is nobody else's business."""
    tls = config.tls
    if tls is None or not tls.admin:
        return None
    return ServerTls(server_context(tls, node.id, client_cert="need"), "admin", _timeout_s(config))


def metastore_client_tls(config: ClusterConfig, node: NodeConfig) -> ClientTls | None:
    """What the node's own metastore clients (bookie registration, GC, AutoRecovery) dial the
    client ports with: the node's certificate, the server's host checked."""
    tls = config.tls
    if tls is None or not tls.client:
        return None
    return ClientTls(node_client_context(tls, node.id, check_hostname=True), _timeout_s(config))


def admin_client_tls(config: ClusterConfig, node: NodeConfig) -> ClientTls | None:
    """What a node dials the other nodes' admin ports with (its /cluster view): its certificate."""
    tls = config.tls
    if tls is None or not tls.admin:
        return None
    return ClientTls(node_client_context(tls, node.id, check_hostname=True), _timeout_s(config))


def bookie_client_tls(config: ClusterConfig, node: NodeConfig) -> ClientTls | None:
    """What the node's own bookie clients (AutoRecovery's re-replication) dial bookies with."""
    tls = config.tls
    if tls is None or not tls.bookie:
        return None
    return ClientTls(node_client_context(tls, node.id, check_hostname=True), _timeout_s(config))


def operator_tls(config: ClusterConfig, port: str = "client") -> ClientTls | None:
    """What clusterctl dials a TLS client port (or with port="bookie" or "admin", a TLS bookie or
    admin port) with: the certificate `tls init` made for it (client-clusterctl.pem, ACL identity
    x509:CN=clusterctl)."""
    tls = config.tls
    if tls is None or not {"client": tls.client, "bookie": tls.bookie, "admin": tls.admin}[port]:
        return None
    return ClientTls(client_context(tls.ca, tls.client_cert("clusterctl"), tls.client_key("clusterctl")),
                     _timeout_s(config))


def use_node_certificate(config: ClusterConfig, node: NodeConfig) -> None:
    """Make the node's own metastore and bookie clients, in the calling task and every task it
    starts from now on, dial with TLS and the node's certificate where [tls] says so
    (edge/sockets.py METASTORE_CLIENT_TLS, BOOKIE_CLIENT_TLS). Call it at the root of the node."""
    METASTORE_CLIENT_TLS.set(metastore_client_tls(config, node))
    BOOKIE_CLIENT_TLS.set(bookie_client_tls(config, node))


def plaintext_ports(config: ClusterConfig, node: NodeConfig) -> list[str]:
    """The ports of `node` that speak plain text on an address other than loopback."""
    if _is_loopback(node.host):
        return []
    tls = config.tls
    plain = []
    if node.in_ensemble and (tls is None or not tls.peer):
        plain.append(f"peer_port {node.peer_port}")
    if node.in_ensemble and (tls is None or not tls.client):
        plain.append(f"client_port {node.client_port}")
    if node.is_bookie and (tls is None or not tls.bookie):
        plain.append(f"bookie_port {node.bookie_port}")
    if tls is None or not tls.admin:
        plain.append(f"admin_port {node.admin_port}")
    return plain


def warn_if_plaintext(config: ClusterConfig, node: NodeConfig) -> None:
    """One warning at start when the node listens in plain text where others can reach it."""
    plain = plaintext_ports(config, node)
    if plain:
        log.warning("plain text on a non-loopback address: anyone who can reach %s can read and forge "
                    "this node's traffic; add a [tls] table to cluster.toml (docs/operations.md, \"TLS\")",
                    node.host, extra={"ports": ",".join(plain)})


def admin_mutations_allowed(config: ClusterConfig, node: NodeConfig) -> bool:
    """Whether the admin port may change anything (BookKeeper's PUTs): only when it requires a
    client certificate of the cluster CA, or when nothing but this host can reach it."""
    return bool(config.tls is not None and config.tls.admin) or _is_loopback(node.bind_host)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name: assume others resolve it too
