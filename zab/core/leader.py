"""The LEADING role: discovery, per-learner synchronization, and broadcast.

Discovery: the prospective leader collects FOLLOWERINFO from a quorum and picks
an epoch above every acceptedEpoch it saw (LEADERINFO); it leads only once a
quorum answered ACKEPOCH, and abdicates if a learner's history is ahead of its
own. Synchronization (per learner, ZooKeeper's LearnerHandler): DIFF, TRUNC or
SNAP, the history after the sync point, then NEWLEADER; the learner joins the
forwarding set at that moment, so it receives every later PROPOSAL and COMMIT
(FAULTS.md, paper-level findings). On a quorum of NEWLEADER acks the leader is
established: it commits its initial history and sends UPTODATE carrying its
latest committed zxid. Broadcast: PROPOSAL to followers, COMMIT in zxid order
on a quorum of ACKs (the leader's own counted after its fsync), INFORM to
observers. A leader that stops hearing a quorum within sync_limit_ticks steps down.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zab.core import zxid as Z
from zab.core.config import VOTER, ZabConfig
from zab.core.lag import ProposedBytes
from zab.core.actions import (Action, Answered, ClientRequest, ClientSync, Disconnect, LogAppend, LogSync, Phase,
                         LeaderTicked, RequestFailed, Role, RoleChanged, Send, SessionsTouched, Synced)
from zab.core.messages import (Ack, EnsembleInfo, AckEpoch, AckNewLeader, Commit, FollowerInfo, Inform, LeaderInfo, Message, NewLeader,
                          Notification, Ping, Proposal, ReadIndexAck, ReadIndexProbe, Refused, Reject, Request,
                          SnapAck, SnapEnd, Sync, SyncMode, SyncReply, SyncRequest, SyncTxns, UpToDate)
from zab.core.statemachine import Refusal
from zab.core.read_index import ReadIndex
from zab.core.snap_transfer import SnapSender
from zab.core.sync_plan import plan_sync
from zab.core.txn import Txn

if TYPE_CHECKING:
    from zab.core.peer import Peer

SYNC_CHUNK_TXNS = 1000
SYNC_CHUNK_BYTES = 1 << 20


class LearnerState(enum.Enum):
    INFO = "followerinfo received"
    EPOCH_ACKED = "ackepoch received"
    SNAPPING = "snapshot being sent"
    SYNCING = "newleader sent"
    ACKED = "newleader acked"
    UPTODATE = "uptodate sent"


@dataclass(slots=True)
class LearnerHandle:
    observer: bool
    attempt: int
    state: LearnerState
    last_heard: int
    last_zxid: int = 0
    sync_zxid: int = 0  # the last zxid of the history we sent it (NEWLEADER's zxid)
    snap: SnapSender | None = None  # the SNAP in transfer, until the learner has all of it
    snap_zxid: int = 0  # the zxid of that snapshot


class LeaderRole:
    def __init__(self, peer: "Peer") -> None:
        self.peer = peer
        self.id = peer.id
        self.started = peer.now
        self.prior = (peer.current_epoch, peer.last_zxid)  # compared with ACKEPOCHs
        self.epoch: int | None = None
        self.established = False
        self.learners: dict[int, LearnerHandle] = {}
        self.connecting: dict[int, int] = {self.id: peer.accepted_epoch}
        self.epoch_acked: set[int] = set()
        self.epoch_quorum = False
        self.newleader_acked: set[int] = set()
        self.forwarding: set[int] = set()
        # Per voter, the highest zxid it has durably logged in our history (an ACK of z
        # covers everything before z: learners log in order). Like Raft's matchIndex.
        self.acked_through: dict[int, int] = {}
        # Record bytes proposed since our initial history, for followers' lag in bytes (lag.py).
        self.proposed_bytes = ProposedBytes(peer.last_zxid)
        self.counter = 0
        # Refused requests waiting for the commit of the last transaction prepared before
        # them: (that zxid, origin node, answer), in the order they were refused.
        self.refusals: deque[tuple[int, int, Refused]] = deque()
        # Syncs wait for a quorum to confirm this leadership after they arrived (read_index.py).
        self.read_index = ReadIndex(self.id, lambda ids: peer.cfg.is_quorum(ids),
                                    retry_ticks=self.cfg.ping_interval_ticks * 2)

    @property
    def cfg(self) -> ZabConfig:
        return self.peer.cfg  # replaced when the ensemble changes

    # -- discovery ------------------------------------------------------------
    def begin(self) -> list[Action]:
        self.peer.phase = Phase.DISCOVERY
        # Our own log becomes the initial history: make all of it durable first.
        return [RoleChanged(Role.LEADING, self.id, self.peer.current_epoch), LogSync()] + self._maybe_choose_epoch()

    def _maybe_choose_epoch(self) -> list[Action]:
        if self.epoch is not None or not self.cfg.is_quorum(set(self.connecting)):
            return []
        epoch = max(self.connecting.values()) + 1
        if not Z.epoch_ok(epoch):
            # Only our own acceptedEpoch can be this high (learners' are refused below the
            # limit): the epoch space is spent; lead nobody, and init_limit_ticks ends the attempt.
            return []
        self.epoch = epoch
        out: list[Action] = [self.peer.set_accepted_epoch(self.epoch)]
        out += [Send(f, LeaderInfo(self.epoch, h.observer)) for f, h in self.learners.items()]
        self.epoch_acked.add(self.id)
        return out + self._maybe_epoch_quorum()

    def _on_follower_info(self, frm: int, fi: FollowerInfo) -> list[Action]:
        if not Z.epoch_ok(fi.accepted_epoch + 1) or not Z.zxid_ok(fi.last_zxid):
            # Never persisted, never a reason to abdicate: a new epoch above it would not fit.
            return self._refuse(frm, f"FOLLOWERINFO epoch {fi.accepted_epoch} or zxid {fi.last_zxid:#x} out of range")
        h = self.learners.get(frm)
        if h is not None and h.attempt == fi.attempt:  # a resend crossing our answer
            if self.epoch is not None and h.state is LearnerState.INFO:
                return [Send(frm, LeaderInfo(self.epoch, h.observer))]
            return []
        self._drop(frm)
        if self.cfg.role_of(frm) is None:
            return [Disconnect(frm, "FOLLOWERINFO from a node outside the ensemble")]
        # We decide how it learns (LEADERINFO says): it may have missed the reconfig that changed it.
        observer = frm not in self.cfg.voting
        self.learners[frm] = LearnerHandle(observer, fi.attempt, LearnerState.INFO, self.peer.now)
        if self.epoch is None:
            self.connecting[frm] = fi.accepted_epoch
            return self._maybe_choose_epoch()
        if fi.accepted_epoch > self.epoch:
            # It accepted a newer epoch from a leader that never got established; it can
            # never follow us, so let a new election pick an epoch above its.
            return self.peer.look()
        return [Send(frm, LeaderInfo(self.epoch, observer))]

    def _on_ack_epoch(self, frm: int, ae: AckEpoch) -> list[Action]:
        h = self.learners.get(frm)
        if h is None or h.state is not LearnerState.INFO or self.epoch is None:
            return []
        # A learner has accepted our epoch, so neither its currentEpoch nor its history can be newer.
        if not (0 <= ae.current_epoch <= self.epoch and Z.zxid_ok(ae.last_zxid)
                and Z.epoch_of(ae.last_zxid) <= self.epoch):
            return self._refuse(frm, f"ACKEPOCH epoch {ae.current_epoch} or zxid {ae.last_zxid:#x} out of range")
        if not self.epoch_quorum and (ae.current_epoch, ae.last_zxid) > self.prior:
            return self.peer.look()  # the learner's history is newer than ours: we must not lead
        h.state, h.last_zxid = LearnerState.EPOCH_ACKED, ae.last_zxid
        if not h.observer:
            self.epoch_acked.add(frm)
        if self.epoch_quorum:
            return self._sync(frm)
        return self._maybe_epoch_quorum()

    def _maybe_epoch_quorum(self) -> list[Action]:
        if self.epoch_quorum or not self.cfg.is_quorum(self.epoch_acked):
            return []
        self.epoch_quorum = True
        self.peer.phase = Phase.SYNCHRONIZATION
        assert self.epoch is not None
        out: list[Action] = [LogSync(then=(self.peer.set_current_epoch(self.epoch),
                                           Send(self.id, AckNewLeader(self.epoch))))]
        for f, h in self.learners.items():
            if h.state is LearnerState.EPOCH_ACKED:
                out += self._sync(f)
        return out

    # -- synchronization --------------------------------------------------------
    def _sync(self, f: int) -> list[Action]:
        peer, h = self.peer, self.learners[f]
        plan = plan_sync(peer.history, peer.last_committed, h.last_zxid)
        if plan.mode is SyncMode.SNAP:
            # Chunks in a window (snap_transfer.py); the history after the snapshot and NEWLEADER
            # follow the last chunk, with whatever was proposed meanwhile.
            assert peer.sm.last_zxid == peer.last_committed
            h.state, h.snap_zxid = LearnerState.SNAPPING, plan.zxid
            # Streamed from a copy-on-write view: each chunk is encoded when the window opens for it.
            h.snap = SnapSender(peer.sm.freeze().chunks(self.cfg.snap_chunk_bytes), self.cfg.snap_chunk_bytes,
                                self.cfg.snap_window_chunks)
            return [self._ensemble_info(f), Send(f, Sync(SyncMode.SNAP, plan.zxid))] + self._snap_sends(f, h, h.snap.start())
        return [self._ensemble_info(f), Send(f, Sync(plan.mode, plan.zxid))] + self._finish_sync(f, h, plan.zxid)

    def _ensemble_info(self, f: int) -> Send:
        """Our committed ensemble, for a learner that missed the reconfig that made it."""
        ensemble = self.peer.ensemble
        return Send(f, EnsembleInfo(ensemble.version, ensemble.spec().encode()))

    def _finish_sync(self, f: int, h: LearnerHandle, zxid: int) -> list[Action]:
        """The history after `zxid` and NEWLEADER; from here the learner gets every proposal."""
        peer = self.peer
        if peer.history.base_zxid > zxid:
            return self._refuse(f, "the snapshot transfer outlasted the history window after it; sync again")
        out: list[Action] = [Send(f, SyncTxns(chunk)) for chunk in _chunks(peer.history.after(zxid))]
        assert self.epoch is not None
        out.append(Send(f, NewLeader(self.epoch, peer.last_zxid)))
        h.state, h.sync_zxid = LearnerState.SYNCING, peer.last_zxid
        self.forwarding.add(f)
        return out

    def _snap_sends(self, f: int, h: LearnerHandle, msgs: list) -> list[Action]:
        out: list[Action] = [Send(f, m) for m in msgs]
        if msgs and isinstance(msgs[-1], SnapEnd):
            out += self._finish_sync(f, h, h.snap_zxid)
        return out

    def _on_snap_ack(self, frm: int, a: SnapAck) -> list[Action]:
        h = self.learners.get(frm)
        if h is None or h.snap is None:
            return self._refuse(frm, "SNAPACK without a snapshot in transfer")
        msgs = h.snap.on_ack(a.received)
        if msgs is None:
            return self._refuse(frm, f"SNAPACK of {a.received} bytes, more than were sent")
        out = self._snap_sends(frm, h, msgs)
        if h.snap is not None and h.snap.done:
            h.snap = None  # the learner has it all: the leader's copy goes
        return out

    def _on_ack_new_leader(self, frm: int, a: AckNewLeader) -> list[Action]:
        if a.epoch != self.epoch:
            return []
        if frm == self.id:
            self.newleader_acked.add(frm)
        else:
            h = self.learners.get(frm)
            if h is None or h.state is not LearnerState.SYNCING:
                return []
            h.state = LearnerState.ACKED
            if frm in self.cfg.voting:
                self.newleader_acked.add(frm)
            if self.established:
                # Its NEWLEADER ack also says it logged every proposal we sent in the sync:
                # count it, or proposals outstanding at that moment might never commit.
                out = self._on_ack(frm, Ack(h.sync_zxid)) if not h.observer else []
                h.state = LearnerState.UPTODATE
                return out + [Send(frm, UpToDate(self.peer.last_committed))]
        if not self.established and self.id in self.newleader_acked and self.cfg.is_quorum(self.newleader_acked):
            return self._establish()
        return []

    def _establish(self) -> list[Action]:
        self.established = True
        self.peer.phase = Phase.BROADCAST
        out: list[Action] = self.peer.deliver_through(self.peer.last_zxid)
        self.peer.sm.forget_prepared()
        for f, h in self.learners.items():
            if h.state is LearnerState.ACKED:
                h.state = LearnerState.UPTODATE
                out.append(Send(f, UpToDate(self.peer.last_committed)))
        assert self.epoch is not None
        return [RoleChanged(Role.LEADING, self.id, self.epoch, broadcasting=True)] + out

    # -- broadcast --------------------------------------------------------------
    def on_client_sync(self, ev: ClientSync) -> list[Action]:
        if not self.established:
            return [RequestFailed(ev.session_id, ev.cxid, "NoLeader")]
        return self._read_index(self.read_index.sync([Synced(ev.session_id, ev.cxid, self.peer.last_committed)],
                                                     self.peer.now))

    def _read_index(self, started_and_released: tuple[int | None, list[Action]]) -> list[Action]:
        """Send the probe of a round that starts, and the answers of syncs a confirmed one released."""
        number, released = started_and_released
        if number is None:
            return released
        probes: list[Action] = [Send(f, ReadIndexProbe(number)) for f in self.forwarding if f in self.cfg.voting]
        return probes + released

    def on_touch(self, session_ids: tuple[int, ...]) -> list[Action]:
        return [SessionsTouched(self.id, session_ids)]

    def on_client_request(self, ev: ClientRequest) -> list[Action]:
        if not self.established:
            return [RequestFailed(ev.session_id, ev.cxid, "NoLeader")]
        return self._propose(self.id, ev.session_id, ev.cxid, ev.data, ev.decoded)

    def _propose(self, origin: int, session_id: int, cxid: int, data: bytes, decoded: object = None) -> list[Action]:
        assert self.epoch is not None
        if self.counter >= self.cfg.zxid_counter_limit:
            # zxid counter rollover: only a new epoch can continue the history.
            return [RequestFailed(session_id, cxid, "NoLeader")] + self.peer.look()
        zxid = Z.make(self.epoch, self.counter + 1)
        prepared = self.peer.sm.prepare(zxid, session_id, data, decoded, synced=self._synced())
        if isinstance(prepared, Refusal):
            # A failed request changes nothing, so it costs no log write and no quorum round
            # (ZooKeeper logs an error txn); its answer waits for what was prepared before it.
            refused = Refused(session_id, cxid, self.peer.last_zxid, prepared.data)
            if self.refusals or refused.zxid > self.peer.last_committed:
                self.refusals.append((refused.zxid, origin, refused))
                return []
            return self._answer_refused(origin, refused)
        self.counter += 1
        txn = Txn(zxid, session_id, cxid, prepared)
        self.peer.history.append(txn)
        self.proposed_bytes.proposed(zxid, len(txn.data))
        out: list[Action] = [Send(f, Proposal(txn)) for f in self.forwarding if not self.learners[f].observer]
        out += [LogAppend((txn,)), LogSync(then=(Send(self.id, Ack(txn.zxid)),))]
        return out

    def _on_ack(self, frm: int, a: Ack) -> list[Action]:
        if frm != self.id and (frm not in self.forwarding or self.learners[frm].observer):
            return []
        if frm == self.id and Z.epoch_of(a.zxid) != self.epoch:
            # Our log writer's ACK of a proposal of an earlier leadership, fsynced after we stepped
            # down (and perhaps were truncated) and came to lead again: nothing to count.
            return []
        if not 0 <= a.zxid <= self.peer.last_zxid:
            # A learner logs only what we sent it: this ACK must never count toward a quorum.
            return self._refuse(frm, f"ACK of {a.zxid:#x}, which this leader never proposed")
        self.acked_through[frm] = max(self.acked_through.get(frm, 0), a.zxid)
        out = self._commit(min(self._quorum_acked(), self.peer.last_zxid))
        # After the commit (it trims our history): the points a voter may be at, none below our
        # history's base, so this stays within the sync window (behind it, lag.py's lower bound).
        needed = min((self.acked_through.get(f, 0) for f in self.forwarding if not self.learners[f].observer),
                     default=self.peer.last_zxid)
        self.proposed_bytes.trim(max(needed, self.peer.history.base_zxid))
        return out

    def _commit(self, target: int) -> list[Action]:
        if not self.established or target <= self.peer.last_committed:
            return []
        # COMMIT covers every proposal up to it; observers get the committed transactions.
        out: list[Action] = [Send(f, Commit(target)) for f in self.forwarding if not self.learners[f].observer]
        observers = [f for f in self.forwarding if self.learners[f].observer]
        if observers:
            for txn in self.peer.history.between(self.peer.last_committed, target):
                out += [Send(f, Inform(txn)) for f in observers]
        out += self.peer.deliver_through(target)
        while self.refusals and self.refusals[0][0] <= target:
            _, origin, refused = self.refusals.popleft()
            out += self._answer_refused(origin, refused)
        return out

    def _answer_refused(self, origin: int, refused: Refused) -> list[Action]:
        if origin != self.id:
            # After the COMMITs above on the same FIFO link: the learner has delivered refused.zxid.
            return [Send(origin, refused)] if origin in self.forwarding else []
        return [Answered(refused.session_id, refused.cxid, self.peer.sm.refused(refused.zxid, refused.data))]

    def _quorum_acked(self) -> int:
        """The highest zxid that a quorum of voters has logged (of both ensembles while a
        reconfig is pending: joint consensus)."""
        highest = self.peer.last_zxid
        for voters in self.cfg.quorums():
            acked = sorted((self.acked_through.get(v, 0) for v in voters), reverse=True)
            highest = min(highest, acked[len(voters) // 2])
        return highest

    def _synced(self) -> frozenset[int]:
        """Members whose logs follow ours now: us, and learners past synchronization heard from
        within sync_limit_ticks (a reconfig needs a quorum of its new voters among them)."""
        now, limit = self.peer.now, self.cfg.sync_limit_ticks
        return frozenset([self.id] + [f for f in self.forwarding if self.learners[f].state is LearnerState.UPTODATE
                                      and now - self.learners[f].last_heard <= limit])

    def followers_status(self) -> dict:
        """What a monitor asks of a leader (ZooKeeper's mntr zk_followers, zk_synced_followers,
        zk_pending_syncs): per learner its state, the highest zxid it acknowledged, how many
        transactions it is behind (within this epoch: a zxid of an older one counts as all of it)
        and their txn-log record bytes (lag.py: for a zxid older than this leadership or than our
        history, every byte kept, a lower bound). Observers never ACK: their lags are None."""
        last, synced = self.peer.last_zxid, self._synced()
        learners = {}
        for fid, handle in sorted(self.learners.items()):
            acked = self.acked_through.get(fid, 0)
            same_epoch = Z.epoch_of(acked) == Z.epoch_of(last)
            behind = Z.counter_of(last) - Z.counter_of(acked) if same_epoch else Z.counter_of(last)
            learners[str(fid)] = {"state": handle.state.name.lower(), "observer": handle.observer,
                                  "synced": fid in synced, "acked_zxid": acked,
                                  "lag_txns": None if handle.observer else max(0, behind),
                                  "lag_bytes": None if handle.observer else self.proposed_bytes.lag(acked)}
        return {"followers": learners, "synced_followers": len(synced) - 1,
                "pending_syncs": sum(1 for h in self.learners.values()
                                     if h.state in (LearnerState.SNAPPING, LearnerState.SYNCING))}

    def on_new_ensemble(self) -> list[Action]:
        """The committed or the pending ensemble changed. Step down if we are no longer a voter
        (the new voters elect at once); drop learners it removed, or whose way of learning it
        changed (an observer a pending reconfig makes a voter must follow, and ACK it): they
        rejoin, and LEADERINFO tells them how."""
        if self.cfg.role_of(self.id) != VOTER:
            return self.peer.look()
        out: list[Action] = []
        for f, h in list(self.learners.items()):
            role = self.cfg.role_of(f)
            if role is None or h.observer != (f not in self.cfg.voting):
                self._drop(f)
                out.append(Disconnect(f, f"the ensemble now has it as {role or 'no member'}; it rejoins so"))
        return out

    # -- liveness ---------------------------------------------------------------
    def on_tick(self) -> list[Action]:
        now = self.peer.now
        if not self.established:
            if now - self.started > self.cfg.init_limit_ticks:
                return self.peer.look()
            return []
        heard = {self.id} | {f for f in self.forwarding
                             if f in self.cfg.voting and now - self.learners[f].last_heard <= self.cfg.sync_limit_ticks}
        if not self.cfg.is_quorum(heard):
            return self.peer.look()
        out: list[Action] = []
        for f, h in list(self.learners.items()):
            if f not in self.forwarding and now - h.last_heard > self.cfg.init_limit_ticks:
                self._drop(f)
                out.append(Disconnect(f, "did not finish synchronization within init_limit_ticks"))
        if now % self.cfg.ping_interval_ticks == 0:
            # Only learners we synchronize: anyone else's PING is refused (on_message).
            out += [Send(f, Ping()) for f in self.forwarding]
        out += self._read_index(self.read_index.tick(now))
        out.append(LeaderTicked(now * self.cfg.tick_ms))
        return out

    def on_disconnected(self, peer_id: int) -> list[Action]:
        self._drop(peer_id)
        return []

    def _refuse(self, frm: int, reason: str) -> list[Action]:
        """A peer broke the protocol (a bug, or a stranger before TLS): forget it, drop its links."""
        if frm == self.id:
            raise AssertionError(f"leader {self.id} refused its own message: {reason}")
        self._drop(frm)
        return [Disconnect(frm, reason)]

    def _drop(self, f: int) -> None:
        self.learners.pop(f, None)
        self.acked_through.pop(f, None)
        self.forwarding.discard(f)
        if self.epoch is None and f != self.id:
            self.connecting.pop(f, None)

    def on_notification(self, frm: int, n: Notification) -> list[Action]:
        return []

    def on_message(self, frm: int, msg: Message) -> list[Action]:
        h = self.learners.get(frm)
        if h is not None:
            h.last_heard = self.peer.now
        if isinstance(msg, _FROM_SYNCED) and frm != self.id and frm not in self.forwarding:
            # ACK, REQUEST, PING and SYNCREQUEST come only from learners we synchronize
            # (issue 17: a forged REQUEST would be proposed, a forged ACK counted).
            return self._refuse(frm, f"{type(msg).__name__} from a peer this leader does not synchronize")
        if isinstance(msg, Ack):
            return self._on_ack(frm, msg)
        if isinstance(msg, SnapAck):
            return self._on_snap_ack(frm, msg)
        if isinstance(msg, Request):
            if not self.established:
                return [Send(frm, Reject(msg.session_id, msg.cxid))]
            return self._propose(frm, msg.session_id, msg.cxid, msg.data)
        if isinstance(msg, FollowerInfo):
            return self._on_follower_info(frm, msg)
        if isinstance(msg, AckEpoch):
            return self._on_ack_epoch(frm, msg)
        if isinstance(msg, AckNewLeader):
            return self._on_ack_new_leader(frm, msg)
        if isinstance(msg, Ping):
            return [SessionsTouched(frm, msg.touches)] if msg.touches and self.established else []
        if isinstance(msg, SyncRequest):
            if not self.established:
                return [Send(frm, Reject(msg.session_id, msg.cxid))]
            reply = Send(frm, SyncReply(msg.session_id, msg.cxid, self.peer.last_committed))
            return self._read_index(self.read_index.sync([reply], self.peer.now))
        if isinstance(msg, ReadIndexAck):
            if not 0 < msg.round <= self.read_index.last_round:
                return self._refuse(frm, f"READINDEXACK of round {msg.round}, which this leader never sent")
            if frm not in self.cfg.voting:
                return []  # an observer's answer proves nothing about the voters' quorum
            return self._read_index(self.read_index.acked(frm, msg.round, self.peer.now))
        return [Disconnect(frm, f"a leader does not expect {type(msg).__name__}")] if frm != self.id else []


_FROM_SYNCED = (Ack, Request, Ping, SyncRequest, ReadIndexAck)


def _chunks(txns: list[Txn]) -> list[tuple[Txn, ...]]:
    out: list[tuple[Txn, ...]] = []
    chunk: list[Txn] = []
    size = 0
    for t in txns:
        chunk.append(t)
        size += len(t.data)
        if len(chunk) >= SYNC_CHUNK_TXNS or size >= SYNC_CHUNK_BYTES:
            out.append(tuple(chunk))
            chunk, size = [], 0
    if chunk:
        out.append(tuple(chunk))
    return out
