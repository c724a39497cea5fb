"""The bookie of a clusterd node (trio edge): storage, service, registration, wired together.

On a node with the bookie role (clusterd/daemon/main.py starts this on ensemble and
bookie-only nodes alike, when the cluster speaks the ZooKeeper protocol):

1. bind the bookie port at once, so a port in use fails the start (PortUnavailable, exit 5);
2. open a metastore session through the ensemble's client ports (waiting for
   a quorum as long as it takes: on an ensemble node that is this node's own
   peers coming up), read the bookie's cookie znode;
3. open the storage at `<data_dir>/bookie` with that instance id (a wiped or
   swapped directory is refused: BookieStorageRefused, exit 4), record the instance
   id on the first start;
4. serve the bookie port, run the storage's background duties, register in
   /quire/bookies (available/ or readonly/) and keep registered.
"""

from __future__ import annotations

import logging
from typing import Any

import stamina
import trio

from bookie.errors import CookieMismatch, StorageError
from bookie.registration import DAEMON_ACL, BookieInfo, BookieRegistrar, read_cookie, record_cookie
from bookie.service import BookieService, BookieServiceConfig
from bookie.storage import BookieStorage
from bookie.storage_recovery import precheck_cookie
from bookie.storage_config import BookieStorageConfig
from clusterd.daemon import tls_node
from clusterd.daemon import identity as daemon_identity
from ledger.autorecovery.tasks import DECOMMISSIONED, AutoRecoveryConfig
from clusterd.daemon.autorecovery_node import AutoRecovery
from clusterd.daemon.bookie_gc import BookieGarbageCollector
from clusterd.config import ClusterConfig, NodeConfig
from edge.sockets import open_listeners
from ledger.service_loop import ServiceLoop, retryable
from metastore.client import MetaClient

log = logging.getLogger("clusterd.bookie")

METASTORE_RETRY_S = 1.0  # the first backoff while the metastore cannot open the storage
METASTORE_RETRY_MAX_S = 5.0  # the longest: each try itself waits up to 10 s for a session


class BookieStartupError(Exception):
    """The bookie cannot start; the message says why (clusterd turns it into exit status 1)."""


class BookieStorageRefused(BookieStartupError):
    """The bookie's data directory is refused (its cookie does not match what the metastore records,
    or its storage cannot be trusted); the message says what to do. clusterd exits with status 4."""


def storage_config(config: ClusterConfig) -> BookieStorageConfig:
    return BookieStorageConfig(max_entry_bytes=config.bookie_max_entry_bytes,
                               entry_log_bytes=config.bookie_entry_log_bytes,
                               disk_usage_threshold=config.bookie_disk_usage_percent / 100,
                               max_index_bytes=config.bookie_max_index_bytes)


def autorecovery_config(config: ClusterConfig) -> AutoRecoveryConfig:
    return AutoRecoveryConfig(grace_ms=config.autorecovery_grace_ms,
                              open_ledger_grace_ms=config.autorecovery_open_ledger_grace_ms,
                              audit_interval_ms=config.audit_interval_ms,
                              check_reads_per_s=config.audit_check_reads_per_s,
                              session_timeout_ms=config.autorecovery_session_timeout_ms)


def service_config(config: ClusterConfig) -> BookieServiceConfig:
    return BookieServiceConfig(max_entry_bytes=config.bookie_max_entry_bytes,
                               max_in_flight=config.bookie_max_in_flight,
                               max_in_flight_bytes=config.bookie_max_in_flight_bytes,
                               max_outgoing_bytes=config.bookie_max_outgoing_bytes,
                               max_outgoing_bytes_total=config.bookie_max_outgoing_bytes_total,
                               max_in_flight_bytes_total=config.bookie_max_in_flight_bytes_total,
                               handshake_timeout_ms=config.bookie_handshake_timeout_ms,
                               read_timeout_ms=config.bookie_read_timeout_ms,
                               max_connections=config.bookie_max_connections,
                               max_connections_per_address=config.bookie_max_connections_per_address)


