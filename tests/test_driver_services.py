"""The driver's services for the layer above (the metastore): sync, session touches,
and the ordered stream of deliveries and role changes. Real drivers on loopback."""

from __future__ import annotations

from pathlib import Path

import trio

from test_transport import Ensemble, run_ensemble
from zab.actions import Delivered, SessionsTouched
from zab.kv_state_machine import encode_put


def test_sync_touch_and_subscription(tmp_path: Path) -> None:
    async def story(ens: Ensemble) -> None:
        leader = await ens.wait_leader()
        await ens.wait_until("all in broadcast", ens.all_in_broadcast, 20)
        follower = min(i for i in ens.drivers if i != leader)
        stream = ens.drivers[leader].subscribe()
        await ens.drivers[leader].submit(9, 1, encode_put("k", "v"))
        seen = await stream.receive()
        while not isinstance(seen, Delivered):
            seen = await stream.receive()
        assert seen.txn.session_id == 9
        # sync on a follower: it has delivered at least that write when sync returns
        zxid = await ens.drivers[follower].sync(5, 1)
        assert zxid >= seen.txn.zxid
        assert ens.drivers[follower].state_machine.get("k") == ("v", 1)
        # a session active on the follower is reported to the leader with the next ping
        ens.drivers[follower].touch((4242,))
        with trio.fail_after(10):
            while True:
                event = await stream.receive()
                if isinstance(event, SessionsTouched) and 4242 in event.session_ids:
                    assert event.frm == follower
                    break

    run_ensemble(tmp_path, story)
