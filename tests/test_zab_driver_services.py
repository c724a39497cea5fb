"""The driver's services for the layer above (the metastore): sync, session touches,
and the listener told of deliveries, touches and role changes inline. Real drivers on loopback."""

from __future__ import annotations

from pathlib import Path

import trio

from sim.cluster import create_request, read_key
from zab_fixtures import Ensemble, run_ensemble


class Listener:
    def __init__(self) -> None:
        self.delivered_txns: list = []
        self.touches: list = []
        self.roles: list = []
        self.ticks: list[int] = []

    def delivered(self, txn, result) -> None:
        self.delivered_txns.append(txn)

    def sessions_touched(self, frm, session_ids) -> None:
        self.touches.append((frm, session_ids))

    def role_changed(self, role, leader, epoch, broadcasting) -> None:
        self.roles.append(role)

    def leader_ticked(self, now_ms) -> None:
        self.ticks.append(now_ms)


def test_sync_touch_and_listener(tmp_path: Path) -> None:
    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.wait_until("all in broadcast", ens.all_in_broadcast, 20)
        follower = min(i for i in ens.drivers if i != leader)
        heard = Listener()
        ens.drivers[leader].listen(heard)
        await ens.drivers[leader].submit(9, 1, create_request("k", "v", origin=leader))
        [seen] = heard.delivered_txns  # told inline, before submit() returned
        assert seen.session_id == 9
        # sync on a follower: it has delivered at least that write when sync returns
        zxid = await ens.drivers[follower].sync(5, 1)
        assert zxid >= seen.zxid
        assert read_key(ens.drivers[follower].state_machine, "k") == ("v", 0)
        # a session active on the follower is reported to the leader with the next ping
        ens.drivers[follower].touch((4242,))
        with trio.fail_after(10):
            while (follower, (4242,)) not in heard.touches:
                await trio.sleep(0.01)
        # the leader's clock (session expiry's): one reading per tick, in tick_ms steps
        assert heard.ticks and all(b - a == ens.drivers[leader].cfg.tick_ms for a, b in zip(heard.ticks, heard.ticks[1:]))

    run_ensemble(tmp_path, story)
