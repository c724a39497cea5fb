"""Configuration of one Zab peer: explicit, validated, frozen data (no global lookups)."""

from __future__ import annotations

from dataclasses import dataclass

from zab.core import zxid as Z


VOTER = "voter"
OBSERVER = "observer"


class ZabConfigError(ValueError):
    """The ensemble description is unusable; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class ZabConfig:
    """What the pure Zab core needs to know. Time is counted in ticks.

    The driver turns `tick_ms` into Tick events; every other duration is a
    number of ticks so that the simulator can drive the same core.
    """

    my_id: int
    # The committed ensemble (zab/core/ensemble.py); a node may be outside it while it joins or
    # after it was removed. cluster.toml's checks (odd voter count) apply to the bootstrap only:
    # ZooKeeper's reconfig allows any count.
    voters: frozenset[int]
    observers: frozenset[int] = frozenset()
    # The ensemble a logged but uncommitted reconfig proposes. While it is pending every quorum
    # must be a majority of both (joint consensus, ZooKeeper's lastSeenQuorumVerifier).
    pending_voters: frozenset[int] | None = None
    pending_observers: frozenset[int] = frozenset()
    tick_ms: int = 50
    # How long a LOOKING voter waits, once a quorum agrees on its vote, for a
    # better vote before deciding (ZooKeeper's finalizeWait, 200 ms there).
    election_finalize_ticks: int = 3
    # How often a LOOKING peer re-sends its notification when nothing decides.
    election_resend_ticks: int = 4
    # Discovery + synchronization must finish within this (ZooKeeper's initLimit).
    init_limit_ticks: int = 100
    # A leader without a quorum heard from within this steps down; a follower
    # that has not heard from its leader within this returns to election (syncLimit).
    sync_limit_ticks: int = 10
    ping_interval_ticks: int = 2
    # Committed transactions kept in memory so that lagging followers get a DIFF;
    # a follower further behind gets a SNAP.
    sync_window_txns: int = 100_000
    # ... and at most this many bytes of them (zab.core.history.txn_bytes): with large
    # transactions the count alone would let the window hold gigabytes (issue 17).
    sync_window_bytes: int = 256 << 20
    # Take a local snapshot after this many delivered transactions.
    snapshot_every_txns: int = 50_000
    # A SNAP travels in chunks of at most this many bytes, this many unanswered at a time
    # (zab/core/snap_transfer.py); a chunk must fit a frame (max_frame_bytes).
    snap_chunk_bytes: int = 1 << 20
    snap_window_chunks: int = 8
    # The largest snapshot a learner writes to its partial snapshot file (it holds only a window of
    # chunks in memory): the bound on what a leader with a bug, or a stranger where TLS is off, can make it store.
    snap_max_bytes: int = 4 << 30
    # The last zxid counter a leader may use before it must step down for a new
    # epoch. Only tests lower it, to reach the rollover without 2**32 proposals.
    zxid_counter_limit: int = Z.COUNTER_MAX

    def __post_init__(self) -> None:
        if not self.voters:
            raise ZabConfigError("an ensemble needs at least one voter")
        if self.voters & self.observers:
            raise ZabConfigError(f"nodes {sorted(self.voters & self.observers)} are both voter and observer")
        for name in ("tick_ms", "election_finalize_ticks", "election_resend_ticks", "init_limit_ticks",
                     "sync_limit_ticks", "ping_interval_ticks", "sync_window_txns", "sync_window_bytes",
                     "snapshot_every_txns", "snap_chunk_bytes", "snap_window_chunks", "snap_max_bytes",
                     "zxid_counter_limit"):
            if getattr(self, name) <= 0:
                raise ZabConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.zxid_counter_limit > Z.COUNTER_MAX:
            raise ZabConfigError(f"zxid_counter_limit cannot exceed {Z.COUNTER_MAX}")
        if self.ping_interval_ticks >= self.sync_limit_ticks:
            raise ZabConfigError("ping_interval_ticks must be smaller than sync_limit_ticks")

    @property
    def is_observer(self) -> bool:
        """True when this node neither votes nor follows: a voter of the committed or of the pending
        ensemble votes in elections and follows (its ACKs count where it is a voter); anyone else
        observes, or, outside both, only learns who leads (zab/core/election.py)."""
        return self.my_id not in self.voting

    def role_of(self, node: int) -> str | None:
        """VOTER, OBSERVER or None: the committed ensemble's word, else the pending one's (a
        node a pending reconfig adds joins in the role it proposes)."""
        for voters, observers in ((self.voters, self.observers),
                                  (self.pending_voters or frozenset(), self.pending_observers)):
            if node in voters:
                return VOTER
            if node in observers:
                return OBSERVER
        return None

    @property
    def members(self) -> frozenset[int]:
        """Everyone we talk to: the committed ensemble and the pending one."""
        return self.voters | self.observers | (self.pending_voters or frozenset()) | self.pending_observers

    @property
    def voting(self) -> frozenset[int]:
        """The voters of the committed ensemble and of the pending one."""
        return self.voters | (self.pending_voters or frozenset())

    @property
    def is_member(self) -> bool:
        return self.my_id in self.members

    def quorums(self) -> tuple[frozenset[int], ...]:
        """The voter sets a quorum must be a majority of (one, or two during a reconfig)."""
        return (self.voters,) if self.pending_voters is None else (self.voters, self.pending_voters)

    def is_quorum(self, ids: set[int] | frozenset[int]) -> bool:
        """A majority of the committed voters, and of the pending ones while a reconfig is
        pending; observers never count."""
        return all(len(ids & v) * 2 > len(v) for v in self.quorums())
