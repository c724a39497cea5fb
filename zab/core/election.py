"""Fast leader election (ZooKeeper's FastLeaderElection), as a pure state machine.

Votes are ordered by (peer epoch, last logged zxid, server id): the voter with
the newest history wins, ties go to the higher id. Each LOOKING voter keeps a
logical clock (election epoch); a notification from a newer round resets the
received votes. Once a quorum of voters agrees with our proposal we wait
`election_finalize_ticks` for a better vote before deciding. Peers that are
already FOLLOWING or LEADING answer LOOKING peers with their vote, so a late
joiner (or an observer, whose vote never counts) learns the established leader
once a quorum reports the same leader and the leader itself says LEADING.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from zab.core import zxid as Z
from zab.core.config import ZabConfig
from zab.core.messages import Notification, ServerState


class Vote(NamedTuple):
    peer_epoch: int
    zxid: int
    leader: int


# An observer's vote, for nobody (ZooKeeper's observers send Long.MIN_VALUE): it never counts, and voters
# ignore it. Its zxid is 0, not -1: the peer codec carries a zxid unsigned (zab/wire/codec.py), and a
# vote it cannot encode ended every observer process at its first notification.
OBSERVER_VOTE = Vote(-1, 0, -1)


@dataclass(slots=True)
class _Seen:
    vote: Vote
    election_epoch: int
    state: ServerState


@dataclass(frozen=True, slots=True)
class Decided:
    vote: Vote
    election_epoch: int


class FastLeaderElection:
    """One LOOKING round after another; `decided` holds the outcome of the last one."""

    def __init__(self, config: ZabConfig) -> None:
        self.cfg = config
        self.logical_clock = 0
        self.looking = False
        self.proposal = Vote(0, 0, config.my_id)
        self._initial = self.proposal
        self._recv: dict[int, _Seen] = {}
        self._out_of_election: dict[int, _Seen] = {}
        self._finalize_at: int | None = None
        self._last_sent = 0
        self._resend_ticks = config.election_resend_ticks
        self.decided: Decided | None = None
        self.my_state = ServerState.LOOKING

    # -- notifications we send ----------------------------------------------
    def _notification(self) -> Notification:
        return Notification(self.proposal.leader, self.proposal.zxid, self.proposal.peer_epoch,
                            self.logical_clock, self.my_state)

    def _broadcast(self, now: int) -> list[tuple[int, Notification]]:
        self._last_sent = now
        n = self._notification()
        return [(p, n) for p in sorted(self.cfg.voting) if p != self.cfg.my_id]

    # -- rounds -------------------------------------------------------------
    def start(self, peer_epoch: int, last_zxid: int, now: int) -> list[tuple[int, Notification]]:
        """Begin a new round voting for ourselves (observers never propose themselves)."""
        self.looking = True
        self.my_state = ServerState.LOOKING
        self.logical_clock += 1
        self._initial = Vote(peer_epoch, last_zxid, self.cfg.my_id)
        self.proposal = self._initial if not self.cfg.is_observer else OBSERVER_VOTE
        self._recv.clear()
        self._out_of_election.clear()
        self._finalize_at = None
        self._resend_ticks = self.cfg.election_resend_ticks
        self.decided = None
        if not self.cfg.is_observer:
            self._recv[self.cfg.my_id] = _Seen(self.proposal, self.logical_clock, ServerState.LOOKING)
            if self._agreeing(self._recv, self.proposal):  # an ensemble of one
                self._finalize_at = now + self.cfg.election_finalize_ticks
        return self._broadcast(now)

    def settle(self, state: ServerState) -> None:
        """The peer left LOOKING for `state`; it now answers LOOKING peers with its vote."""
        self.looking = False
        self.my_state = state

    # -- receiving ----------------------------------------------------------
    def on_notification(self, frm: int, n: Notification, now: int) -> list[tuple[int, Notification]]:
        if frm == self.cfg.my_id or frm not in self.cfg.members:
            return []
        if not self.looking:
            # Tell a LOOKING peer whom we follow: late joiners learn the leader this way.
            return [(frm, self._notification())] if n.state == ServerState.LOOKING else []
        if frm not in self.cfg.voting:
            return []  # an observer's vote never counts; it learns from voters' replies
        if not self._valid(n):
            return []
        seen = _Seen(Vote(n.peer_epoch, n.zxid, n.leader), n.election_epoch, n.state)
        if n.state == ServerState.LOOKING:
            return self._on_looking(frm, seen, now)
        return self._on_established(frm, seen)

    def _valid(self, n: Notification) -> bool:
        """A vote a voter could have sent: for a voter, with an epoch, zxid and round that
        leave room to go on. Anything else (a bug, or a stranger before TLS) is ignored:
        a vote for a non-member would make every voter follow nobody."""
        return (n.leader in self.cfg.voting and Z.epoch_ok(n.peer_epoch) and Z.zxid_ok(n.zxid)
                and 0 <= n.election_epoch < Z.ELECTION_ROUND_LIMIT)

    def _on_looking(self, frm: int, seen: _Seen, now: int) -> list[tuple[int, Notification]]:
        out: list[tuple[int, Notification]] = []
        if seen.election_epoch > self.logical_clock:
            self.logical_clock = seen.election_epoch
            self._recv.clear()
            self._finalize_at = None
            # An observer backs the best vote it has seen (never itself): a voter of a reconfig it
            # has not seen yet counts it toward the new ensemble's quorum (zab/core/config.py).
            self.proposal = max(self._initial, seen.vote) if not self.cfg.is_observer else seen.vote
            if not self.cfg.is_observer:
                self._recv[self.cfg.my_id] = _Seen(self.proposal, self.logical_clock, ServerState.LOOKING)
            out = self._broadcast(now)
        elif seen.election_epoch < self.logical_clock:
            return [(frm, self._notification())]  # help the straggler catch up
        elif seen.vote > self.proposal:
            self.proposal = seen.vote
            if not self.cfg.is_observer:
                self._recv[self.cfg.my_id] = _Seen(self.proposal, self.logical_clock, ServerState.LOOKING)
            self._finalize_at = None
            out = self._broadcast(now)
        elif seen.vote != self.proposal:
            # The sender backs a worse vote in our round: it may have missed ours (it was
            # still following when we sent it). Answer now rather than at the next resend.
            out = [(frm, self._notification())]
        self._recv[frm] = seen
        if self._finalize_at is None and self._agreeing(self._recv, self.proposal):
            self._finalize_at = now + self.cfg.election_finalize_ticks
        return out

    def _on_established(self, frm: int, seen: _Seen) -> list[tuple[int, Notification]]:
        if seen.election_epoch == self.logical_clock:
            self._recv[frm] = seen
            if self._agreeing(self._recv, seen.vote) and self._leader_confirmed(self._recv, seen):
                self._decide(seen.vote, seen.election_epoch)
                return []
        self._out_of_election[frm] = seen
        if (self._agreeing(self._out_of_election, seen.vote)
                and self._leader_confirmed(self._out_of_election, seen)):
            self.logical_clock = seen.election_epoch
            self._decide(seen.vote, seen.election_epoch)
        return []

    def _agreeing(self, votes: dict[int, _Seen], vote: Vote) -> bool:
        return self.cfg.is_quorum({p for p, s in votes.items() if s.vote == vote})

    def _leader_confirmed(self, votes: dict[int, _Seen], n: _Seen) -> bool:
        """ZooKeeper's checkLeader: follow someone else only if it says it is LEADING;
        lead on others' word only if they voted in our current round."""
        leader = n.vote.leader
        if leader == self.cfg.my_id:
            return not self.cfg.is_observer and n.election_epoch == self.logical_clock
        seen = votes.get(leader)
        return seen is not None and seen.state == ServerState.LEADING

    def _decide(self, vote: Vote, election_epoch: int) -> None:
        self.proposal = vote
        self.decided = Decided(vote, election_epoch)
        self.looking = False

    # -- time ---------------------------------------------------------------
    def on_tick(self, now: int) -> list[tuple[int, Notification]]:
        if not self.looking:
            return []
        if self._finalize_at is not None and now >= self._finalize_at:
            self._finalize_at = None
            if self._agreeing(self._recv, self.proposal):
                self._decide(self.proposal, self.logical_clock)
                return []
        if now - self._last_sent >= self._resend_ticks:
            # Back off, as FastLeaderElection does, but never beyond a few seconds' worth.
            self._resend_ticks = min(self._resend_ticks * 2, self.cfg.election_resend_ticks * 8)
            return self._broadcast(now)
        return []
