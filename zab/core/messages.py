"""Peer messages of Zab, named as in ZooKeeper's system spec and the Zab paper.

Election: NOTIFICATION. Discovery: FOLLOWERINFO, LEADERINFO, ACKEPOCH.
Synchronization: SYNC (DIFF / TRUNC / SNAP header), SYNCTXNS (the leader's
history after the sync point), NEWLEADER, ACKNEWLEADER (ACKLD), UPTODATE.
Broadcast: PROPOSAL, ACK, COMMIT, INFORM (committed txn, to observers),
REQUEST (a write forwarded by a learner), REJECT, PING (carrying session touches),
SYNCREQUEST / SYNCREPLY (a client's `sync`).
The sender is not part of a message: the link it arrives on names it.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from zab.core.txn import Txn


class ServerState(enum.IntEnum):
    LOOKING = 0
    FOLLOWING = 1
    LEADING = 2
    OBSERVING = 3


class SyncMode(enum.IntEnum):
    DIFF = 0   # the learner has a prefix of the leader's history: send what follows
    TRUNC = 1  # the learner has proposals the leader never committed: drop those first
    SNAP = 2   # the learner is behind the leader's in-memory history: send the whole state


@dataclass(slots=True, unsafe_hash=True)
class Notification:
    """Fast leader election: the sender's current vote and state."""
    leader: int
    zxid: int
    peer_epoch: int
    election_epoch: int
    state: ServerState


@dataclass(slots=True, unsafe_hash=True)
class FollowerInfo:
    """Learner -> prospective leader. `attempt` tells a resend from a fresh join."""
    accepted_epoch: int
    last_zxid: int
    observer: bool
    attempt: int


@dataclass(slots=True, unsafe_hash=True)
class LeaderInfo:
    """Leader -> learner: the new epoch, and whether the learner learns as an observer (INFORM)
    or as a follower (PROPOSAL, COMMIT, its ACKs counted): the leader decides, from the ensemble
    it knows, which a learner that missed a reconfig cannot (zab/core/config.py `is_observer`)."""
    new_epoch: int
    observer: bool = False


@dataclass(slots=True, unsafe_hash=True)
class AckEpoch:
    current_epoch: int
    last_zxid: int


@dataclass(slots=True, unsafe_hash=True)
class Sync:
    """Start of synchronization. DIFF: `zxid` is the learner's last zxid; TRUNC:
    drop everything after `zxid`; SNAP: the state at `zxid` follows in SNAPCHUNKs (`snapshot`
    None), or is `snapshot` itself (a leader of an older version)."""
    mode: SyncMode
    zxid: int
    snapshot: bytes | None = None


@dataclass(slots=True, unsafe_hash=True)
class SyncTxns:
    """A chunk of the leader's history following the sync point, in zxid order."""
    txns: tuple[Txn, ...]


@dataclass(slots=True, unsafe_hash=True)
class NewLeader:
    epoch: int
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class AckNewLeader:
    epoch: int


@dataclass(slots=True, unsafe_hash=True)
class UpToDate:
    """Ends synchronization: everything up to `committed_zxid` is committed."""
    committed_zxid: int


@dataclass(slots=True, unsafe_hash=True)
class Proposal:
    txn: Txn


@dataclass(slots=True, unsafe_hash=True)
class Ack:
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class Commit:
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class Inform:
    txn: Txn


@dataclass(slots=True, unsafe_hash=True)
class Request:
    session_id: int
    cxid: int
    data: bytes


@dataclass(slots=True, unsafe_hash=True)
class Reject:
    """The leader could not take a forwarded request (not established any more)."""
    session_id: int
    cxid: int


@dataclass(slots=True, unsafe_hash=True)
class Ping:
    """Leader -> learner: are you there. Learner -> leader: yes, and these client
    sessions were active here since the last ping (the leader decides expiry)."""
    touches: tuple[int, ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class SyncRequest:
    """A client's `sync`, forwarded to the leader."""
    session_id: int
    cxid: int


@dataclass(slots=True, unsafe_hash=True)
class SyncReply:
    """The leader's committed zxid when it saw the SyncRequest. FIFO links mean every
    COMMIT up to it reached the learner before this reply."""
    session_id: int
    cxid: int
    zxid: int


@dataclass(slots=True, unsafe_hash=True)
class ReadIndexProbe:
    """Leader -> voter: do you still follow me? Sent after a sync arrived (zab/core/read_index.py)."""
    round: int


@dataclass(slots=True, unsafe_hash=True)
class ReadIndexAck:
    """Voter -> the leader it follows: yes, to the probe of `round`."""
    round: int


@dataclass(slots=True, unsafe_hash=True)
class SnapChunk:
    """Leader -> learner: `data` of the snapshot announced by SYNC(SNAP), at byte `offset`, with
    `crc`, its CRC-32C, computed where the chunk was encoded (zab/core/snap_transfer.py)."""
    offset: int
    data: bytes
    crc: int


@dataclass(slots=True, unsafe_hash=True)
class SnapAck:
    """Learner -> leader: the first `received` bytes of the snapshot arrived (the window moves)."""
    received: int


@dataclass(slots=True, unsafe_hash=True)
class SnapEnd:
    """Leader -> learner: the snapshot was `total` bytes with this SHA-256."""
    total: int
    digest: bytes


@dataclass(slots=True, unsafe_hash=True)
class EnsembleInfo:
    """Leader -> learner, before SYNC: the leader's committed ensemble (zab/core/ensemble.py server
    lines, made by the reconfig at zxid `version`). A learner that missed that reconfig (a SNAP
    folds it away, or it is joining) adopts it (ZooKeeper sends its config in NEWLEADER)."""
    version: int
    spec: bytes


@dataclass(slots=True, unsafe_hash=True)
class Refused:
    """Leader -> the learner a request came from: it fails without a transaction
    (statemachine.Refusal). Sent after the COMMIT of `zxid`, the last transaction
    prepared before it, so FIFO links deliver it after that commit."""
    session_id: int
    cxid: int
    zxid: int
    data: bytes


Message = (Notification | FollowerInfo | LeaderInfo | AckEpoch | Sync | SyncTxns | NewLeader | AckNewLeader
           | UpToDate | Proposal | Ack | Commit | Inform | Request | Reject | Ping | SyncRequest | SyncReply
           | Refused | ReadIndexProbe | ReadIndexAck | SnapChunk | SnapAck | SnapEnd | EnsembleInfo)
