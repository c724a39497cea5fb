"""BookKeeper's HTTP API (its `bookkeeper-http` module's paths) on a bookie node's admin port,
for the tools written against it.

    GET  /api/v1/bookie/list_bookies?type=rw|ro&print_hostnames=true
    GET  /api/v1/bookie/info                    free and total bytes of the bookie's disk
    GET  /api/v1/bookie/state                   running, read-only
    GET  /api/v1/bookie/gc                      whether a forced GC is pending
    PUT  /api/v1/bookie/gc                      run a GC round now
    GET  /api/v1/ledger/list/?print_metadata=true
    GET  /api/v1/ledger/metadata/?ledger_id=N   (master key and password digest left out)
    GET  /api/v1/autorecovery/list_under_replicated_ledger/
    GET  /api/v1/autorecovery/who_is_auditor
    PUT  /api/v1/autorecovery/trigger_audit     on the auditor's node: scan every ledger now
    PUT  /api/v1/autorecovery/decommission      body {"bookie_src": "host:port"}

Mutations (PUT) are served only where the admin port requires TLS client certificates or listens
on loopback; elsewhere they answer 403. The metastore reads go through the bookie's registrar
session (the daemons' identity); while it has none, 503.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

from bookie.registration import BookieInfo, list_bookies
from clusterd.daemon.admin_http import Answer, HttpError, Request
from ledger.autorecovery.decommission import decommission
from ledger.autorecovery.tasks import ELECTION, list_tasks
from ledger.errors import NoSuchLedger
from ledger.manager import LedgerManager
from ledger.metadata import LedgerMetadata, encode
from metastore.client.recipes import LeaderElection

PREFIX = "/api/v1/"
_SECRET_FIELDS = ("master_key", "password_digest")  # never over HTTP: they let anyone write or fence


def bookkeeper_api(bookie: Any, *, mutations: bool) -> Callable[[Request], Awaitable[Answer | None]]:
    """The /api/v1 handler of `bookie` (a clusterd BookieNode); `mutations`: PUTs are allowed."""
    gets = {"bookie/list_bookies": _list_bookies, "bookie/info": _info, "bookie/state": _state,
            "bookie/gc": _gc_state, "ledger/list": _ledger_list, "ledger/metadata": _ledger_metadata,
            "autorecovery/list_under_replicated_ledger": _under_replicated,
            "autorecovery/who_is_auditor": _who_is_auditor}
    puts = {"bookie/gc": _gc, "autorecovery/trigger_audit": _trigger_audit,
            "autorecovery/decommission": _decommission}

    async def handle(request: Request) -> Answer | None:
        name = request.path[len(PREFIX):].strip("/")
        table = {"GET": gets, "PUT": puts}.get(request.method)
        if name not in gets and name not in puts:
            return None
        if table is None or name not in table:
            raise HttpError(405, f"{request.method} {request.path} not allowed: "
                                 f"{'PUT' if name in puts else 'GET'} it")
        if request.method == "PUT" and not mutations:
            raise HttpError(403, "changes through the admin port need it to require TLS client certificates "
                                 "([tls] admin) or to listen on loopback")
        return _json(await table[name](bookie, request))

    return handle


def _json(value: Any) -> Answer:
    return Answer(200, "application/json", json.dumps(value, default=str).encode() + b"\n")


def _meta(bookie: Any) -> Any:
    meta = bookie.registrar.meta
    if meta is None:
        raise HttpError(503, "this bookie has no metastore session yet; retry shortly")
    return meta


def _address(info: BookieInfo) -> str:
    return f"{info.host}:{info.port}"


async def _list_bookies(bookie: Any, request: Request) -> dict:
    kind = request.query.get("type", "rw")
    if kind not in ("rw", "ro"):
        raise HttpError(400, "type is rw or ro")
    hostnames = request.query.get("print_hostnames", "false").lower() == "true"
    return {_address(b): (b.host if hostnames else None) for b in await list_bookies(_meta(bookie))
            if b.read_only == (kind == "ro")}


async def _info(bookie: Any, request: Request) -> dict:
    usage = shutil.disk_usage(bookie.node.data_dir)
    return {"freeSpace": usage.free, "totalSpace": usage.total}


async def _state(bookie: Any, request: Request) -> dict:
    storage = bookie.storage
    return {"running": bookie.service is not None, "readOnly": bool(storage is not None and storage.read_only),
            "shuttingDown": False, "availableForHighPriorityWrites": bookie.service is not None}


async def _gc_state(bookie: Any, request: Request) -> dict:
    return {"is_in_force_gc": bool(bookie.gc is not None and bookie.gc.forced)}


async def _gc(bookie: Any, request: Request) -> dict:
    if bookie.gc is None:
        raise HttpError(503, "this bookie's garbage collector has not started yet; retry shortly")
    bookie.gc.trigger()
    return {"message": f"Triggered GC on bookie {bookie.node.id}"}


def _public(metadata: LedgerMetadata) -> dict:
    doc = json.loads(encode(metadata))
    for key in _SECRET_FIELDS:
        doc.pop(key, None)
    return doc


async def _ledger_list(bookie: Any, request: Request) -> dict:
    manager = LedgerManager(_meta(bookie))
    with_metadata = request.query.get("print_metadata", "false").lower() == "true"
    out: dict[str, Any] = {}
    for ledger_id in await manager.list_ledgers():
        if not with_metadata:
            out[str(ledger_id)] = None
            continue
        try:
            out[str(ledger_id)] = _public((await manager.read(ledger_id))[0])
        except NoSuchLedger:
            continue  # deleted meanwhile
    return out


async def _ledger_metadata(bookie: Any, request: Request) -> dict:
    try:
        ledger_id = int(request.query["ledger_id"])
    except (KeyError, ValueError):
        raise HttpError(400, "give ledger_id=N") from None
    try:
        metadata, _ = await LedgerManager(_meta(bookie)).read(ledger_id)
    except NoSuchLedger:
        raise HttpError(404, f"no ledger {ledger_id}") from None
    return _public(metadata)


async def _under_replicated(bookie: Any, request: Request) -> list[int]:
    return await list_tasks(_meta(bookie))


async def _who_is_auditor(bookie: Any, request: Request) -> dict:
    meta = _meta(bookie)
    leader = await LeaderElection(meta, ELECTION).leader()
    if not leader or not leader.isdigit():
        raise HttpError(404, "no auditor elected")
    found = {b.id: b for b in await list_bookies(meta)}
    auditor = found.get(int(leader))
    return {"Auditor": _address(auditor) if auditor else f"bookie {int(leader)}"}


async def _trigger_audit(bookie: Any, request: Request) -> dict:
    if not bookie.autorecovery.auditor.trigger():
        raise HttpError(409, "this node is not the auditor: GET /api/v1/autorecovery/who_is_auditor and ask "
                             "its admin port")
    return {"message": "Triggered an audit of every ledger"}


async def _decommission(bookie: Any, request: Request) -> dict:
    try:
        source = json.loads(request.body or b"{}").get("bookie_src")
    except (ValueError, AttributeError):
        source = None
    if not isinstance(source, str):
        raise HttpError(400, 'give a JSON body {"bookie_src": "host:port"}')
    meta = _meta(bookie)
    match = [b for b in await list_bookies(meta) if _address(b) == source or str(b.id) == source]
    if not match:
        raise HttpError(404, f"no registered bookie {source!r}")
    count = await decommission(meta, match[0].id, bookie.registrar.acl)
    return {"message": f"bookie {match[0].id} ({source}) decommissioned; {count} ledger(s) reference it"}
