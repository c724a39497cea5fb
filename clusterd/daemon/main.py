"""`clusterd --id N [--config cluster.toml]`: run one node of a Quire cluster.

One trio nursery holds the node's services: the Zab peer driver and the client
port (on voters and observers: the ZooKeeper client protocol), the bookie (on nodes
with the bookie role: clusterd/daemon/bookie_node.py) and the
admin HTTP port. A bookie-only node runs no Zab peer: its bookie reaches the
metastore through the ensemble's client ports. SIGTERM or SIGINT
cancels the nursery and the process exits 0. A node that refuses to start says why and what
to do in one line, on stderr and in its log, and exits with its refusal's status (EXIT_*
below; docs/operations.md, "Exit status"); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import stamina
import trio

from bookie.errors import JournalWriteFailed
from clusterd import localcluster
from clusterd.daemon import tls_node
from clusterd.daemon.admin import AdminServer
from clusterd.daemon.bookie_node import BookieNode, BookieStartupError, BookieStorageRefused
from clusterd.daemon.bookkeeper_api import bookkeeper_api
from clusterd.daemon.cluster_view import cluster_view
from clusterd.config import ClusterConfig, ConfigError, NodeConfig, load
from clusterd.tls_context import TlsSetupError
from edge.files import FILE_MODE
from edge.sockets import PortUnavailable, open_listeners
from edge import metrics
from metastore.edge.admin_commands import command_names, run_command
from metastore.edge.four_letter import client_port_status
from metastore.edge.edge_guard import ClientLimits
from metastore.edge.sasl_edge import SaslConfigError, SaslSettings, load_settings
from metastore.edge.service import MetastoreConfig, MetastoreService
from metastore.core.state_machine import MetastoreStateMachine
from zab.edge.driver import PeerDriver
from zab.core.ensemble import OBSERVER, PARTICIPANT, Ensemble, Server
from zab.storage.ensemble_file import EnsembleFileError
from zab.storage.storage_errors import (DiskWriteFailed, EpochFileError, LogCorruptError, MissingHistoryError,
                                         SnapshotCorruptError)

log = logging.getLogger("clusterd")

# Exit statuses, one per kind of refusal, so that a supervisor (systemd's RestartPreventExitStatus)
# can tell what needs an operator from what may clear by itself: docs/operations.md, "Exit status".
EXIT_STARTUP_FAILED = 1  # any other refusal; the message says why
EXIT_BAD_CONFIG = 2
EXIT_ZAB_STATE = 3  # txn log damaged before its end, history missing, epoch or ensemble file unreadable
EXIT_BOOKIE_STORAGE = 4  # the bookie's directory: cookie mismatch, storage that cannot be trusted
EXIT_PORT_UNAVAILABLE = 5  # a port in use, or an address that is not this machine's
EXIT_DATA_DIR_IN_USE = 6  # another live clusterd runs on this data directory
EXIT_TLS = 7  # the node's certificate, key or the cluster CA cannot be loaded
EXIT_DISK_FAILED = 8  # not at start: writing the Zab state or the bookie journal failed while running (fail-stop)
LOG_LEVELS = ("debug", "info", "warning", "error")


class StartupError(Exception):
    """The node cannot start; the message says why. Not a bug: the environment is at fault."""


class DataDirInUse(StartupError):
    """Another live clusterd holds this node's data directory (its pid file names it)."""


