"""TLS material for a cluster (`clusterctl tls init | client NAME`), made with `cryptography`.

- The cluster CA: an EC P-256 key and a self-signed CA certificate (ca.pem, ca.key).
- One key and certificate per node of cluster.toml: subject CN=quire-node-<id>, the node id
  also as the URI SAN `quire:node:<id>` (what a peer checks: clusterd/tls_context.py), and the
  node's host as an IP address or DNS SAN so that clients can check the name they dialed.
  Each node certificate serves and dials (serverAuth and clientAuth): a node's daemons use it
  as their client certificate on the other nodes' client and bookie ports.
- Client certificates: subject CN=<NAME>; the client port maps it to the ACL identity
  x509:CN=<NAME> (ZooKeeper's X509AuthenticationProvider takes the subject DN).

Keys are written 0600 and directories 0700. Existing files are kept, never overwritten, so
`tls init` is safe to run again after adding nodes to cluster.toml.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NODE_URI_PREFIX = "quire:node:"
CA_DAYS = 3650
LEAF_DAYS = 825
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TlsMaterialError(Exception):
    """The TLS material cannot be made or read; the message says what to do."""


def node_uri(node_id: int) -> str:
    return f"{NODE_URI_PREFIX}{node_id}"


def node_common_name(node_id: int) -> str:
    return f"quire-node-{node_id}"


@dataclass(frozen=True)
class Authority:
    """A CA's key and certificate, to sign with."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def new_authority(name: str) -> Authority:
    """A fresh self-signed CA (EC P-256) named `name`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Quire")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(key, cert)


def issue(authority: Authority, common_name: str, *, hosts: tuple[str, ...] = (),
          uris: tuple[str, ...] = ()) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and a certificate for it signed by `authority`, valid as server and as client."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = _now()
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(authority.cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
                              critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(authority.key, hashes.SHA256())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


# -- files ----------------------------------------------------------------------------

def make_private_dir(directory: Path) -> None:
    """Create `directory` (and parents) 0700; an existing one is tightened to 0700."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write `key` as unencrypted PKCS#8 PEM, created 0600 (never readable by others, not even briefly)."""
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    _write_new(path, data, 0o600)


def write_secret(path: Path, data: bytes) -> None:
    """Write bytes that contain a private key, created 0600."""
    _write_new(path, data, 0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    _write_new(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def load_authority(cert_path: Path, key_path: Path) -> Authority:
    """The CA written by `tls init`; TlsMaterialError when either file is missing or unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise TlsMaterialError(f"cannot read the cluster CA ({cert_path}, {key_path}): {e}; "
                               "run `clusterctl tls init` first") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsMaterialError(f"{key_path}: not an EC key")
    return Authority(key, cert)


def write_pair(key_path: Path, cert_path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    write_key(key_path, key)
    write_cert(cert_path, cert)
