"""The optional `[tls]` table of cluster.toml: where the TLS material is and which ports use it.

    [tls]
    dir = "tls"                  # relative: against cluster.toml's folder (default "tls")
    ca = "ca.pem"                # the cluster CA's certificate, relative to dir
    ca_key = "ca.key"            # its key: read by `clusterctl tls` only, never by clusterd
    cert = "node-{id}.pem"       # each node's certificate and key; {id} is the node id
    key = "node-{id}.key"
    peer = true                  # Zab peer links: mutual TLS, the certificate names the node id
    client = true                # the client port serves TLS only (ZooKeeper's secureClientPort)
    bookie = true                # the bookie port: TLS with client certificates
    admin = true                 # the admin port (HTTP /status, /metrics): HTTPS with client certificates
    client_auth = "need"         # the client port: "need" (a certificate is required) or "want"
    handshake_timeout_ms = 5000  # a connection that has not finished its TLS handshake by then is closed

Without the table every port speaks plain TCP (local development). The parsing
here is pure; clusterd/tls_context.py builds the ssl contexts from the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

CLIENT_AUTH = ("need", "want")
DEFAULT_DIR = "tls"


class TlsConfigError(ValueError):
    """A key of [tls] is unusable; config.py adds the file name to the message."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The validated [tls] table; paths are absolute."""

    dir: Path
    ca: Path
    ca_key: Path
    cert_template: str = "node-{id}.pem"
    key_template: str = "node-{id}.key"
    peer: bool = True
    client: bool = True
    bookie: bool = True
    admin: bool = True
    client_auth: str = "need"
    handshake_timeout_ms: int = 5_000

    def node_cert(self, node_id: int) -> Path:
        """The certificate file of node `node_id` (absolute)."""
        return self.dir / self.cert_template.format(id=node_id)

    def node_key(self, node_id: int) -> Path:
        """The private key file of node `node_id` (absolute)."""
        return self.dir / self.key_template.format(id=node_id)

    def client_cert(self, name: str) -> Path:
        """Where `clusterctl tls client NAME` writes NAME's certificate."""
        return self.dir / f"client-{name}.pem"

    def client_key(self, name: str) -> Path:
        return self.dir / f"client-{name}.key"

    def to_table(self, folder: PurePath) -> dict[str, Any]:
        """The [tls] table's values for cluster.toml (paths inside `folder` relative to it)."""
        def rel(p: Path, base: PurePath) -> str:
            return (p.relative_to(base) if p.is_relative_to(base) else p).as_posix()
        values: dict[str, Any] = {
            "dir": rel(self.dir, folder), "ca": rel(self.ca, self.dir), "ca_key": rel(self.ca_key, self.dir),
            "cert": self.cert_template,
            "key": self.key_template, "peer": self.peer, "client": self.client, "bookie": self.bookie, "admin": self.admin,
            "client_auth": self.client_auth, "handshake_timeout_ms": self.handshake_timeout_ms}
        return values


_KINDS: dict[str, type] = {"dir": str, "ca": str, "ca_key": str, "cert": str, "key": str, "peer": bool,
                           "client": bool, "bookie": bool, "admin": bool, "client_auth": str, "handshake_timeout_ms": int}


def parse_tls(raw: dict[str, Any], config_path: Path) -> TlsConfig:
    """Validate the [tls] table of the cluster.toml at `config_path`; TlsConfigError names the key."""
    for key, value in raw.items():
        kind = _KINDS.get(key)
        if kind is None:
            raise TlsConfigError(f"unknown key {key!r} (known: {', '.join(_KINDS)})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TlsConfigError(f"key {key!r}: expected {kind.__name__}, got {value!r}")
        if kind is str and not value.strip():
            raise TlsConfigError(f"key {key!r}: must not be empty")
    base = Path(raw.get("dir", DEFAULT_DIR))
    directory = base if base.is_absolute() else config_path.parent / base
    for key in ("cert", "key"):
        template = raw.get(key, "")
        if key in raw and "{id}" not in template:
            raise TlsConfigError(f"key {key!r}: must contain {{id}} (each node has its own), got {template!r}")
    if raw.get("client_auth", "need") not in CLIENT_AUTH:
        raise TlsConfigError(f"key 'client_auth': must be one of {', '.join(CLIENT_AUTH)}, got {raw['client_auth']!r}")
    timeout = raw.get("handshake_timeout_ms", 5_000)
    if timeout < 1:
        raise TlsConfigError(f"key 'handshake_timeout_ms': must be at least 1, got {timeout}")
    return TlsConfig(
        dir=directory, ca=directory / raw.get("ca", "ca.pem"), ca_key=directory / raw.get("ca_key", "ca.key"),
        cert_template=raw.get("cert", "node-{id}.pem"), key_template=raw.get("key", "node-{id}.key"),
        peer=raw.get("peer", True), client=raw.get("client", True), bookie=raw.get("bookie", True), admin=raw.get("admin", True),
        client_auth=raw.get("client_auth", "need"), handshake_timeout_ms=timeout)