# Every refusal at start, the more specific before their bases. Anything else that ends the node
# is a bug and keeps its traceback.
_REFUSALS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (DataDirInUse, EXIT_DATA_DIR_IN_USE),
    (PortUnavailable, EXIT_PORT_UNAVAILABLE),
    ((LogCorruptError, SnapshotCorruptError, EpochFileError, MissingHistoryError, EnsembleFileError), EXIT_ZAB_STATE),
    ((DiskWriteFailed, JournalWriteFailed), EXIT_DISK_FAILED),
    (BookieStorageRefused, EXIT_BOOKIE_STORAGE),
    (TlsSetupError, EXIT_TLS),
    (ConfigError, EXIT_BAD_CONFIG),
    ((StartupError, BookieStartupError), EXIT_STARTUP_FAILED),
)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run node --id of --config until SIGTERM or SIGINT (exit 0), or refuse to start (refusal_of)."""
    # Our retry loops log each retry in our own key=value lines; stamina's default hooks would add a
    # WARNING of theirs and a counter in a registry nothing serves.
    stamina.instrumentation.set_on_retry_hooks([])
    args = _parse_args(argv)
    try:
        config = load(args.config)
        node = config.node(args.id)
    except ConfigError as e:
        _refuse(None, EXIT_BAD_CONFIG, str(e))
    _setup_logging(args.log_level, node.id)
    try:
        _claim_data_dir(node)
    except StartupError as e:
        _refuse(node, _status_of(e), str(e))
    try:
        trio.run(run_node, config, node)
    except BaseException as e:  # noqa: BLE001 (a refusal ends here; anything else is raised again)
        refusal = refusal_of(e)
        if refusal is None:
            raise
        _refuse(node, *refusal)
    finally:
        localcluster.remove_pid_file(node, os.getpid())
    sys.exit(0)


def refusal_of(error: BaseException) -> tuple[int, str] | None:
    """(exit status, message) when `error`, or every exception of its group (trio's nurseries group
    them), is a refusal at start; None when any of them is something else: a bug."""
    leaves = list(_leaves(error))
    statuses = [_status_of(leaf) for leaf in leaves]
    if any(status is None for status in statuses):
        return None
    return statuses[0], "; ".join(dict.fromkeys(str(leaf) for leaf in leaves))


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _status_of(error: BaseException) -> int | None:
    for types, status in _REFUSALS:
        if isinstance(error, types):
            return status
    return None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterd", description="Run one node of a Quire cluster.")
    parser.add_argument("--id", type=int, required=True, help="this node's id in the config")
    parser.add_argument("--config", default="cluster.toml", help="cluster config file (default: ./cluster.toml)")
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS, help="default: warning")
    from clusterd.version import package_version  # only the parser needs it
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    return parser.parse_args(argv)


def _claim_data_dir(node: NodeConfig) -> None:
    """Refuse to run twice on one data directory; then record our pid there."""
    other = localcluster.running_pid(node)
    if other is not None and other != os.getpid():
        raise DataDirInUse(f"node {node.id} is already running as pid {other} ({localcluster.pid_path(node)}): "
                           "stop it first (clusterctl down, or SIGTERM to that pid), or give this node another "
                           "data_dir in cluster.toml")
    try:
        localcluster.write_pid_file(node, os.getpid())
    except OSError as e:
        raise StartupError(f"cannot use data directory {node.data_dir}: {e}") from None


def _refuse(node: NodeConfig | None, status: int, message: str) -> NoReturn:
    """One line on stderr and in the node's log (None: the config named no node), then exit."""
    line = f"clusterd: {message} (exit {status})"
    print(line, file=sys.stderr, flush=True)
    if node is not None:
        _append_to_node_log(node, line)
    sys.exit(status)


def _append_to_node_log(node: NodeConfig, line: str) -> None:
    """Add `line` to <data_dir>/clusterd.log, where clusterctl and operators look for why a node is
    down, unless stderr is that file already (a node started by clusterctl up)."""
    path = localcluster.log_path(node)
    if not path.parent.is_dir():
        return  # nothing of this node on disk: no log to keep
    try:
        if path.exists() and os.path.samestat(os.fstat(2), os.stat(path)):
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        with os.fdopen(fd, "a") as log_file:
            log_file.write(line + "\n")
    except OSError:
        pass  # stderr has the line; a log we cannot write must not bury it under a traceback


async def run_node(config: ClusterConfig, node: NodeConfig) -> None:
    """Run every service of `node` until SIGTERM or SIGINT."""
    metrics.ENABLED = config.metrics
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
            tls_node.warn_if_plaintext(config, node)
            tls_node.use_node_certificate(config, node)  # the node's own clients (bookie, AutoRecovery)
            await _start_services(nursery, config, node)
            # Lifecycle events are warnings so that the quiet default still records them.
            log.warning("node started", extra={"pid": os.getpid(), "roles": ",".join(sorted(node.roles)),
                                               "client": f"{node.host}:{node.client_port}" if node.in_ensemble else "-",
                                               "admin": f"{node.host}:{node.admin_port}"})


async def _cancel_on_signal(signals: Any, scope: trio.CancelScope) -> None:
    async for signum in signals:
        log.warning("stopping", extra={"signal": signal.Signals(signum).name})
        scope.cancel()
        return


