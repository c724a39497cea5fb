"""The cluster secret: random bytes chosen once per cluster by its first leader and
committed through Zab, so every node holds the same ones (in the tree, so
snapshots and the SNAP sync carry them too).

Session passwords and the super identity's envelope token derive from it, so
there is no shipped default a client could know: a client that learns a session
id (ephemeralOwner from exists()) cannot resume or close that session without its
password. The secret lives in the znode SECRET_PATH, whose ACL grants nothing to
anyone who can authenticate (a digest id of random bytes nobody knows the
password of), whose data the read handlers refuse to every client, super included
(metastore.core.responses: super passes every ACL), and which the preparer refuses to let
any client write, delete or create (metastore.core.prep); only the leader's INIT_SECRET
envelope creates it, once.

Pure: the service (an edge) draws the random bytes and hands them in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from metastore.core.acl import ACL, Id, Perm
from metastore.core.tree import DataTree

SECRET_PATH = "/zookeeper/quire-cluster-secret"
SECRET_BYTES = 32
PASSWORD_BYTES = 16


def secret_acl(secret: bytes) -> tuple[ACL, ...]:
    """READ for a digest id derived from the secret: nobody can authenticate as it
    (that would need a preimage of its hash), so no client reads the secret."""
    digest = base64.b64encode(hashlib.sha1(b"quire-internal:" + secret).digest()).decode("ascii")
    return (ACL(Perm.READ, Id("digest", "quire-internal:" + digest)),)


def read_secret(tree: DataTree) -> bytes | None:
    """The committed cluster secret, or None before the first leader has committed it."""
    node = tree.node(SECRET_PATH)
    return None if node is None else node.data


def is_protected(path: str) -> bool:
    """Paths no client request may create, change or delete."""
    return path == SECRET_PATH or path.startswith(SECRET_PATH + "/")


def session_password(secret: bytes, configured: bytes, session_id: int) -> bytes:
    """The 16-byte password of a session: HMAC of its id, keyed by the cluster secret
    (and the operator's optional `session_secret`)."""
    key = hmac.new(secret, b"session-password" + configured, hashlib.sha256).digest()
    return hmac.new(key, (session_id & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big"),
                    hashlib.sha256).digest()[:PASSWORD_BYTES]


def super_token(secret: bytes) -> str:
    """What an envelope carries as the id of a "super" identity its origin node granted.
    A super id with any other value (forged on the network) is ignored by the preparer."""
    return hmac.new(secret, b"super-identity", hashlib.sha256).hexdigest()
