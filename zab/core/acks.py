"""What an ACK means, as a rule the core's actions may rely on (pure).

An ACK of zxid z from a follower says "I have logged every proposal up to z"
(Zab's FIFO links and in-order logging make it so), and the leader counts it
that way (zab/core/leader.py `_on_ack`). So when one fsync makes several proposals
durable at once (group commit), only the highest ACK per destination needs to
leave: the log writer (zab/edge/log_writer.py) and the simulator (sim/cluster.py)
both apply `coalesce_acks` to what one fsync releases, so the simulated
ensemble runs the rule the real one does.
"""

from __future__ import annotations

from zab.core.actions import Action, Send
from zab.core.messages import Ack


def coalesce_acks(actions: list[Action]) -> list[Action]:
    """Keep only the last ACK to each peer among actions released by one fsync.

    After one group commit the highest ACK per destination says what all the others
    do (see the module doc): one message instead of one per proposal. Everything
    else keeps its place and order.
    """
    last: dict[int, int] = {}
    for i, a in enumerate(actions):
        if isinstance(a, Send) and isinstance(a.msg, Ack):
            last[a.to] = i
    if len(last) == sum(1 for a in actions if isinstance(a, Send) and isinstance(a.msg, Ack)):
        return actions
    return [a for i, a in enumerate(actions)
            if not (isinstance(a, Send) and isinstance(a.msg, Ack)) or last[a.to] == i]
