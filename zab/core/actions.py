"""Events into the Zab core and actions out of it.

The driver executes actions strictly in order. Log actions go to one writer
that appends, fsyncs once for everything queued (group commit), and only then
runs the actions carried in LogSync.then: "persist, then send" is one action.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from zab.core.ensemble import Ensemble
from zab.core.messages import Message
from zab.core.statemachine import Frozen
from zab.core.txn import Txn


# -- events -----------------------------------------------------------------
@dataclass(slots=True, unsafe_hash=True)
class Tick:
    pass


@dataclass(slots=True, unsafe_hash=True)
class Received:
    frm: int
    msg: Message


@dataclass(slots=True, unsafe_hash=True)
class PeerDisconnected:
    """The link to or from `peer` broke: anything in flight on it may be lost."""
    peer: int


@dataclass(slots=True, unsafe_hash=True)
class ClientRequest:
    session_id: int
    cxid: int
    data: bytes
    # What this node's state machine made of `data` already (the client port decoded it to
    # route it): handed to prepare() when this node leads, so a request is decoded once.
    # Never sent: a request forwarded to the leader is decoded there.
    decoded: object = field(default=None, compare=False)


@dataclass(slots=True, unsafe_hash=True)
class ClientSync:
    """A client's `sync`: answer once this node has every write committed before it."""
    session_id: int
    cxid: int


@dataclass(slots=True, unsafe_hash=True)
class TouchSessions:
    """Client sessions active on this node; they reach the leader with the next ping."""
    session_ids: tuple[int, ...]


Event = Tick | Received | PeerDisconnected | ClientRequest | ClientSync | TouchSessions


# -- actions ----------------------------------------------------------------
class Phase(enum.Enum):
    ELECTION = "election"
    DISCOVERY = "discovery"
    SYNCHRONIZATION = "synchronization"
    BROADCAST = "broadcast"


class Role(enum.Enum):
    LOOKING = "looking"
    FOLLOWING = "follower"
    LEADING = "leader"
    OBSERVING = "observer"


@dataclass(slots=True, unsafe_hash=True)
class Send:
    to: int
    msg: Message


@dataclass(slots=True, unsafe_hash=True)
class PersistEpoch:
    """Write acceptedEpoch and/or currentEpoch durably (tmp, fsync, rename)."""
    accepted: int | None = None
    current: int | None = None


@dataclass(slots=True, unsafe_hash=True)
class LogAppend:
    txns: tuple[Txn, ...]


@dataclass(slots=True, unsafe_hash=True)
class LogSync:
    """Fsync everything appended so far, then run `then` in order."""
    then: tuple["Action", ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class LogTruncate:
    """Durably drop every logged record after `zxid` (the TRUNC of synchronization)."""
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class SnapBegin:
    """A SNAP at `zxid` begins: start an empty partial snapshot file (a partial one left from an
    earlier transfer goes). Then SnapWrites, then InstallSnapshot or SnapDiscard (snap_transfer.py)."""
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class SnapWrite:
    """Append `data` to the partial snapshot file (no fsync: InstallSnapshot syncs it once), then
    run `then` (the SNAPACK that opens the leader's window: the disk paces the transfer)."""
    data: bytes
    then: tuple["Action", ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class SnapDiscard:
    """The SNAP at `zxid` was cut (the leader gone, a bad chunk or digest): remove the partial file."""
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class InstallSnapshot:
    """SNAP sync: make the partial snapshot file at `zxid` (SnapBegin, SnapWrite, verified by the
    core) durable as the node's snapshot, under its final name, and discard the old history. The
    state machine already holds its state: the core restored it from the same chunks."""
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class TakeSnapshot:
    """Write a local snapshot of the delivered state (serialised off the event loop)."""
    frozen: Frozen


@dataclass(slots=True, unsafe_hash=True)
class Delivered:
    """A committed transaction was applied; answer its client if it is ours."""
    txn: Txn
    result: object


@dataclass(slots=True, unsafe_hash=True)
class Answered:
    """A request the leader refused (statemachine.Refusal) is answered here, after
    everything it was ordered behind was delivered; `result` is StateMachine.refused's."""
    session_id: int
    cxid: int
    result: object


@dataclass(slots=True, unsafe_hash=True)
class Synced:
    """A client's `sync` is done: this node has delivered everything up to `zxid`."""
    session_id: int
    cxid: int
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class SessionsTouched:
    """Leader only: these sessions are alive (seen on node `frm`, possibly ourselves)."""
    frm: int
    session_ids: tuple[int, ...]


@dataclass(slots=True, unsafe_hash=True)
class LeaderTicked:
    """An established leader's clock advanced: `now_ms` is its ticks so far times tick_ms. Time-based
    decisions of the state machine's service (session expiry) run on this clock, the core's, so the
    simulator drives them with the same ticks as elections and pings."""
    now_ms: int


@dataclass(slots=True, unsafe_hash=True)
class RequestFailed:
    session_id: int
    cxid: int
    reason: str


@dataclass(slots=True, unsafe_hash=True)
class RoleChanged:
    """The peer changed role or leader, or its leadership was established; requests in flight have an
    unknown outcome. `broadcasting`: established in this role (the BROADCAST phase), until the next
    RoleChanged: the leader once a quorum acked NEWLEADER, a learner once synced (UPTODATE)."""
    role: Role
    leader: int | None
    epoch: int
    broadcasting: bool = False


@dataclass(slots=True, unsafe_hash=True)
class EnsembleChanged:
    """The committed ensemble is now `ensemble` (a reconfig committed, or a leader told us of a
    newer one): persist it (it replaces cluster.toml's membership at the next start) and talk to
    its members."""
    ensemble: Ensemble


@dataclass(slots=True, unsafe_hash=True)
class Disconnect:
    """Drop the links with `peer` (it broke the protocol or fell too far behind)."""
    peer: int
    reason: str = field(default="")


Action = (Send | PersistEpoch | LogAppend | LogSync | LogTruncate | SnapBegin | SnapWrite | SnapDiscard | InstallSnapshot
          | TakeSnapshot | Delivered
          | Answered | Synced | SessionsTouched | LeaderTicked | RequestFailed | RoleChanged | EnsembleChanged
          | Disconnect)
