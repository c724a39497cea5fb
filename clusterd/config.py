"""`cluster.toml`: the one description of a cluster, loaded into validated frozen data.

Layout (every key is documented in docs/operations.md):

    [cluster]            # cluster-wide settings, all optional
    name = "quire-local"
    tick_ms = 50
    ...
    [[node]]             # one table per node, every key required but bind_host
    id = 1
    host = "127.0.0.1"        # the address others dial; bind_host (optional): where listeners bind
    peer_port = 28881
    client_port = 21811
    admin_port = 18081
    roles = ["voter", "bookie"]
    data_dir = "data/node1"   # relative: against this file's folder

Anything unusable is refused with a `ConfigError` naming the file, the table and
the key, so that a typo never silently becomes a default.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

from clusterd.bind_address import bind_address_problem
from clusterd.tls_config import TlsConfig, TlsConfigError, parse_tls
from clusterd.toml_table import ConfigError, Table, describe, suggest
from metastore.core.acl import parse_super_digest
from metastore.edge.sasl_edge import ENFORCEABLE_SCHEMES, SaslConfigError, read_users_file
from zab.core.config import ZabConfig, ZabConfigError

VOTER = "voter"
OBSERVER = "observer"
BOOKIE = "bookie"
ROLES = (VOTER, OBSERVER, BOOKIE)
MAX_NODE_ID = 255  # ids are packed into session ids (metastore/edge/service.py) and request ids (zab/edge/driver.py)
PORT_KEYS = ("peer_port", "client_port", "admin_port")
BOOKIE_PORT = "bookie_port"  # required on, and only on, nodes with the bookie role
BOOKIE_JOURNAL_DIR = "bookie_journal_dir"  # optional, only on nodes with the bookie role
BIND_HOST = "bind_host"  # optional: the address every listener of the node binds (ZooKeeper's clientPortAddress)
NODE_KEYS = ("id", "host", *PORT_KEYS, BOOKIE_PORT, "roles", "data_dir")  # the required ones


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node of the cluster: where it listens, what it does, where it keeps its data."""

    id: int
    host: str  # the address the others dial
    bind_host: str  # the address every listener of the node binds: `bind_host` in the file, else host
    peer_port: int
    client_port: int
    admin_port: int
    roles: frozenset[str]
    data_dir: Path  # always absolute
    bookie_port: int | None = None  # set exactly when the node has the bookie role
    bookie_journal_dir: Path | None = None  # the journal's own directory (absolute); None: in data_dir/bookie

    @property
    def is_voter(self) -> bool:
        return VOTER in self.roles

    @property
    def is_observer(self) -> bool:
        return OBSERVER in self.roles

    @property
    def is_bookie(self) -> bool:
        return BOOKIE in self.roles

    @property
    def ports(self) -> dict[str, int]:
        """Every port the node listens on, by key."""
        ports = {key: getattr(self, key) for key in PORT_KEYS}
        if self.bookie_port is not None:
            ports[BOOKIE_PORT] = self.bookie_port
        return ports

    @property
    def in_ensemble(self) -> bool:
        """True when the node runs a Zab peer (voter or observer)."""
        return self.is_voter or self.is_observer


