"""Three real PeerDrivers in one process over loopback TCP, each with its data directory,
for the in-process Zab edge tests (zab/edge/transport.py, zab/edge/driver.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import trio

from clusterd.localcluster import free_ports
from metastore.core.state_machine import MetastoreStateMachine
from sim.cluster import create_request, error_of, set_data_request
from zab.core.config import ZabConfig
from zab.edge.driver import PeerDriver
from zab.errors import NoLeader, OutcomeUnknown

CLUSTER = "quire-test"
IDS = (1, 2, 3)
MAX_FRAME_BYTES = 1 << 20
ELECTION_TIMEOUT_S = 20
WRITE_TIMEOUT_S = 20
POLL_S = 0.01


class Ensemble:
    """Three drivers in one trio nursery; each runs in its own cancel scope so it can be stopped."""

    def __init__(self, nursery: trio.Nursery, base: Path) -> None:
        self.nursery = nursery
        self.base = base
        self.addresses = {i: ("127.0.0.1", p) for i, p in zip(IDS, free_ports(len(IDS)))}
        self.drivers: dict[int, PeerDriver] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.stopped: dict[int, trio.Event] = {}
        self._cxid = itertools.count(1)

    def config(self, i: int) -> ZabConfig:
        return ZabConfig(my_id=i, voters=frozenset(IDS), tick_ms=20, sync_limit_ticks=25, init_limit_ticks=150,
                         election_resend_ticks=5)

    async def start(self, i: int) -> PeerDriver:
        driver = PeerDriver(self.config(i), self.addresses, self.base / f"node{i}", MetastoreStateMachine(),
                            max_frame_bytes=MAX_FRAME_BYTES, send_queue_max=10_000, snapshots_retained=3,
                            cluster_name=CLUSTER)
        self.drivers[i] = driver
        self.stopped[i] = trio.Event()
        await self.nursery.start(self._run, i, driver)
        return driver

    async def _run(self, i: int, driver: PeerDriver, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.CancelScope() as scope:
                self.scopes[i] = scope
                await driver.run(task_status=task_status)
        finally:
            self.stopped[i].set()

    async def stop(self, i: int) -> None:
        self.scopes[i].cancel()
        with trio.fail_after(10):
            await self.stopped[i].wait()
        del self.drivers[i]

    # -- waiting --------------------------------------------------------------------
    async def wait_until(self, what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
        try:
            with trio.fail_after(timeout_s):
                while not predicate():
                    await trio.sleep(POLL_S)
        except trio.TooSlowError:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {self.statuses()}") from None

    def statuses(self) -> dict[int, dict]:
        return {i: {k: d.status().get(k) for k in ("role", "phase", "epoch", "leader", "last_zxid",
                                                    "last_committed_zxid")}
                for i, d in self.drivers.items()}

    def leader(self) -> int | None:
        s = self.statuses()
        leaders = [i for i, st in s.items() if st["role"] == "leader" and st["phase"] == "broadcast"]
        if len(leaders) != 1:
            return None
        settled = [i for i, st in s.items() if st["phase"] == "broadcast" and st["leader"] == leaders[0]]
        return leaders[0] if len(settled) * 2 > len(IDS) else None

    def all_in_broadcast(self) -> bool:
        s = self.statuses()
        return self.leader() is not None and all(st["phase"] == "broadcast" for st in s.values())

    async def wait_leader(self) -> int:
        await self.wait_until("an established leader followed by a quorum", lambda: self.leader() is not None,
                              ELECTION_TIMEOUT_S)
        leader = self.leader()
        assert leader is not None
        return leader

    # -- writing --------------------------------------------------------------------
    async def put(self, via: int, key: str, value: str) -> object:
        """Set the znode of `key` to `value` through node `via`, as a ZooKeeper client would:
        create it, or set its data if it exists; retried while there is no leader. Returns
        the metastore's result of the write that succeeded."""
        session = via << 48 | 1
        with trio.fail_after(WRITE_TIMEOUT_S):
            while True:
                try:
                    result = await self.drivers[via].submit(session, next(self._cxid),
                                                            create_request(key, value, origin=via))
                    if error_of(result) == "NodeExists":
                        result = await self.drivers[via].submit(session, next(self._cxid),
                                                                set_data_request(key, value, origin=via))
                except (NoLeader, OutcomeUnknown):
                    await trio.sleep(0.05)
                    continue
                assert error_of(result) is None, result
                return result

    def converged(self, ids) -> bool:
        s = [self.drivers[i].status() for i in ids]
        digests = {self.drivers[i].state_machine.digest() for i in ids}
        return (all(x["phase"] == "broadcast" for x in s) and len(digests) == 1
                and len({(x["last_zxid"], x["last_committed_zxid"]) for x in s}) == 1)


def run_ensemble(tmp_path: Path, story) -> None:
    async def main() -> None:
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                ens = Ensemble(nursery, tmp_path)
                for i in IDS:
                    await ens.start(i)
                await story(ens)
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # show the one failure, not trio's nursery wrapping
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


# -- (a) hostile connections ------------------------------------------------------------------