class BookieNode:
    """One node's bookie. `await nursery.start(bookie.run)` returns once the port is bound;
    the rest of the start (metastore, storage, registration) goes on in the background."""

    def __init__(self, config: ClusterConfig, node: NodeConfig) -> None:
        assert node.is_bookie and node.bookie_port is not None
        self.config = config
        self.node = node
        self.hosts = config.client_addresses()
        try:
            self.identity = daemon_identity.load_or_create(config.path)
        except (OSError, daemon_identity.DaemonSecretError) as e:
            raise BookieStartupError(f"bookie {node.id}: {e}") from None
        auth = self.identity.auth
        self.storage: BookieStorage | None = None
        self.service: BookieService | None = None
        self.registrar = BookieRegistrar(self.hosts, BookieInfo(node.id, node.host, node.bookie_port),
                                         self._read_only, auth=auth)
        self.gc: BookieGarbageCollector | None = None
        self.autorecovery = AutoRecovery(self.hosts, node.id, autorecovery_config(config), auth=auth)
        self.decommissioned = False  # an operator drains this bookie: it registers read-only
        self.phase = "starting"

    def _read_only(self) -> bool:
        return self.decommissioned or (self.storage is not None and self.storage.read_only)

    def status(self) -> dict[str, Any]:
        """For /status: where the bookie is in its start, its registration and its counters."""
        out: dict[str, Any] = {"port": self.node.bookie_port, "phase": self.phase,
                               "registered": self.registrar.registered,
                               "registrations": self.registrar.registrations}
        if self.storage is not None:
            out["instance_id"] = self.storage.instance_id
            out["read_only"] = self.storage.read_only
        if self.service is not None:
            out["service"] = self.service.statistics()
        if self.gc is not None:
            out["gc"] = self.gc.statistics()
        out["autorecovery"] = self.autorecovery.statistics()
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        node = self.node
        listeners = await open_listeners(node.bookie_port, node.bind_host, "bookie clients")
        task_status.started()
        self.phase = "waiting for the metastore"
        self.storage = await self._open_storage()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.storage.run)
                self.service = BookieService(self.storage, node.bind_host, node.bookie_port, service_config(self.config),
                                             tls=tls_node.bookie_port_tls(self.config, node))  # None: plain TCP
                await nursery.start(self.service.run, listeners)
                self.phase = "registering"
                await nursery.start(self.registrar.run)
                self.gc = BookieGarbageCollector(self.hosts, self.storage, self.config.bookie_gc_interval_ms,
                                                 auth=self.identity.auth)
                await nursery.start(self.gc.run)
                nursery.start_soon(self._follow_decommission)
                await nursery.start(self.autorecovery.run)
                self.phase = "serving"
                log.warning("bookie serving", extra={"bookie": f"{node.host}:{node.bookie_port}",
                                                     "instance": self.storage.instance_id})
        finally:
            with trio.CancelScope(shield=True):
                await self.storage.close(checkpoint=True)

    async def _follow_decommission(self) -> None:
        """Register read-only while /quire/autorecovery/decommissioned/<id> exists (polled with the
        registrar's period): writers then place nothing new here while its ledgers are drained."""
        await ServiceLoop("bookie_decommission", log, min_s=self.registrar.poll_s).run(self._poll_decommission)

    async def _poll_decommission(self) -> None:
        while True:
            meta = self.registrar.meta
            if meta is not None:
                self.decommissioned = await meta.exists(f"{DECOMMISSIONED}/{self.node.id}") is not None
            await trio.sleep(self.registrar.poll_s)

    async def _open_storage(self) -> BookieStorage:
        """Check the data directory against the cookie the metastore records, then open it; while
        the metastore fails (a metastore error, bare or grouped), try again with stamina's backoff.
        What the directory alone shows wrong is refused first: a cluster without a quorum must not
        keep a node waiting that can never serve."""
        directory = self.node.data_dir / "bookie"
        try:
            if directory.exists():
                precheck_cookie(directory, self.node.id, self.config.name)
        except StorageError as e:  # CookieMismatch is one
            raise BookieStorageRefused(f"bookie {self.node.id}: {e}") from None
        async for attempt in stamina.retry_context(on=_metastore_not_ready, attempts=None, timeout=None,
                                                  wait_initial=METASTORE_RETRY_S, wait_max=METASTORE_RETRY_MAX_S,
                                                  wait_jitter=METASTORE_RETRY_S):
            with attempt:
                return await self._try_open_storage()
        raise AssertionError("unreachable: the context has no attempt or time limit")

    async def _try_open_storage(self) -> BookieStorage:
        node, directory = self.node, self.node.data_dir / "bookie"
        storage: BookieStorage | None = None
        try:
            async with MetaClient(self.hosts, start_timeout_s=10.0, auth=self.identity.auth) as meta:
                try:
                    await daemon_identity.secure_layout(meta, self.identity)  # /quire is the daemons'
                except daemon_identity.DaemonSecretError as e:
                    raise BookieStartupError(f"bookie {node.id}: {e}") from None
                recorded = await read_cookie(meta, node.id)
                try:
                    storage = await BookieStorage.open(directory, node.id, storage_config(self.config),
                                                       instance_id=recorded, cluster=self.config.name,
                                                       journal_directory=node.bookie_journal_dir)
                except CookieMismatch as e:
                    raise BookieStorageRefused(f"bookie {node.id}: {e}") from None
                except StorageError as e:
                    raise BookieStorageRefused(f"bookie {node.id}: cannot open {directory}: {e}") from None
                if recorded is None:
                    await record_cookie(meta, node.id, storage.instance_id, DAEMON_ACL)
                return storage
        except BaseException as e:  # noqa: BLE001 (only a metastore error, bare or grouped, is waited out)
            if not (isinstance(e, CookieMismatch) or retryable(e)):
                raise
            if storage is not None:
                await storage.close(checkpoint=False)
            if isinstance(e, CookieMismatch):  # another instance recorded its cookie first
                raise BookieStorageRefused(f"bookie {node.id}: {e}") from None
            raise


def _metastore_not_ready(error: Exception) -> bool:
    """stamina's `on` for opening the storage: wait out (and log) what `retryable` calls a service error."""
    if not retryable(error):
        return False
    log.warning("event=bookie_waiting_for_metastore error=%r", error)
    return True
