"""Bookie registration in the metastore (trio edge, through metastore.client.MetaClient).

Layout, under /quire/bookies (docs/bookie_wire.md):

    available/<id>   ephemeral, JSON {"id", "host", "port", "read_only": false}: a writable bookie
    readonly/<id>    ephemeral, the same JSON with "read_only": true: its disk passed the threshold
    cookies/<id>     persistent: the instance id of the bookie's storage cookie, written on its first
                     start; later starts hand it to BookieStorage.open, so a wiped or swapped data
                     directory is refused instead of answering "nothing here" (FAULTS.md, limbo)

A bookie is in exactly one of available/ and readonly/ while its session lives;
it moves between them in one multi. Writers place ledgers on available bookies
only; readers may use both (list_bookies returns both, flagged).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import trio

from bookie.errors import CookieMismatch
from ledger.service_loop import ServiceLoop  # the loop every background service of a node runs under
from metastore.wire import jute_records as J
from metastore.client import MetaClient, State
from metastore.client.ops import ANYONE, Create, Delete, MultiFailed
from metastore.wire.jute_defs import Perms
from metastore.errors import BadVersion, NodeExists, NoNode

log = logging.getLogger("quire.bookie.registration")

ROOT = "/quire/bookies"
AVAILABLE = f"{ROOT}/available"
READONLY = f"{ROOT}/readonly"
COOKIES = f"{ROOT}/cookies"
# What the daemons create under /quire when their sessions authenticate (clusterd/daemon/identity.py):
# everything for the session's own ids ("auth"), reading for everyone. None: open (unauthenticated tests).
DAEMON_ACL = (J.ACL(int(Perms.ALL), J.Id("auth", "")), J.ACL(int(Perms.READ), ANYONE))
POLL_S = 1.0  # how often the registrar looks at the disk state and the session
RETRY_S = 1.0  # after a failed session


@dataclass(frozen=True, slots=True)
class BookieInfo:
    """A registered bookie: where its bookie port is and whether it takes adds."""

    id: int
    host: str
    port: int
    read_only: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> BookieInfo:
        """Parse a registration; ValueError if it is not one."""
        if data is None:
            raise ValueError("not a bookie registration: null data")
        try:
            raw = json.loads(data)
            info = cls(int(raw["id"]), str(raw["host"]), int(raw["port"]), bool(raw.get("read_only", False)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a bookie registration: {data[:200]!r} ({e})") from None
        return info

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


def registration_path(bookie_id: int, read_only: bool) -> str:
    return f"{READONLY if read_only else AVAILABLE}/{bookie_id}"


async def list_bookies(meta: MetaClient, *, include_read_only: bool = True) -> list[BookieInfo]:
    """Registered bookies, by id (available ones, and read-only ones unless told not to).
    Registrations that vanish while being read, or cannot be parsed, are left out."""
    found: dict[int, BookieInfo] = {}
    for folder in (AVAILABLE, READONLY) if include_read_only else (AVAILABLE,):
        try:
            names = await meta.children(folder)
        except NoNode:
            continue
        for name in names:
            try:
                data, _ = await meta.get(f"{folder}/{name}")
                info = BookieInfo.from_json(data)
            except NoNode:
                continue
            except ValueError as e:
                log.warning("event=bad_registration path=%s/%s error=%s", folder, name, e)
                continue
            found.setdefault(info.id, info)  # available wins during a move
    return [found[i] for i in sorted(found)]


async def read_cookie(meta: MetaClient, bookie_id: int) -> str | None:
    """The instance id recorded for this bookie, or None before its first start."""
    try:
        data, _ = await meta.get(f"{COOKIES}/{bookie_id}")
    except NoNode:
        return None
    return (data or b"").decode(errors="replace")  # null or garbage: a mismatch the bookie reports


async def record_cookie(meta: MetaClient, bookie_id: int, instance_id: str,
                        acl: Sequence[J.ACL] | None = None) -> None:
    """Record the storage's instance id on the bookie's first start (idempotent for the same id).
    CookieMismatch if another instance id is recorded already."""
    await meta.ensure_path(COOKIES)
    try:
        await meta.create(f"{COOKIES}/{bookie_id}", instance_id.encode(), acl=acl)
        return
    except NodeExists:
        pass
    recorded = await read_cookie(meta, bookie_id)
    if recorded != instance_id:
        raise CookieMismatch(
            f"bookie {bookie_id}: the metastore records instance {recorded!r} at {COOKIES}/{bookie_id}, but the "
            f"data directory is instance {instance_id!r}. If the old data is really gone for good, delete that "
            "znode after the ledgers it held were re-replicated; otherwise restore the data directory")


async def register(meta: MetaClient, info: BookieInfo, acl: Sequence[J.ACL] | None = None) -> None:
    """Create this bookie's ephemeral registration (in readonly/ if info.read_only), replacing one
    left by an earlier session of the same bookie and removing it from the other list."""
    await meta.ensure_path(AVAILABLE)
    await meta.ensure_path(READONLY)
    path, other = registration_path(info.id, info.read_only), registration_path(info.id, not info.read_only)
    for stale in (path, other):
        stat = await meta.exists(stale)
        if stat is None or (stale == path and stat.ephemeral_owner == meta.session_id):
            continue
        # Left by an earlier session of this bookie (a restart within its timeout), or in the
        # other list: it must not outlive this registration.
        try:
            await meta.delete(stale, version=stat.version)
        except (NoNode, BadVersion):
            pass
    try:
        await meta.create(path, info.to_json(), ephemeral=True, acl=acl)
    except NodeExists:
        await meta.set(path, info.to_json())  # ours already (a retried create that had landed)


async def move(meta: MetaClient, info: BookieInfo, read_only: bool,
               acl: Sequence[J.ACL] | None = None) -> BookieInfo:
    """Move our registration between available/ and readonly/ in one multi; returns the new info."""
    new = BookieInfo(info.id, info.host, info.port, read_only)
    try:
        await meta.multi([Delete(registration_path(info.id, info.read_only)),
                          Create(registration_path(info.id, read_only), new.to_json(), acl=acl, ephemeral=True)])
    except MultiFailed:
        await register(meta, new, acl)  # the old node was gone or the new one there: register afresh
    return new


class BookieRegistrar:
    """Keeps one bookie registered while it runs.

    `await nursery.start(registrar.run)` returns once the first registration is made.
    Each metastore session holds the ephemeral registration; when a session is lost
    (expired, e.g. after a long pause) a new one registers again. `read_only()` is
    polled: a change moves the registration between available/ and readonly/."""

    def __init__(self, hosts: Sequence[tuple[str, int]], info: BookieInfo, read_only: Callable[[], bool], *,
                 session_timeout_ms: int = 10_000, poll_s: float = POLL_S,
                 auth: Sequence[tuple[str, str]] = ()) -> None:
        self.hosts = list(hosts)
        self.info = info
        self._read_only = read_only
        self.session_timeout_ms = session_timeout_ms
        self.poll_s = poll_s
        self.auth = tuple(auth)  # the daemons' identity (register only with it: /quire/bookies is theirs)
        self.acl = DAEMON_ACL if auth else None
        self.loop = ServiceLoop("bookie_registrar", log, min_s=RETRY_S)
        self.registrations = 0  # registrations made (more than 1: re-registered after a loss)
        self.registered = False
        self.meta: MetaClient | None = None  # the current session's client
        self._task_status: trio.TaskStatus[None] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._task_status = task_status
        await self.loop.run(self._session)

    async def _session(self) -> None:
        """One session: register, then keep the registration until the session is lost or a
        metastore error ends the round (ServiceLoop registers again after a backoff)."""
        try:
            async with MetaClient(self.hosts, session_timeout_ms=self.session_timeout_ms, auth=self.auth) as meta:
                self.meta = meta
                await self._register(meta)
                if self._task_status is not None:
                    self._task_status.started()
                    self._task_status = None
                await self._watch(meta)
            log.warning("event=bookie_registration_lost bookie=%s action=reregister", self.info.id)
        finally:
            self.registered, self.meta = False, None

    async def _register(self, meta: MetaClient) -> None:
        self.info = BookieInfo(self.info.id, self.info.host, self.info.port, self._read_only())
        await register(meta, self.info, self.acl)
        self.registrations += 1
        self.registered = True
        log.warning("event=bookie_registered bookie=%s path=%s session=%#x", self.info.id,
                    registration_path(self.info.id, self.info.read_only), meta.session_id)

    async def _watch(self, meta: MetaClient) -> None:
        """Until the session is lost: follow the storage's read-only state, and put the
        registration back if something deleted it (an operator, a stale-node cleanup)."""
        while meta.state is not State.LOST:
            await trio.sleep(self.poll_s)
            if meta.state is not State.CONNECTED:
                continue  # SUSPENDED: the session may live on; LOST: the loop ends
            read_only = self._read_only()
            if read_only != self.info.read_only:
                self.info = await move(meta, self.info, read_only, self.acl)
                log.warning("event=bookie_%s bookie=%s", "read_only" if read_only else "writable", self.info.id)
            elif await meta.exists(registration_path(self.info.id, self.info.read_only)) is None:
                log.warning("event=bookie_registration_deleted bookie=%s action=reregister", self.info.id)
                await self._register(meta)
