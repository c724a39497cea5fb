"""The Zab peer: one node's protocol state, as a pure state machine.

`Peer.step(event) -> list[Action]` is the whole interface. The peer owns what
Zab needs of a node: the persisted epochs (acceptedEpoch, currentEpoch), the
in-memory history of logged transactions, the state machine it delivers to,
and its current role. Roles live in their own modules: election.py (LOOKING),
leader.py (LEADING), learner.py (FOLLOWING and OBSERVING). Phases follow the
paper: ELECTION, DISCOVERY, SYNCHRONIZATION, BROADCAST.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from zab.core import zxid as Z
from zab.core.actions import (Action, ClientRequest, ClientSync, Delivered, EnsembleChanged, Event, PeerDisconnected,
                              PersistEpoch, Phase, Received, RequestFailed, Role, RoleChanged, Send, TakeSnapshot, Tick,
                              TouchSessions)
from zab.core.config import ZabConfig
from zab.core.election import FastLeaderElection
from zab.core.ensemble import Ensemble, EnsembleError, bootstrap, parse_spec
from zab.core.history import History
from zab.core.leader import LeaderRole
from zab.core.learner import LearnerRole
from zab.core.messages import FollowerInfo, Message, Notification, ServerState
from zab.core.statemachine import StateMachine
from zab.core.txn import Txn


@dataclass(frozen=True, slots=True)
class DiskState:
    """What a node found on its disk at start (see zab/storage/recovery.py)."""
    accepted_epoch: int = 0
    current_epoch: int = 0
    snapshot_zxid: int = 0
    # The snapshot's bytes, whole or (from a file, zab/storage/snapshot.py) an iterable of pieces
    # read as the state machine's restore takes them.
    snapshot_state: bytes | Iterable[bytes] | None = None
    txns: tuple[Txn, ...] = ()


def snapshot_count(every: int, node_id: int, ordinal: int) -> int:
    """How many delivered transactions a node's snapshot number `ordinal` (since its start) comes
    after the previous one: more than half of `every` and at most `every`, varied per node and per
    snapshot as ZooKeeper's SyncRequestProcessor does (its randRoll), so that the members of an
    ensemble do not all snapshot at once, on the same cores and disks, with the same pause.
    Derived from the node id and the ordinal, not drawn: a simulated run replays exactly."""
    roll = int.from_bytes(hashlib.blake2b(b"%d:%d" % (node_id, ordinal), digest_size=8).digest(), "big")
    return every - roll % ((every + 1) // 2)


class Peer:
    """One Zab node. Feed it events; execute the actions it returns, in order."""

    def __init__(self, config: ZabConfig, state_machine: StateMachine, recovered: DiskState = DiskState(),
                 ensemble: Ensemble | None = None) -> None:
        """`ensemble`: the committed ensemble this node last persisted (else the bootstrap one,
        `config`'s voters and observers); it replaces `config`'s members."""
        self.ensemble = ensemble if ensemble is not None else bootstrap(config.voters, config.observers)
        self.cfg = replace(config, voters=self.ensemble.voters, observers=self.ensemble.observers)
        self.id = config.my_id
        self.sm = state_machine
        self.accepted_epoch = recovered.accepted_epoch
        self.current_epoch = recovered.current_epoch
        assert self.current_epoch <= self.accepted_epoch, "currentEpoch must never exceed acceptedEpoch"
        if recovered.snapshot_state is not None:
            state_machine.restore(recovered.snapshot_zxid, recovered.snapshot_state)
        self.history = History(recovered.snapshot_zxid, [t for t in recovered.txns if t.zxid > recovered.snapshot_zxid])
        # Delivered prefix. After a restart nothing past the snapshot counts as
        # committed until a leader says so (UPTODATE / COMMIT).
        self.last_committed = recovered.snapshot_zxid
        self.now = 0
        self.election = FastLeaderElection(self.cfg)
        # The ensemble a logged, uncommitted reconfig proposes (derived from the history), and
        # how far the history has been searched for one.
        self.pending: Ensemble | None = None
        self._scanned: tuple[int, int] = (-1, 0)  # (history.rewrites, zxid)
        self._ensemble_moved = False  # the committed ensemble changed during this step
        state_machine.show_ensemble(self.ensemble)
        self._track_pending()
        self._ensemble_moved = False
        self.role = Role.LOOKING
        self.phase = Phase.ELECTION
        self.leader_id: int | None = None
        self.role_state = None  # LeaderRole | LearnerRole while not LOOKING
        self._since_snapshot = 0
        self._snapshots = 0  # taken since the start: what varies the next one's count
        self._snapshot_due = snapshot_count(self.cfg.snapshot_every_txns, self.id, 0)
        self.join_attempts = 0
        self._stash: dict[int, Message] = {}  # FOLLOWERINFO that arrived while we were still LOOKING

    # -- the interface --------------------------------------------------------
    def start(self) -> list[Action]:
        return self.look()

    def step(self, event: Event) -> list[Action]:
        out = self._step(event)
        self._track_pending()
        if self._ensemble_moved:
            self._ensemble_moved = False
            out += self._recheck_role()
        return out

    def _step(self, event: Event) -> list[Action]:
        if isinstance(event, Tick):
            self.now += 1
            return self._on_tick()
        if isinstance(event, Received):
            return self._on_message(event.frm, event.msg)
        if isinstance(event, PeerDisconnected):
            return self.role_state.on_disconnected(event.peer) if self.role_state else []
        if isinstance(event, ClientRequest):
            if self.role_state is None:
                return [RequestFailed(event.session_id, event.cxid, "NoLeader")]
            return self.role_state.on_client_request(event)
        if isinstance(event, ClientSync):
            if self.role_state is None:
                return [RequestFailed(event.session_id, event.cxid, "NoLeader")]
            return self.role_state.on_client_sync(event)
        if isinstance(event, TouchSessions):
            return self.role_state.on_touch(event.session_ids) if self.role_state else []
        raise TypeError(f"not a Zab event: {event!r}")

    @property
    def last_zxid(self) -> int:
        return self.history.last_zxid

    def status(self) -> dict:
        return {"id": self.id, "role": self.role.value, "phase": self.phase.value,
                "epoch": self.current_epoch, "accepted_epoch": self.accepted_epoch,
                "last_zxid": self.last_zxid, "last_committed_zxid": self.last_committed,
                "leader": self.leader_id, "snapshot_in_txns": self._snapshot_due - self._since_snapshot,
                **(self.role_state.followers_status() if isinstance(self.role_state, LeaderRole) else {})}

    # -- dispatch -------------------------------------------------------------
    def _on_tick(self) -> list[Action]:
        if self.role_state is None:
            out = self._election_sends(self.election.on_tick(self.now))
            return out + self._maybe_decided()
        return self.role_state.on_tick()

    def _on_message(self, frm: int, msg: Message) -> list[Action]:
        if frm not in self.cfg.members:
            return []
        if isinstance(msg, Notification):
            out = self._election_sends(self.election.on_notification(frm, msg, self.now))
            if self.role_state is not None:
                return out + self.role_state.on_notification(frm, msg)
            return out + self._maybe_decided()
        if self.role_state is None:
            if isinstance(msg, FollowerInfo):
                self._stash[frm] = msg  # the learner decided before we did
            return []
        return self.role_state.on_message(frm, msg)

    def _election_sends(self, sends: list[tuple[int, Notification]]) -> list[Action]:
        return [Send(to, n) for to, n in sends]

    # -- role changes ---------------------------------------------------------
    def look(self) -> list[Action]:
        """Return to ELECTION (leader lost, quorum lost, protocol error, a new ensemble, or start).
        A node outside the ensemble (joining, or removed) looks too, without a vote of its own:
        it learns who leads once it is a member, and a removed node so stops serving."""
        self.role, self.phase, self.leader_id, self.role_state = Role.LOOKING, Phase.ELECTION, None, None
        self.sm.forget_prepared()
        self._stash.clear()
        out: list[Action] = [RoleChanged(Role.LOOKING, None, self.current_epoch)]
        out += self._election_sends(self.election.start(self.current_epoch, self.last_zxid, self.now))
        return out + self._maybe_decided()

    def _maybe_decided(self) -> list[Action]:
        decided = self.election.decided
        if decided is None or self.role_state is not None:
            return []
        leader = decided.vote.leader
        stash, self._stash = self._stash, {}
        if leader == self.id:
            self.election.settle(ServerState.LEADING)
            self.role, self.leader_id = Role.LEADING, self.id
            self.role_state = LeaderRole(self)
            out = self.role_state.begin()
            for frm, msg in stash.items():
                out += self.role_state.on_message(frm, msg)
            return out
        observing = self.cfg.is_observer
        self.election.settle(ServerState.OBSERVING if observing else ServerState.FOLLOWING)
        self.role, self.leader_id = (Role.OBSERVING if observing else Role.FOLLOWING), leader
        self.role_state = LearnerRole(self, leader)
        return self.role_state.begin()

    # -- shared steps used by the roles ----------------------------------------
    def set_accepted_epoch(self, epoch: int) -> PersistEpoch:
        assert Z.epoch_ok(epoch), f"epoch {epoch} is at or beyond the limit {Z.EPOCH_LIMIT}"
        self.accepted_epoch = epoch
        return PersistEpoch(accepted=epoch)

    def set_current_epoch(self, epoch: int) -> PersistEpoch:
        assert epoch <= self.accepted_epoch
        self.current_epoch = epoch
        return PersistEpoch(current=epoch)

    def deliver_through(self, zxid: int, out: list[Action] | None = None) -> list[Action]:
        """Apply every logged transaction up to `zxid` that is not yet delivered, in order,
        adding a Delivered action to `out` for each as it goes.

        A transaction the state machine cannot decode raises its MalformedState, itself
        undelivered and the state machine untouched by it (`apply` decodes first), with
        `out` holding what was delivered before it: a learner blames its leader and
        resyncs (LearnerRole._deliver); on a leader it is our own bug and ends the node."""
        out = [] if out is None else out
        if zxid <= self.last_committed:
            return out
        for txn in self.history.between(self.last_committed, zxid):
            result = self.sm.apply(txn.zxid, txn.data)
            self.last_committed = txn.zxid
            out.append(Delivered(txn, result))
            spec = self.sm.ensemble_of(txn.data) if txn.zxid > self.ensemble.version else None
            if spec is not None:
                out += self.adopt_ensemble(_parsed(spec, txn.zxid))
            self._since_snapshot += 1
        if self._since_snapshot >= self._snapshot_due:
            self._since_snapshot = 0
            self._snapshots += 1
            self._snapshot_due = snapshot_count(self.cfg.snapshot_every_txns, self.id, self._snapshots)
            out.append(TakeSnapshot(self.sm.freeze()))
        self.history.trim(self.last_committed, self.cfg.sync_window_txns, self.cfg.sync_window_bytes)
        return out

    # -- the ensemble: reconfiguration -------------------------------------------------
    def _track_pending(self) -> None:
        """Find the newest reconfig logged above the committed ensemble (`pending`): every
        quorum must include a majority of its voters too until it commits."""
        h = self.history
        rewrites, scanned = self._scanned
        if rewrites == h.rewrites and h.last_zxid == scanned:
            return  # every step passes here: nothing new was logged
        pending = self.pending
        if rewrites != h.rewrites:  # truncated or replaced: what we found may be gone
            pending, scanned = None, self.ensemble.version
        if h.last_zxid > scanned:
            for txn in h.after(max(scanned, h.base_zxid)):
                spec = self.sm.ensemble_of(txn.data) if txn.zxid > self.ensemble.version else None
                if spec is not None:
                    pending = _parsed(spec, txn.zxid)
        self._scanned = (h.rewrites, h.last_zxid)
        if pending != self.pending:
            self.pending = pending
            if self._use_members():
                self._ensemble_moved = True  # who votes changed: the role checks its learners or its leader

    def _use_members(self) -> bool:
        pending = self.pending
        cfg = replace(self.cfg, voters=self.ensemble.voters, observers=self.ensemble.observers,
                      pending_voters=pending.voters if pending else None,
                      pending_observers=pending.observers if pending else frozenset())
        if cfg == self.cfg:
            return False
        self.cfg = cfg
        self.election.cfg = cfg
        return True

    def adopt_ensemble(self, ensemble: Ensemble) -> list[Action]:
        """Make `ensemble` the committed one if it is newer (a reconfig committed, or a leader
        told a learner that missed it); the caller's step then checks our role against it."""
        if ensemble.version <= self.ensemble.version:
            return []
        self.ensemble = ensemble
        self._scanned = (-1, ensemble.version)  # search again above it
        self._ensemble_moved = True
        self.sm.show_ensemble(ensemble)
        self._track_pending()
        self._use_members()
        return [EnsembleChanged(ensemble)]

    def _recheck_role(self) -> list[Action]:
        """A new committed ensemble: keep our role only if it still holds (ZooKeeper: a removed
        leader steps down, and the rest elect among the new voters at once)."""
        return self.role_state.on_new_ensemble() if self.role_state is not None else []

    def describe(self) -> str:
        return f"peer {self.id} {self.role.value}/{self.phase.value} e={self.current_epoch} last={Z.fmt(self.last_zxid)}"


def _parsed(spec: bytes, zxid: int) -> Ensemble:
    try:
        return parse_spec(spec, zxid)
    except EnsembleError as e:  # the state machine accepted it: its checks and ours differ (a bug)
        raise AssertionError(f"the reconfig at {Z.fmt(zxid)} does not parse: {e}") from e
