"""`clusterctl tls init` and `clusterctl tls client NAME`: the cluster's TLS material.

    clusterctl tls init           # the cluster CA, then a key and certificate for every node
    clusterctl tls client NAME    # a client certificate (ACL identity x509:CN=NAME)

Files go to the [tls] table's dir (default: tls/ beside cluster.toml); see docs/operations.md, "TLS".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clusterd.config import ClusterConfig
from clusterd.tls_config import TlsConfig, parse_tls
from clusterd.ctl.tls_material import (CLIENT_NAME, TlsMaterialError, issue, load_authority, make_private_dir,
                                   new_authority, node_common_name, node_uri, write_cert, write_key, write_pair,
                                   write_secret)

EXIT_FAILED = 1
OPERATOR = "clusterctl"  # the client certificate `tls init` makes for clusterctl itself
EXIT_USAGE = 2


def add_commands(command: Any) -> None:
    tls = command("tls", cmd_tls, "make the cluster's TLS material: `tls init` (CA and node certificates), "
                  "`tls client NAME` (a client certificate)")
    tls.add_argument("action", choices=("init", "client"))
    tls.add_argument("name", nargs="?", help="client: the certificate's name (its CN)")


def tls_settings(config: ClusterConfig) -> TlsConfig:
    """The cluster's [tls] table, or its defaults when the file has none yet."""
    tls = getattr(config, "tls", None)
    return tls if tls is not None else parse_tls({}, config.path)


def cmd_tls(config: ClusterConfig, args: argparse.Namespace) -> int:
    tls = tls_settings(config)
    try:
        if args.action == "init":
            if args.name is not None:
                return _usage("`tls init` takes no NAME")
            init(config, tls)
            if getattr(config, "tls", None) is None:
                print(f"add a [tls] table to {config.path} to turn TLS on (docs/operations.md, \"TLS\")")
            return 0
        if args.name is None or not CLIENT_NAME.fullmatch(args.name):
            return _usage("`tls client NAME`: NAME of letters, digits, '.', '_' and '-' (at most 64)")
        client(tls, args.name)
        return 0
    except TlsMaterialError as e:
        print(f"clusterctl: {e}", file=sys.stderr)
        return EXIT_FAILED


def _usage(message: str) -> int:
    print(f"clusterctl: {message}", file=sys.stderr)
    return EXIT_USAGE


def init(config: ClusterConfig, tls: TlsConfig) -> None:
    """The CA (kept if it exists) and every node's key and certificate that does not exist yet."""
    make_private_dir(tls.dir)
    if tls.ca.exists() or tls.ca_key.exists():
        authority = load_authority(tls.ca, tls.ca_key)
        print(f"kept the cluster CA {tls.ca}")
    else:
        make_private_dir(tls.ca_key.parent)
        authority = new_authority(f"quire CA {config.name}")
        write_key(tls.ca_key, authority.key)
        write_cert(tls.ca, authority.cert)
        print(f"created the cluster CA {tls.ca} (key {tls.ca_key}: keep it off the nodes if you can)")
    for node in config.nodes:
        cert_path, key_path = tls.node_cert(node.id), tls.node_key(node.id)
        if cert_path.exists() or key_path.exists():
            print(f"node {node.id}: kept {cert_path}")
            continue
        make_private_dir(key_path.parent)
        key, cert = issue(authority, node_common_name(node.id), hosts=_sans(node.host),
                          uris=(node_uri(node.id),))
        write_pair(key_path, cert_path, key, cert)
        print(f"node {node.id}: created {cert_path} (CN={node_common_name(node.id)}, {node_uri(node.id)}, "
              f"host {node.host})")
    if not tls.client_cert(OPERATOR).exists():  # clusterctl's own znode commands on a TLS client port
        client(tls, OPERATOR)


def _sans(host: str) -> tuple[str, ...]:
    # A node on loopback is also dialed as "localhost" by local tools.
    return (host, "localhost") if host in ("127.0.0.1", "::1", "localhost") and host != "localhost" else (host,)


def client(tls: TlsConfig, name: str) -> None:
    """A client key and certificate signed by the cluster CA, subject CN=<name>."""
    authority = load_authority(tls.ca, tls.ca_key)
    cert_path, key_path = tls.client_cert(name), tls.client_key(name)
    if cert_path.exists() or key_path.exists():
        raise TlsMaterialError(f"{cert_path} or {key_path} exists already: pick another NAME or remove them")
    if (tls.dir / f"client-{name}.keystore.pem").exists():
        raise TlsMaterialError(f"{tls.dir / f'client-{name}.keystore.pem'} exists already: remove it first")
    key, cert = issue(authority, name)
    write_pair(key_path, cert_path, key, cert)
    # Java clients (zkCli.sh) read key and certificate from one PEM "key store" (zookeeper.ssl.keyStore.type=PEM).
    keystore = tls.dir / f"client-{name}.keystore.pem"
    write_secret(keystore, key_path.read_bytes() + cert_path.read_bytes())
    print(f"created {cert_path} and {key_path} (ACL identity x509:CN={name}), {keystore} for Java clients; "
          f"CA certificate: {tls.ca}")
