"""`ssl.SSLContext`s for a node's ports and clients, from the [tls] table, and the identities a
verified peer certificate carries.

Every context is TLS 1.2 or newer and trusts only the cluster CA (not the system's roots). A
node's servers present the node's certificate; its clients (Zab dialers, the daemons' metastore
and bookie clients) present the same one. Peer links and the bookie port require a client
certificate (CERT_REQUIRED); the client port requires one with client_auth = "need" and asks
for one with "want", as ZooKeeper's ssl.clientAuth.

The node id of a peer is read from its certificate's URI SAN `quire:node:<id>`
(clusterd/ctl/tls_material.py writes it), never from what the peer says about itself.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from cryptography import x509

from clusterd.tls_config import TlsConfig
from clusterd.ctl.tls_material import NODE_URI_PREFIX


class TlsSetupError(Exception):
    """The TLS material of this node cannot be loaded; the message names the file and the fix."""


def server_context(tls: TlsConfig, node_id: int, *, client_cert: str = "need") -> ssl.SSLContext:
    """The context a node's port serves with; `client_cert` is "need" (required) or "want" (asked)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(context, tls, tls.node_cert(node_id), tls.node_key(node_id))
    context.verify_mode = ssl.CERT_REQUIRED if client_cert == "need" else ssl.CERT_OPTIONAL
    return context


def node_client_context(tls: TlsConfig, node_id: int, *, check_hostname: bool = False) -> ssl.SSLContext:
    """The context a node dials with, presenting its own certificate. Peer links check the node id
    in the server's certificate themselves (check_hostname False); other clients check the host."""
    return client_context(tls.ca, tls.node_cert(node_id), tls.node_key(node_id), check_hostname=check_hostname)


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None, *,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A client's context: trusts `ca`, presents `cert`/`key` when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2: one handshake per connection, as TLS 1.3
    _load_ca(context, ca)
    if cert is not None:
        _load_chain(context, cert, key)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _common(context: ssl.SSLContext, tls: TlsConfig, cert: Path, key: Path) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2: a client may not ask for another handshake
    _load_chain(context, cert, key)
    _load_ca(context, tls.ca)


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path | None) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise TlsSetupError(f"cannot load the TLS certificate {cert} and key {key}: {e}; "
                            "run `clusterctl tls init` (or check [tls] cert and key in cluster.toml)") from None


def _load_ca(context: ssl.SSLContext, ca: Path) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise TlsSetupError(f"cannot load the cluster CA {ca}: {e}; run `clusterctl tls init` "
                            "(or check [tls] ca in cluster.toml)") from None


def certificate_node_ids(connection: Any) -> set[int]:
    """The node ids a verified peer certificate names (URI SANs quire:node:<id>); empty if none.
    `connection`: anything with ssl's getpeercert (an SSLObject, edge.tls_stream.TlsStream)."""
    cert = connection.getpeercert()
    ids = set()
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(NODE_URI_PREFIX) and value[len(NODE_URI_PREFIX):].isdigit():
            ids.add(int(value[len(NODE_URI_PREFIX):]))
    return ids


def certificate_subject(connection: Any) -> str | None:
    """The verified peer certificate's subject DN as RFC 2253/4514 text (e.g. "CN=alice"), the id
    ZooKeeper's X509AuthenticationProvider gives a client; None without a certificate."""
    der = connection.getpeercert(binary_form=True)
    if not der:
        return None
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()