_ZAB = {f.name: f.default for f in fields(ZabConfig)}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Cluster-wide settings and the nodes. Durations are in ticks of `tick_ms`."""

    path: Path  # the file this came from (absolute)
    nodes: tuple[NodeConfig, ...]
    name: str = "quire"
    # Zab's own settings default to the core's defaults (one place to change them).
    tick_ms: int = _ZAB["tick_ms"]
    election_finalize_ticks: int = _ZAB["election_finalize_ticks"]
    election_resend_ticks: int = _ZAB["election_resend_ticks"]
    init_limit_ticks: int = _ZAB["init_limit_ticks"]
    sync_limit_ticks: int = _ZAB["sync_limit_ticks"]
    ping_interval_ticks: int = _ZAB["ping_interval_ticks"]
    sync_window_txns: int = _ZAB["sync_window_txns"]
    sync_window_bytes: int = _ZAB["sync_window_bytes"]
    snapshot_every_txns: int = _ZAB["snapshot_every_txns"]
    snapshots_retained: int = 3
    max_frame_bytes: int = 64 << 20
    send_queue_max: int = 10_000
    send_queue_max_bytes: int = 128 << 20  # bytes queued per peer link (zab/edge/transport.py)
    log_queue_max_bytes: int = 64 << 20  # log writes queued for the disk before new work waits (zab/edge/log_writer.py)
    client_protocol: str = "zookeeper"  # the only value; the key stays to refuse the retired "kv" by name
    min_session_timeout_ms: int = 2_000
    max_session_timeout_ms: int = 60_000
    session_secret: str = ""  # optional, mixed into the session-password key (metastore/core/cluster_secret.py)
    # The client port's limits (metastore/edge/edge_guard.py ClientLimits), ZooKeeper's names in docs/operations.md.
    jute_max_buffer_bytes: int = 0xFFFFF  # jute.maxbuffer: the largest buffer in a request or reply
    client_outgoing_max_bytes: int = 32 << 20  # replies queued for a client that does not read; more: cut off
    client_reply_max_bytes: int = 1 << 30  # ... for every client connection of the node together
    max_client_connections: int = 60  # maxClientCnxns: connections from one client address
    max_client_connections_total: int = 4096  # maxCnxns: client connections to one node
    client_handshake_timeout_ms: int = 10_000  # accept to a whole ConnectRequest, idle time included
    global_outstanding_limit: int = 1000  # globalOutstandingLimit: requests in flight before reading pauses
    global_outstanding_bytes: int = 64 << 20  # the same in request bytes
    # Memory bounds of the client port's state (docs/operations.md, "Memory bounds").
    max_watch_bytes_per_connection: int = 64 << 20  # watches of one connection, 450 B + path each; more: refused
    max_watch_bytes: int = 512 << 20  # watches of all connections of a node; more: refused
    max_sessions: int = 100_000  # sessions in the tree; a new one beyond: its connection is closed
    # ZooKeeper's superDigest "user:base64(sha1(user:password))" (acl.generate_digest): passes every ACL.
    super_digest: str = ""
    # SASL DIGEST-MD5: ZooKeeper's JAAS file (its Server section's users, metastore/core/sasl_users.py); "": off.
    sasl_users_file: str = ""
    # ZooKeeper's enforce.auth.schemes (sasl, digest, x509): a session with none of them is refused.
    enforce_auth_schemes: str = ""
    # answered on the client port (allow-list)
    four_letter_words: str = "ruok,srvr,stat,mntr,conf,envi,isro,cons,wchs,dump"
    read_only_mode: bool = False  # ZooKeeper's readonlymode.enabled: without a quorum, serve read-only sessions
    metrics: bool = True  # record latency histograms (edge/metrics.py); off only to measure what they cost
    bookie_max_entry_bytes: int = 5 << 20  # bookies (nodes with the bookie role): the largest packaged entry stored
    bookie_max_in_flight: int = 10_000  # requests served at once per bookie connection; more: OVERLOADED
    # The bookie port's limits (bookie/service_config.py): per connection, then per address and in total.
    bookie_max_in_flight_bytes: int = 256 << 20  # adds of one connection awaiting their fsync; more: OVERLOADED
    bookie_max_outgoing_bytes: int = 64 << 20  # answers queued for a client that does not read; more: cut off
    bookie_max_outgoing_bytes_total: int = 1 << 30  # ... for every connection of the bookie together
    bookie_max_in_flight_bytes_total: int = 1 << 30  # adds of every connection awaiting their fsync; more: OVERLOADED
    bookie_handshake_timeout_ms: int = 10_000  # a new connection must send a whole frame (and TLS handshake) by then
    bookie_read_timeout_ms: int = 30_000  # a connection stopped this long in the middle of a frame is closed
    bookie_max_connections: int = 1024  # connections to the bookie port at once; more are closed at once
    bookie_max_connections_per_address: int = 60  # from one client address (ZooKeeper's maxClientCnxns)
    bookie_disk_usage_percent: int = 95  # above this much of its filesystem used, a bookie turns read-only
    bookie_max_index_bytes: int = 1 << 30  # above this much index memory (bookie/index.py), too (at least 4096)
    bookie_entry_log_bytes: int = 128 << 20  # entry logs rotate at this size; compaction reclaims whole logs
    bookie_gc_interval_ms: int = 60_000  # how often a bookie looks for deleted ledgers (two misses needed)
    # AutoRecovery (ledger/autorecovery/tasks.py, docs/autorecovery.md), on every bookie node.
    autorecovery_grace_ms: int = 30_000  # unregistered this long, a bookie is lost and its ledgers re-replicated
    autorecovery_open_ledger_grace_ms: int = 30_000  # an open ledger's last fragment is left to its writer this long
    audit_interval_ms: int = 300_000  # full ledger rescans and the replica check, this often
    audit_check_reads_per_s: int = 2_000  # the replica check's read rate
    autorecovery_session_timeout_ms: int = 10_000  # the auditor's and workers' metastore sessions
    tls: TlsConfig | None = None  # the [tls] table (clusterd/tls_config.py); None: plain TCP everywhere

    @property
    def four_letter_word_set(self) -> frozenset[str]:
        return frozenset(w.strip() for w in self.four_letter_words.split(",") if w.strip())

    @property
    def enforce_auth_scheme_set(self) -> frozenset[str]:
        return frozenset(s.strip() for s in self.enforce_auth_schemes.split(",") if s.strip())

    @property
    def voters(self) -> frozenset[int]:
        return frozenset(n.id for n in self.nodes if n.is_voter)

    @property
    def observers(self) -> frozenset[int]:
        return frozenset(n.id for n in self.nodes if n.is_observer)

    @property
    def ensemble(self) -> tuple[NodeConfig, ...]:
        """The nodes that run a Zab peer (voters and observers), the ones clusterd can run today."""
        return tuple(n for n in self.nodes if n.in_ensemble)

    def node(self, node_id: int) -> NodeConfig:
        """The node with this id; ConfigError if the file has none."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        known = ", ".join(str(n.id) for n in self.nodes)
        raise ConfigError(f"{self.path}: no [[node]] with id {node_id} (ids: {known})")

    def peer_addresses(self) -> dict[int, tuple[str, int]]:
        """Zab peer address of every ensemble member (voters and observers)."""
        return {n.id: (n.host, n.peer_port) for n in self.ensemble}

    def bookie_addresses(self) -> dict[int, tuple[str, int]]:
        """Bookie port of every node with the bookie role."""
        return {n.id: (n.host, n.bookie_port) for n in self.nodes if n.bookie_port is not None}

    def client_addresses(self) -> list[tuple[str, int]]:
        """Client port of every node that serves clients (the ensemble)."""
        return [(n.host, n.client_port) for n in self.ensemble]

    def zab_config(self, node_id: int) -> ZabConfig:
        """The Zab peer configuration of `node_id`, which must be a voter or an observer."""
        node = self.node(node_id)
        if not node.in_ensemble:
            raise ConfigError(f"{self.path}: node {node_id} has roles {sorted(node.roles)}: "
                              "it is neither a voter nor an observer, so it runs no Zab peer")
        try:
            return self._zab_config(node_id)
        except ZabConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def _zab_config(self, node_id: int) -> ZabConfig:
        return ZabConfig(
            my_id=node_id, voters=self.voters, observers=self.observers, tick_ms=self.tick_ms,
            election_finalize_ticks=self.election_finalize_ticks,
            election_resend_ticks=self.election_resend_ticks,
            init_limit_ticks=self.init_limit_ticks, sync_limit_ticks=self.sync_limit_ticks,
            ping_interval_ticks=self.ping_interval_ticks, sync_window_txns=self.sync_window_txns,
            sync_window_bytes=self.sync_window_bytes, snap_chunk_bytes=min(1 << 20, self.max_frame_bytes // 4),
            snapshot_every_txns=self.snapshot_every_txns)


# Cluster-wide keys and their defaults, taken from the dataclass so there is one list.
CLUSTER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(ClusterConfig) if f.name not in ("path", "nodes", "tls")}


