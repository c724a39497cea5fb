"""An observer's election notifications go over the real peer codec. The simulator hands messages
over as objects, so the observer's vote for nobody, once Vote(-1, -1, -1), never met the codec,
whose zxid is unsigned: every observer process died at its first notification (struct.error)."""

from __future__ import annotations

from zab.core.config import ZabConfig
from zab.core.election import OBSERVER_VOTE, FastLeaderElection
from zab.core.messages import Notification, ServerState
from zab.wire.codec import decode_message, encode_message


def test_an_observers_notifications_encode_and_voters_ignore_its_vote():
    election = FastLeaderElection(ZabConfig(my_id=4, voters=frozenset({1, 2, 3}), observers=frozenset({4})))
    sent = election.start(peer_epoch=3, last_zxid=(3 << 32) + 7, now=0)
    assert sorted(to for to, _ in sent) == [1, 2, 3]
    for _, n in sent:
        assert (n.leader, n.zxid, n.peer_epoch) == (OBSERVER_VOTE.leader, OBSERVER_VOTE.zxid, OBSERVER_VOTE.peer_epoch)
        assert decode_message(encode_message(n)) == n
    voter = FastLeaderElection(ZabConfig(my_id=1, voters=frozenset({1, 2, 3}), observers=frozenset({4})))
    voter.start(peer_epoch=3, last_zxid=0, now=0)
    assert voter.on_notification(4, sent[0][1], now=1) == []  # a looking voter ignores an observer
    assert voter.on_notification(4, Notification(-1, 0, -1, 1, ServerState.OBSERVING), now=1) == []
