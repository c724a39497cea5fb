"""Linearizable `sync`: a leader answers one only after a quorum confirmed it still leads (Raft's ReadIndex).

Answering a sync from the leader's own committed zxid is not enough. A leader paused past its
replacement (a stop signal, a long collection, a swapped-out process) still believes it leads when
it resumes; until it notices, it would answer a sync with a zxid older than writes the new leader
already committed, and the read after that sync would return a value overwritten before the sync
began (seen with a pause nemesis; ZooKeeper behaves the same).

So a sync records the leader's committed zxid when it arrived (its read index) and waits for a
round: the leader sends READINDEXPROBE(round) to the voters it synchronizes and counts their
READINDEXACKs. A voter answers only the leader it follows, and a voter that acknowledged a newer
leader's NEWLEADER never follows an older one again; a quorum of answers to a round sent after the
sync arrived therefore proves that no other leader could have committed anything before the sync
began (quorum intersection), and everything this leader acknowledged is at or below the index.

One round is in flight at a time; syncs that arrive meanwhile wait for the next one, which starts
when the round in flight is confirmed: a burst of syncs costs two rounds, not one each. A round
that is not confirmed within `retry_ticks` (a learner's link broke, its answer went with it) is
replaced by a new one for every sync waiting; a leader that cannot reach a quorum at all steps
down within sync_limit_ticks and its syncs fail with the role change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from zab.core.actions import Action


@dataclass(slots=True)
class _Round:
    number: int
    started: int                                         # the leader's tick when it was sent
    answers: list[Action] = field(default_factory=list)  # what answers the syncs it releases
    acked: set[int] = field(default_factory=set)


class ReadIndex:
    """The rounds of one leadership. `sync(answer, now)` queues the actions that answer a sync
    (made from the read index when it arrived: Synced, or a SyncReply to the learner it came
    from); they are returned once a round sent after it is confirmed. Each call returns (the
    number of a round to send to the voters now, or None; the answers released). `is_quorum`
    decides over voter ids; the leader's own id is in every round."""

    def __init__(self, leader_id: int, is_quorum: Callable[[set[int]], bool], retry_ticks: int) -> None:
        self._leader = leader_id
        self._is_quorum = is_quorum
        self._retry_ticks = retry_ticks
        self._sent = 0                     # the highest round number sent
        self._in_flight: _Round | None = None
        self._next: list[Action] = []      # answers of syncs that arrived while a round was in flight

    @property
    def last_round(self) -> int:
        """The highest round sent: an acknowledgement of a higher one was never asked for."""
        return self._sent

    def sync(self, answer: list[Action], now: int) -> tuple[int | None, list[Action]]:
        if self._in_flight is not None:
            self._next += answer
            return None, []
        return self._start(answer, now)

    def acked(self, voter: int, number: int, now: int) -> tuple[int | None, list[Action]]:
        """A voter's READINDEXACK(number)."""
        r = self._in_flight
        if r is None or number != r.number:
            return None, []  # an answer to a round already confirmed or replaced
        r.acked.add(voter)
        return self._confirm(now) if self._is_quorum(r.acked) else (None, [])

    def tick(self, now: int) -> tuple[int | None, list[Action]]:
        """Replace a round that waited `retry_ticks` without a quorum: an answer was lost with its link."""
        r = self._in_flight
        if r is None or now - r.started < self._retry_ticks:
            return None, []
        self._in_flight = None
        waiting, self._next = r.answers + self._next, []
        return self._start(waiting, now)

    def _start(self, answers: list[Action], now: int) -> tuple[int | None, list[Action]]:
        self._sent += 1
        self._in_flight = _Round(self._sent, now, answers, {self._leader})
        if not self._is_quorum(self._in_flight.acked):
            return self._sent, []
        return self._confirm(now)  # the leader is the only voter

    def _confirm(self, now: int) -> tuple[int | None, list[Action]]:
        r = self._in_flight
        assert r is not None
        self._in_flight = None
        if not self._next:
            return None, r.answers
        waiting, self._next = self._next, []
        number, released = self._start(waiting, now)
        return number, r.answers + released