async def _start_services(nursery: trio.Nursery, config: ClusterConfig, node: NodeConfig) -> None:
    status: dict[str, Any] = {}
    if node.in_ensemble:
        status = await _start_ensemble_services(nursery, config, node)
    else:
        status = {"status": lambda: {"role": "bookie", "peers": []}}
    bookie = None
    if node.is_bookie:
        bookie = BookieNode(config, node)
        await nursery.start(bookie.run)

    def node_status() -> dict[str, Any]:
        out = {**status["status"](), "id": node.id, "pid": os.getpid(), "cluster": config.name,
               "roles": sorted(node.roles)}
        if "clients" in status:
            out["clients"] = status["clients"]()
        if bookie is not None:
            out["bookie"] = bookie.status()
        return out

    service = status.get("service")

    def command(name: str) -> dict | None:
        if not name:
            return {"commands": command_names(), "command": "", "error": None}
        return run_command(name, service)

    admin = AdminServer(node_status, tls=tls_node.admin_port_tls(config, node),
                        commands=command if service is not None else None,
                        cluster=cluster_view(config, node, node_status),
                        api=None if bookie is None else bookkeeper_api(
                            bookie, mutations=tls_node.admin_mutations_allowed(config, node)))
    await nursery.start(trio.serve_listeners, admin.handle_connection,
                        await open_listeners(node.admin_port, node.bind_host, "admin"))


async def _start_ensemble_services(nursery: trio.Nursery, config: ClusterConfig,
                                   node: NodeConfig) -> dict[str, Any]:
    """Start the Zab peer and the client port; returns the status functions of both."""
    sm = MetastoreStateMachine()
    # The transport listens on its own entry and dials the others: its own at bind_host.
    peers = {**config.peer_addresses(), node.id: (node.bind_host, node.peer_port)}
    driver = PeerDriver(config.zab_config(node.id), peers, node.data_dir, sm,
                        max_frame_bytes=config.max_frame_bytes, send_queue_max=config.send_queue_max,
                        send_queue_max_bytes=config.send_queue_max_bytes,
                        log_queue_max_bytes=config.log_queue_max_bytes,
                        snapshots_retained=config.snapshots_retained, cluster_name=config.name,
                        bootstrap=bootstrap_ensemble(config))
    driver.transport.tls = tls_node.peer_tls(config, node)  # None: plain TCP ([tls] peer)
    service = MetastoreService(driver, sm, MetastoreConfig(
        node.id, node.bind_host, node.client_port, config.min_session_timeout_ms, config.max_session_timeout_ms,
        config.session_secret.encode(), config.four_letter_word_set, tick_ms=config.tick_ms,
        tls=tls_node.client_port_tls(config, node), super_digest=config.super_digest or None,
        limits=client_limits(config), sasl=sasl_settings(config), read_only_mode=config.read_only_mode))
    await nursery.start(driver.run)
    await nursery.start(service.run)
    return {"status": driver.status, "clients": lambda: client_port_status(service), "service": service}


def sasl_settings(config: ClusterConfig) -> SaslSettings:
    """The client port's SASL users (read from sasl_users_file now) and enforced authentication."""
    try:
        return load_settings(config.sasl_users_file, config.enforce_auth_scheme_set)
    except SaslConfigError as e:
        raise StartupError(str(e)) from None


def client_limits(config: ClusterConfig) -> ClientLimits:
    """The client port's limits (metastore.edge.edge_guard) from cluster.toml."""
    return ClientLimits(
        jute_max_buffer_bytes=config.jute_max_buffer_bytes, outgoing_max_bytes=config.client_outgoing_max_bytes,
        reply_max_bytes=config.client_reply_max_bytes,
        max_client_connections=config.max_client_connections, max_connections=config.max_client_connections_total,
        handshake_timeout_ms=config.client_handshake_timeout_ms,
        global_outstanding_limit=config.global_outstanding_limit,
        global_outstanding_bytes=config.global_outstanding_bytes,
        max_watch_bytes_per_connection=config.max_watch_bytes_per_connection,
        max_watch_bytes=config.max_watch_bytes, max_sessions=config.max_sessions)


# -- logging: quiet, one key=value line per event, on stderr -------------------

_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """`ts=... level=... node=N logger=... msg="..." key=value ...`: grep- and parser-friendly."""

    def __init__(self, node_id: int) -> None:
        super().__init__()
        self._node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        fields = {"ts": ts, "level": record.levelname.lower(), "node": self._node_id,
                  "logger": record.name, "msg": record.getMessage()}
        fields.update((k, v) for k, v in vars(record).items() if k not in _STANDARD_ATTRS)
        line = " ".join(f"{key}={_quote(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def bootstrap_ensemble(config: ClusterConfig) -> Ensemble:
    """cluster.toml's voters and observers as an ensemble of version 0 (ZooKeeper's static
    config); a node that persisted a newer one (a reconfig) starts from that instead."""
    return Ensemble.of(0, {n.id: Server(n.host, n.peer_port, PARTICIPANT if n.is_voter else OBSERVER,
                                        n.host, n.client_port) for n in config.ensemble})


def _setup_logging(level: str, node_id: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(node_id))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


if __name__ == "__main__":
    main()

