"""The node's client port for the temporary key-value protocol (format in clusterd.kvwire).

Writes go through Zab (`driver.submit`); reads are answered from this node's
own state machine, so they are sequentially consistent, not linearizable, and
only while the node follows (or is) an established leader.
Requests on one connection are executed one at a time, in order: submitting
them concurrently could let the scheduler reorder two writes of one client,
and ZooKeeper promises FIFO client order. Clients may still pipeline; their
requests wait, framed, in the socket buffer and the decoder.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from clusterd import kvwire
from zab.errors import NoLeader, OutcomeUnknown
from zab.kv_state_machine import KVStateMachine, decode_result, encode_delete, encode_put

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 << 10
CONNECTION_BITS = 32
INCARNATION_BITS = 16
SERVING_ROLES = ("leader", "follower", "observer")


class Submitter(Protocol):
    """What the service needs from the Zab peer driver."""

    state_machine: KVStateMachine

    def status(self) -> dict[str, Any]: ...

    async def submit(self, session_id: int, cxid: int, request: bytes) -> bytes: ...


class KVService:
    """Serves the key-value protocol; one `handle_connection` task per client connection.

    Session ids are `node_id << 48 | incarnation << 32 | connection number`. The
    incarnation is random per process start: after a restart, a transaction that
    an earlier incarnation submitted may still be delivered, and it must not be
    mistaken for the answer to a new connection's request with the same cxid.
    """

    def __init__(self, node_id: int, driver: Submitter, *, incarnation: int,
                 max_frame_bytes: int = kvwire.MAX_FRAME_BYTES) -> None:
        assert 0 <= incarnation < 1 << INCARNATION_BITS
        self._session_base = (node_id << (INCARNATION_BITS + CONNECTION_BITS)) | (incarnation << CONNECTION_BITS)
        self._driver = driver
        self._max_frame_bytes = max_frame_bytes
        self._connections_total = 0
        self._connections_open = 0
        self._requests_total = 0
        self._protocol_errors_total = 0

    def statistics(self) -> dict[str, int]:
        return {"connections_open": self._connections_open, "connections_total": self._connections_total,
                "requests_total": self._requests_total, "protocol_errors_total": self._protocol_errors_total}

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one client until it closes, breaks the format, or the node stops."""
        self._connections_total += 1
        self._connections_open += 1
        session_id = self._session_base | (self._connections_total % (1 << CONNECTION_BITS))
        try:
            async with stream:
                await self._converse(stream, session_id)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("client connection lost", extra={"session": hex(session_id)})
        finally:
            self._connections_open -= 1

    async def _converse(self, stream: trio.abc.Stream, session_id: int) -> None:
        decoder = kvwire.FrameDecoder(self._max_frame_bytes)
        cxid = 0
        while True:
            try:
                request = await self._next_request(stream, decoder)
            except kvwire.WireError as e:
                self._protocol_errors_total += 1
                log.info("client broke the protocol", extra={"session": hex(session_id), "error": str(e)})
                await stream.send_all(kvwire.encode_frame(kvwire.error_response(kvwire.BAD_REQUEST, str(e))))
                return
            if request is None:
                return
            cxid += 1
            self._requests_total += 1
            response = await self._execute(request, session_id, cxid)
            await stream.send_all(kvwire.encode_frame(response))

    async def _next_request(self, stream: trio.abc.Stream, decoder: kvwire.FrameDecoder) -> kvwire.Request | None:
        """The next request, or None at a clean end of stream."""
        while (message := decoder.next_message()) is None:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                decoder.check_eof()
                return None
            decoder.feed(data)
        return kvwire.parse_request(message)

    async def _execute(self, request: kvwire.Request, session_id: int, cxid: int) -> dict[str, Any]:
        if isinstance(request, kvwire.Get):
            return self._get(request.key)
        if isinstance(request, kvwire.Put):
            data = encode_put(request.key, request.value, request.version)
        else:
            data = encode_delete(request.key, request.version)
        try:
            return decode_result(await self._driver.submit(session_id, cxid, data))
        except NoLeader as e:
            return kvwire.error_response(kvwire.NO_LEADER, str(e) or "no established leader; retry later")
        except OutcomeUnknown as e:
            return kvwire.error_response(
                kvwire.OUTCOME_UNKNOWN, str(e) or "leadership changed; the write may or may not have committed")

    def _get(self, key: str) -> dict[str, Any]:
        # Like a ZooKeeper server, serve reads only while in a quorum's broadcast
        # phase: a node looking for a leader may hold arbitrarily old state.
        if self._driver.status()["role"] not in SERVING_ROLES:
            return kvwire.error_response(kvwire.NO_LEADER, "this node is not following a leader; retry elsewhere")
        # `zxid` is the state the read saw: the last transaction this node applied.
        machine = self._driver.state_machine
        item, zxid = machine.get(key), machine.last_zxid
        if item is None:
            return kvwire.error_response(kvwire.NO_KEY, f"{key!r} does not exist", zxid=zxid)
        value, version = item
        return {"ok": True, "value": value, "version": version, "zxid": zxid}
