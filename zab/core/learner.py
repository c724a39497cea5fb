"""The FOLLOWING and OBSERVING roles (ZooKeeper's Learner, Follower, Observer).

Discovery: FOLLOWERINFO (resent until the leader answers; the leader may still
be finishing its election), LEADERINFO -> persist acceptedEpoch -> ACKEPOCH.
Synchronization: apply DIFF / TRUNC / SNAP and the history that follows, then
on NEWLEADER persist everything received, then currentEpoch, then ACK
(ZOOKEEPER-4643's order; acking before the fsync is the bug of ZOOKEEPER-3911).
Proposals arriving after NEWLEADER are logged and acked as in broadcast;
commits arriving before UPTODATE are remembered and applied with it.
Broadcast: log and ACK each PROPOSAL (after fsync), deliver on COMMIT;
observers deliver INFORMs. Losing the leader, or anything the protocol does
not allow, sends the peer back to election.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from crc32c import crc32c

from zab.core import zxid as Z
from zab.core.actions import (Action, Answered, ClientRequest, ClientSync, Disconnect, InstallSnapshot, LogAppend, LogSync,
                         LogTruncate, Phase, RequestFailed, Role, RoleChanged, Send, SnapBegin, SnapDiscard, SnapWrite,
                         Synced)
from zab.core.messages import (Ack, EnsembleInfo, AckEpoch, AckNewLeader, Commit, FollowerInfo, Inform, LeaderInfo, Message, NewLeader,
                          Notification, Ping, Proposal, ReadIndexAck, ReadIndexProbe, Refused, Reject, Request,
                          ServerState, SnapAck, SnapChunk, SnapEnd, Sync, SyncMode, SyncReply, SyncRequest, SyncTxns,
                          UpToDate)
from zab.core.config import ZabConfig
from zab.core.ensemble import EnsembleError, parse_spec
from zab.core.snap_transfer import SnapReceiver
from zab.core.statemachine import MalformedState
from zab.core.txn import Txn

if TYPE_CHECKING:
    from zab.core.peer import Peer


class LearnerRole:
    def __init__(self, peer: "Peer", leader: int) -> None:
        self.peer = peer
        self.leader = leader
        self.observer = peer.cfg.is_observer
        self.role = Role.OBSERVING if self.observer else Role.FOLLOWING
        peer.join_attempts += 1
        self.attempt = peer.join_attempts
        self.started = peer.now
        self.last_heard = peer.now
        self.epoch: int | None = None
        self.sync_started = False
        self.snap: SnapReceiver | None = None  # a SNAP arriving in chunks (snap_transfer.py)
        self.newleader_seen = False
        self.pending_commit = 0
        self.touches: set[int] = set()

    @property
    def cfg(self) -> ZabConfig:
        return self.peer.cfg  # replaced when the ensemble changes

    def on_new_ensemble(self) -> list[Action]:
        """Follow on only if the new ensemble keeps us in our role and our leader a voter."""
        cfg = self.cfg
        if (cfg.role_of(self.peer.id) is None or (self.peer.id not in cfg.voting) != self.observer
                or self.leader not in cfg.voting):
            return self._look()
        return []

    def begin(self) -> list[Action]:
        self.peer.phase = Phase.DISCOVERY
        return [RoleChanged(self.role, self.leader, self.peer.current_epoch), self._follower_info()]

    def _follower_info(self) -> Send:
        p = self.peer
        return Send(self.leader, FollowerInfo(p.accepted_epoch, p.last_zxid, self.observer, self.attempt))

    def _fail(self, reason: str) -> list[Action]:
        return self._discard_snap() + [Disconnect(self.leader, reason)] + self.peer.look()

    def _look(self) -> list[Action]:
        return self._discard_snap() + self.peer.look()

    # -- time and links ----------------------------------------------------------
    def on_tick(self) -> list[Action]:
        now = self.peer.now
        limit = self.cfg.sync_limit_ticks if self.peer.phase is Phase.BROADCAST else self.cfg.init_limit_ticks
        if now - self.last_heard > limit:
            return self._look()
        if self.peer.phase is Phase.DISCOVERY and (now - self.started) % self.cfg.ping_interval_ticks == 0:
            return [self._follower_info()]
        return []

    def on_disconnected(self, peer_id: int) -> list[Action]:
        return self._look() if peer_id == self.leader else []

    def on_notification(self, frm: int, n: Notification) -> list[Action]:
        # Our leader is LOOKING again: it gave up leadership, so do we.
        return self._look() if frm == self.leader and n.state == ServerState.LOOKING else []

    def on_client_sync(self, ev: ClientSync) -> list[Action]:
        if self.peer.phase is not Phase.BROADCAST:
            return [RequestFailed(ev.session_id, ev.cxid, "NoLeader")]
        return [Send(self.leader, SyncRequest(ev.session_id, ev.cxid))]

    def on_touch(self, session_ids: tuple[int, ...]) -> list[Action]:
        self.touches.update(session_ids)
        return []

    def on_client_request(self, ev: ClientRequest) -> list[Action]:
        if self.peer.phase is not Phase.BROADCAST:
            return [RequestFailed(ev.session_id, ev.cxid, "NoLeader")]
        return [Send(self.leader, Request(ev.session_id, ev.cxid, ev.data))]

    # -- messages ------------------------------------------------------------------
    def on_message(self, frm: int, msg: Message) -> list[Action]:
        if frm != self.leader:
            return []
        self.last_heard = self.peer.now
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            return self._fail(f"a learner does not expect {type(msg).__name__}")
        return handler(self, msg)

    def _on_leader_info(self, m: LeaderInfo) -> list[Action]:
        p = self.peer
        if p.phase is not Phase.DISCOVERY:
            return []  # a duplicate answer to a resent FOLLOWERINFO
        if not Z.epoch_ok(m.new_epoch):
            return self._fail(f"leader epoch {m.new_epoch} is at or beyond the limit {Z.EPOCH_LIMIT}")
        if m.new_epoch < p.accepted_epoch:
            return self._fail(f"leader epoch {m.new_epoch} is below our accepted epoch {p.accepted_epoch}")
        out: list[Action] = []
        if m.new_epoch > p.accepted_epoch:
            out.append(p.set_accepted_epoch(m.new_epoch))
        if m.observer != self.observer:  # the leader knows a reconfig we have not seen yet
            self.observer = m.observer
            self.role = Role.OBSERVING if self.observer else Role.FOLLOWING
            p.role = self.role
            out.append(RoleChanged(self.role, self.leader, p.current_epoch))
        self.epoch = m.new_epoch
        p.phase = Phase.SYNCHRONIZATION
        out.append(Send(self.leader, AckEpoch(p.current_epoch, p.last_zxid)))
        return out

    def _on_sync(self, m: Sync) -> list[Action]:
        p = self.peer
        if p.phase is not Phase.SYNCHRONIZATION or self.sync_started:
            return self._fail("SYNC outside synchronization")
        self.sync_started = True
        if m.mode is SyncMode.DIFF:
            if m.zxid != p.last_zxid:
                return self._fail(f"DIFF from {Z.fmt(m.zxid)} but our last zxid is {Z.fmt(p.last_zxid)}")
            return []
        if m.mode is SyncMode.TRUNC:
            if m.zxid < p.last_committed or m.zxid < p.history.base_zxid:
                # Truncating delivered transactions would break Zab's guarantees: refuse.
                return self._fail(f"TRUNC to {Z.fmt(m.zxid)} below our committed {Z.fmt(p.last_committed)}")
            p.history.truncate_after(m.zxid)
            return [LogTruncate(m.zxid)]
        if m.snapshot is None:  # it follows in chunks
            return self._begin_snap(m.zxid)
        return self._take_inline_snap(m.zxid, m.snapshot)  # a leader of an older version sends it inline

    # -- SNAP (zab/core/snap_transfer.py) --------------------------------------------
    def _begin_snap(self, zxid: int) -> list[Action]:
        self.snap = SnapReceiver(zxid, self.cfg.snap_max_bytes, self.peer.sm.restorer(zxid))
        return [SnapBegin(zxid)]

    def _discard_snap(self) -> list[Action]:
        """A transfer cut short leaves no partial file (and its partial state goes with it)."""
        snap, self.snap = self.snap, None
        return [SnapDiscard(snap.zxid)] if snap is not None else []

    def _take_inline_snap(self, zxid: int, snapshot: bytes) -> list[Action]:
        out = self._begin_snap(zxid)
        assert self.snap is not None
        refused = (self.snap.on_chunk(SnapChunk(0, snapshot, crc32c(snapshot)))
                   or self.snap.on_end(SnapEnd(len(snapshot), hashlib.sha256(snapshot).digest())))
        if refused:
            return self._fail(refused)
        return out + [SnapWrite(snapshot)] + self._install()

    def _install(self) -> list[Action]:
        """The verified snapshot replaces our state, then our history (the edge its file, in order)."""
        p, snap = self.peer, self.snap
        assert snap is not None
        refused = snap.install()
        if refused:  # the state machine is as it was: nothing to undo
            return self._fail(refused)
        self.snap = None
        p.history.reset(snap.zxid)
        p.last_committed = snap.zxid
        return [InstallSnapshot(snap.zxid)]

    def _snapping(self) -> bool:
        return self.snap is not None

    def _on_snap_chunk(self, m: SnapChunk) -> list[Action]:
        if not self._snapping():
            return self._fail("SNAPCHUNK outside a snapshot transfer")
        assert self.snap is not None
        refused = self.snap.on_chunk(m)
        if refused:
            return self._fail(refused)
        # Acked once written: the learner's disk, not only its link, paces the leader's window.
        return [SnapWrite(m.data, then=(Send(self.leader, SnapAck(self.snap.received)),))]

    def _on_snap_end(self, m: SnapEnd) -> list[Action]:
        if not self._snapping():
            return self._fail("SNAPEND outside a snapshot transfer")
        assert self.snap is not None
        refused = self.snap.on_end(m)
        return self._fail(refused) if refused else self._install()

    def _append(self, txns: tuple[Txn, ...]) -> tuple[list[Txn], str | None]:
        """Add new transactions to the history; duplicates (already logged) are skipped.
        None of them if one does not decode: a leader's garbage is never logged or acked."""
        for t in txns:
            try:
                if t.zxid > self.peer.last_zxid:
                    self.peer.sm.check(t.data)
            except MalformedState as e:
                return [], f"transaction {Z.fmt(t.zxid)} does not decode: {e}"
        fresh: list[Txn] = []
        for t in txns:
            if t.zxid <= self.peer.last_zxid:
                continue
            if not Z.follows(self.peer.last_zxid, t.zxid):
                return fresh, f"gap: {Z.fmt(t.zxid)} after {Z.fmt(self.peer.last_zxid)}"
            self.peer.history.append(t)
            fresh.append(t)
        return fresh, None

    def _on_sync_txns(self, m: SyncTxns) -> list[Action]:
        if not self.sync_started or self.newleader_seen or self._snapping():
            return self._fail("history outside the synchronization window")
        fresh, err = self._append(m.txns)
        out: list[Action] = [LogAppend(tuple(fresh))] if fresh else []
        return out + self._fail(err) if err else out

    def _on_new_leader(self, m: NewLeader) -> list[Action]:
        p = self.peer
        if (not self.sync_started or self.newleader_seen or self._snapping() or m.epoch != self.epoch
                or m.zxid != p.last_zxid):
            return self._fail(f"unexpected NEWLEADER epoch={m.epoch} zxid={Z.fmt(m.zxid)}")
        self.newleader_seen = True
        # Synced transactions durable, then currentEpoch, then the ack (ZOOKEEPER-4643).
        return [LogSync(then=(p.set_current_epoch(m.epoch), Send(self.leader, AckNewLeader(m.epoch))))]

    def _on_proposal(self, m: Proposal) -> list[Action]:
        if not self.newleader_seen or self.observer:
            return self._fail("PROPOSAL before NEWLEADER")
        fresh, err = self._append((m.txn,))
        if err:
            return self._fail(err)
        if not fresh:
            return []  # already received inside the synchronization (FAULTS.md)
        return [LogAppend((m.txn,)), LogSync(then=(Send(self.leader, Ack(m.txn.zxid)),))]

    def _commit(self, zxid: int) -> list[Action]:
        if zxid > self.peer.last_zxid:
            return self._fail(f"COMMIT {Z.fmt(zxid)} beyond our last zxid {Z.fmt(self.peer.last_zxid)}")
        if self.peer.phase is not Phase.BROADCAST:
            self.pending_commit = max(self.pending_commit, zxid)
            return []
        return self._deliver(zxid)

    def _deliver(self, zxid: int) -> list[Action]:
        out: list[Action] = []
        try:
            self.peer.deliver_through(zxid, out)
        except MalformedState as e:
            # Committed, so it cannot be skipped (later transactions were prepared on top
            # of it) nor dropped from the log: deliver what came before, stop following
            # this leader and resync; the state machine did not change for it.
            return out + self._fail(f"committed transaction after {Z.fmt(self.peer.last_committed)} "
                                    f"does not decode: {e}")
        return out

    def _on_commit(self, m: Commit) -> list[Action]:
        if not self.newleader_seen:
            return self._fail("COMMIT before NEWLEADER")
        return self._commit(m.zxid)

    def _on_inform(self, m: Inform) -> list[Action]:
        if not self.observer or not self.newleader_seen:
            return self._fail("INFORM is for synchronized observers")
        fresh, err = self._append((m.txn,))
        if err:
            return self._fail(err)
        out: list[Action] = [LogAppend((m.txn,))] if fresh else []
        return out + self._commit(m.txn.zxid)

    def _on_up_to_date(self, m: UpToDate) -> list[Action]:
        p = self.peer
        if not self.newleader_seen or p.phase is Phase.BROADCAST:
            return self._fail("UPTODATE out of order")
        if m.committed_zxid > p.last_zxid:
            return self._fail(f"UPTODATE {Z.fmt(m.committed_zxid)} beyond our history")
        p.phase = Phase.BROADCAST
        return [RoleChanged(self.role, self.leader, p.current_epoch, broadcasting=True)] + self._deliver(
            max(m.committed_zxid, self.pending_commit))

    def _on_ping(self, m: Ping) -> list[Action]:
        touches, self.touches = tuple(sorted(self.touches)), set()
        return [Send(self.leader, Ping(touches))]

    def _on_read_index_probe(self, m: ReadIndexProbe) -> list[Action]:
        # on_message answered only our leader: an answer says we follow it still (read_index.py).
        return [] if self.observer else [Send(self.leader, ReadIndexAck(m.round))]

    def _on_sync_reply(self, m: SyncReply) -> list[Action]:
        # FIFO: every COMMIT up to m.zxid arrived before this reply and was delivered; a
        # leader's message that says otherwise is its bug, not ours: drop the link.
        if self.peer.phase is Phase.BROADCAST and self.peer.last_committed < m.zxid:
            return self._fail(f"SYNCREPLY at {m.zxid:#x} beyond our committed {Z.fmt(self.peer.last_committed)}")
        return [Synced(m.session_id, m.cxid, m.zxid)]

    def _on_refused(self, m: Refused) -> list[Action]:
        # FIFO, as for SYNC replies: the COMMIT of m.zxid came first and was delivered,
        # unless we are still synchronizing (then the request's outcome is not ours to give).
        if self.peer.last_committed < m.zxid:
            return [RequestFailed(m.session_id, m.cxid, "NoLeader")]
        try:
            answer = self.peer.sm.refused(m.zxid, m.data)
        except MalformedState as e:  # the client's request fails with the link (OutcomeUnknown)
            return self._fail(f"REFUSED for {m.session_id:#x}/{m.cxid} does not decode: {e}")
        return [Answered(m.session_id, m.cxid, answer)]

    def _on_ensemble_info(self, m: EnsembleInfo) -> list[Action]:
        # The leader's committed ensemble, sent just before SYNC: we may have missed its reconfig.
        if self.sync_started:
            return self._fail("ENSEMBLEINFO after SYNC")
        if not Z.zxid_ok(m.version) or (self.epoch is not None and Z.epoch_of(m.version) > self.epoch):
            return self._fail(f"ENSEMBLEINFO of version {m.version:#x}, beyond the leader's epoch")
        try:
            ensemble = parse_spec(m.spec, m.version)
        except EnsembleError as e:
            return self._fail(f"ENSEMBLEINFO does not parse: {e}")
        return self.peer.adopt_ensemble(ensemble)

    def _on_reject(self, m: Reject) -> list[Action]:
        return [RequestFailed(m.session_id, m.cxid, "NoLeader")]


_HANDLERS = {
    LeaderInfo: LearnerRole._on_leader_info,
    Sync: LearnerRole._on_sync,
    SyncTxns: LearnerRole._on_sync_txns,
    NewLeader: LearnerRole._on_new_leader,
    Proposal: LearnerRole._on_proposal,
    Commit: LearnerRole._on_commit,
    Inform: LearnerRole._on_inform,
    UpToDate: LearnerRole._on_up_to_date,
    Ping: LearnerRole._on_ping,
    Reject: LearnerRole._on_reject,
    SyncReply: LearnerRole._on_sync_reply,
    SnapChunk: LearnerRole._on_snap_chunk,
    SnapEnd: LearnerRole._on_snap_end,
    ReadIndexProbe: LearnerRole._on_read_index_probe,
    Refused: LearnerRole._on_refused,
    EnsembleInfo: LearnerRole._on_ensemble_info,
}