CLIENT_PROTOCOLS = ("zookeeper",)
_MAY_BE_EMPTY = frozenset({"super_digest", "session_secret", "sasl_users_file", "enforce_auth_schemes"})  # empty: the setting is off
_KNOWN_SECRETS = frozenset({"quire-change-me", "quire"})  # shipped defaults once: everyone knows them (issue 17)
BOOKIE_MAX_ENTRY_BYTES_LIMIT = 64 << 20  # the storage engine's ceiling (bookie/storage_config.py)
KNOWN_FOUR_LETTER_WORDS = frozenset({"ruok", "srvr", "stat", "mntr", "conf", "envi", "isro", "cons", "wchs", "dump",
                                     "srst"})


def load(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster.toml; relative data dirs resolve against its folder."""
    path = Path(path).absolute()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse(text, path)


def parse(text: str, path: Path) -> ClusterConfig:
    """Validate the TOML text of the file at `path` (used for messages and relative dirs)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    top = Table(doc, path, "top level")
    cluster = Table(top.take("cluster", dict, default={}), path, "[cluster]")
    raw_nodes = top.take("node", list, required_hint="at least one [[node]] table")
    raw_tls = top.take("tls", dict, default=None)
    top.finish()
    settings = {key: _take_setting(cluster, key, default) for key, default in CLUSTER_DEFAULTS.items()}
    cluster.finish()
    nodes = tuple(_parse_node(raw, i, path) for i, raw in enumerate(raw_nodes, start=1))
    try:
        tls = None if raw_tls is None else parse_tls(raw_tls, path)
    except TlsConfigError as e:
        raise ConfigError(f"{path}: [tls]: {e}") from None
    if settings["sasl_users_file"]:  # absolute, so the setting survives to_toml into another folder
        settings["sasl_users_file"] = str(_absolute(Path(settings["sasl_users_file"]), path))
    config = ClusterConfig(path=path, nodes=nodes, tls=tls, **settings)
    _check_cluster(config)
    return config


def _take_setting(table: Table, key: str, default: Any) -> Any:
    if key in _MAY_BE_EMPTY:
        return table.take(key, str, default)
    if isinstance(default, str):
        return table.take_str(key, default=default)
    if isinstance(default, bool):
        return table.take(key, bool, default)
    # Every numeric setting is a count, a size or a duration: zero or less is never meaningful.
    return table.take_int(key, default=default, minimum=1)


def _parse_node(raw: Any, index: int, path: Path) -> NodeConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [[node]] #{index}: expected a table, got {describe(raw)}")
    where = f"[[node]] #{index}" + (f" (id {raw['id']})" if type(raw.get("id")) is int else "")
    table = Table(raw, path, where)
    node_id = table.take_int("id", minimum=1, maximum=MAX_NODE_ID)
    host = table.take_str("host")
    bind_host = _take_bind_host(table, host)
    ports = {key: table.take_int(key, minimum=1, maximum=65535) for key in PORT_KEYS}
    roles = _take_roles(table)
    bookie_port = None
    if BOOKIE in roles:
        bookie_port = table.take_int(BOOKIE_PORT, minimum=1, maximum=65535)
    elif BOOKIE_PORT in raw:
        table.fail(BOOKIE_PORT, "only a node with the 'bookie' role has a bookie port")
    data_dir = _absolute(Path(table.take_str("data_dir")), path)
    journal_dir = table.take(BOOKIE_JOURNAL_DIR, str, None)
    if journal_dir is not None:
        if BOOKIE not in roles:
            table.fail(BOOKIE_JOURNAL_DIR, "only a node with the 'bookie' role has a bookie journal")
        if not journal_dir.strip():
            table.fail(BOOKIE_JOURNAL_DIR, "must not be empty")
        journal_dir = _absolute(Path(journal_dir), path)
        if journal_dir.is_relative_to(data_dir / "bookie"):
            table.fail(BOOKIE_JOURNAL_DIR, f"{journal_dir} is inside the bookie's own directory {data_dir / 'bookie'}; "
                       "give the journal a directory elsewhere (on a device of its own), or leave the key out")
    table.finish()
    return NodeConfig(id=node_id, host=host, roles=roles, data_dir=data_dir, bookie_port=bookie_port,
                      bookie_journal_dir=journal_dir, bind_host=bind_host, **ports)


def _take_bind_host(table: Table, host: str) -> str:
    value = table.take(BIND_HOST, str, host)
    if value != host and (problem := bind_address_problem(value)):
        table.fail(BIND_HOST, problem)
    return value


def _absolute(directory: Path, path: Path) -> Path:
    """A directory of the config file: a relative one resolves against the file's folder."""
    return Path(os.path.normpath(directory if directory.is_absolute() else path.parent / directory))


def _take_roles(table: Table) -> frozenset[str]:
    roles = table.take("roles", list)
    for role in roles:
        if role not in ROLES:
            table.fail("roles", f"unknown role {role!r}{suggest(role, ROLES)} (roles: {', '.join(ROLES)})")
    if not roles:
        table.fail("roles", "a node needs at least one role")
    if len(set(roles)) != len(roles):
        table.fail("roles", f"a role is listed twice in {roles}")
    if VOTER in roles and OBSERVER in roles:
        table.fail("roles", "a node is either a voter or an observer, not both")
    return frozenset(roles)


def _check_cluster(config: ClusterConfig) -> None:
    path = config.path
    _check_unique(path, "id", [(n.id, f"node {n.id}") for n in config.nodes])
    _check_unique(path, "data_dir", [(n.data_dir, f"node {n.id}") for n in config.nodes])
    _check_unique(path, BOOKIE_JOURNAL_DIR, [(n.bookie_journal_dir, f"node {n.id}") for n in config.nodes
                                             if n.bookie_journal_dir is not None])
    _check_unique(path, "address", [((n.host, port), f"node {n.id} {key}")
                                    for n in config.nodes for key, port in n.ports.items()])
    if config.client_protocol not in CLIENT_PROTOCOLS:
        retired = " (the kv demo protocol was retired)" if config.client_protocol == "kv" else ""
        raise ConfigError(f"{path}: [cluster]: key 'client_protocol': the client port speaks only \"zookeeper\", "
                          f"got {config.client_protocol!r}{retired}; remove the key")
    unknown_words = set(config.four_letter_word_set) - KNOWN_FOUR_LETTER_WORDS
    if unknown_words:
        raise ConfigError(f"{path}: [cluster]: key 'four_letter_words': unknown {sorted(unknown_words)} "
                          f"(known: {', '.join(sorted(KNOWN_FOUR_LETTER_WORDS))})")
    for key, ok, bounds in (("bookie_entry_log_bytes", config.bookie_entry_log_bytes >= 4096, "be at least 4096"),
                            ("bookie_disk_usage_percent", config.bookie_disk_usage_percent <= 100, "be from 1 to 100"),
                            ("bookie_max_index_bytes", config.bookie_max_index_bytes >= 4096, "be at least 4096"),
                            ("bookie_max_entry_bytes", config.bookie_max_entry_bytes <= BOOKIE_MAX_ENTRY_BYTES_LIMIT,
                             f"be at most {BOOKIE_MAX_ENTRY_BYTES_LIMIT} (64 MiB)")):
        if not ok:
            raise ConfigError(f"{path}: [cluster]: key {key!r}: must {bounds}, got {getattr(config, key)}")
    if config.super_digest:
        try:
            parse_super_digest(config.super_digest)
        except ValueError as e:
            raise ConfigError(f"{path}: [cluster]: key 'super_digest': {e}") from None
    _check_auth_settings(config)
    if config.session_secret in _KNOWN_SECRETS:
        raise ConfigError(f"{path}: [cluster]: key 'session_secret': {config.session_secret!r} was a shipped "
                          "default that anyone knows; remove the key (session passwords derive from a secret "
                          "the cluster draws itself) or set a private value")
    if config.min_session_timeout_ms > config.max_session_timeout_ms:
        raise ConfigError(f"{path}: [cluster]: min_session_timeout_ms exceeds max_session_timeout_ms")
    voters = sorted(config.voters)
    if not voters:
        raise ConfigError(f"{path}: no node has the role 'voter': a cluster needs 1, 3, 5 or 7 voters")
    if len(voters) % 2 == 0:
        raise ConfigError(
            f"{path}: {len(voters)} voters (nodes {voters}): use an odd number (1, 3, 5 or 7); "
            "an even count tolerates no more failures than the odd count below it")
    try:
        config._zab_config(voters[0])  # the Zab core's own checks, e.g. ping vs sync limit
    except ZabConfigError as e:
        raise ConfigError(f"{path}: [cluster]: {e}") from None


def _check_auth_settings(config: ClusterConfig) -> None:
    """The SASL users file parses and enforce_auth_schemes names schemes a client can prove."""
    where = f"{config.path}: [cluster]:"
    unknown = config.enforce_auth_scheme_set - ENFORCEABLE_SCHEMES
    if unknown:
        raise ConfigError(f"{where} key 'enforce_auth_schemes': unknown or unprovable {sorted(unknown)} "
                          f"(choose from {', '.join(sorted(ENFORCEABLE_SCHEMES))})")
    if "sasl" in config.enforce_auth_scheme_set and not config.sasl_users_file:
        raise ConfigError(f"{where} key 'enforce_auth_schemes' names sasl, but no sasl_users_file is set: "
                          "no client could authenticate")
    if config.sasl_users_file:
        try:
            read_users_file(Path(config.sasl_users_file))
        except SaslConfigError as e:
            raise ConfigError(f"{where} {e}") from None


def _check_unique(path: Path, what: str, items: list[tuple[Any, str]]) -> None:
    seen: dict[Any, str] = {}
    for value, owner in items:
        if value in seen:
            shown = f"{value[0]}:{value[1]}" if isinstance(value, tuple) else str(value)
            raise ConfigError(f"{path}: duplicate {what} {shown}: used by {seen[value]} and by {owner}")
        seen[value] = owner


def to_toml(config: ClusterConfig, folder: Path) -> str:
    """Render `config` as cluster.toml text for a file in `folder`.

    Data and journal dirs inside `folder` are written relative to it, so the file stays valid
    when the folder moves. `load` of the result gives back an equal config.
    """
    doc: dict[str, Any] = {"cluster": {key: getattr(config, key) for key in CLUSTER_DEFAULTS}, "node": []}
    for n in config.nodes:
        table: dict[str, Any] = {"id": n.id, "host": n.host}
        if n.bind_host != n.host:
            table[BIND_HOST] = n.bind_host
        table.update(n.ports)
        table.update(roles=sorted(n.roles), data_dir=_toml_dir(n.data_dir, folder))
        if n.bookie_journal_dir is not None:
            table[BOOKIE_JOURNAL_DIR] = _toml_dir(n.bookie_journal_dir, folder)
        doc["node"].append(table)
    if config.tls is not None:
        doc["tls"] = config.tls.to_table(folder)
    return tomli_w.dumps(doc)


def _toml_dir(directory: Path, folder: Path) -> str:
    """A directory as to_toml writes it: relative to `folder` when inside it."""
    return (directory.relative_to(folder) if directory.is_relative_to(folder) else directory).as_posix()
