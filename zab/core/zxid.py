"""Zxids: the 64-bit transaction ids of Zab.

Paper section 3: the high 32 bits are the epoch of the leader that proposed the
transaction, the low 32 bits a counter that the leader increments per proposal.
Ordering zxids as integers therefore orders first by epoch, then by counter.
"""

from __future__ import annotations

COUNTER_BITS = 32
COUNTER_MASK = (1 << COUNTER_BITS) - 1
EPOCH_MAX = (1 << 32) - 1
# The last counter a leader may use: when the next proposal would need it, the
# leader steps down so that a new epoch starts (ZooKeeper does the same on rollover).
COUNTER_MAX = COUNTER_MASK

ZERO = 0

# Defence against a peer with a bug (or a stranger before TLS): no epoch at or above
# EPOCH_LIMIT is taken from a message, chosen or persisted, so an epoch never reaches a
# value that a zxid or the next epoch (+1) cannot hold. FOLLOWERINFO's accepted epoch
# must leave room for the leader's +1, so it must be below EPOCH_LIMIT - 1.
EPOCH_LIMIT = EPOCH_MAX
# Election rounds (logical clocks) are u64 on the wire and each new round adds one; a
# round from a message at or above this is ignored, leaving 2**62 rounds of headroom.
ELECTION_ROUND_LIMIT = 1 << 62
ZXID_MAX = (1 << 64) - 1


def epoch_ok(epoch: int) -> bool:
    """True when `epoch`, taken from a message, may be used (0 <= epoch < EPOCH_LIMIT)."""
    return 0 <= epoch < EPOCH_LIMIT


def zxid_ok(zxid: int) -> bool:
    """True when `zxid`, taken from a message, is a u64 whose epoch may be used."""
    return 0 <= zxid <= ZXID_MAX and epoch_of(zxid) < EPOCH_LIMIT


def make(epoch: int, counter: int) -> int:
    """The zxid of the `counter`-th proposal of `epoch`."""
    if not 0 <= epoch <= EPOCH_MAX:
        raise ValueError(f"epoch {epoch} out of range 0..{EPOCH_MAX}")
    if not 0 <= counter <= COUNTER_MASK:
        raise ValueError(f"counter {counter} out of range 0..{COUNTER_MASK}")
    return (epoch << COUNTER_BITS) | counter


def epoch_of(zxid: int) -> int:
    return zxid >> COUNTER_BITS


def counter_of(zxid: int) -> int:
    return zxid & COUNTER_MASK


def fmt(zxid: int) -> str:
    """Human form used in logs and status output: 0x<epoch>_<counter>."""
    return f"0x{epoch_of(zxid):x}_{counter_of(zxid):08x}"


def follows(prev: int, nxt: int) -> bool:
    """True when `nxt` may directly follow `prev` in one history.

    Within an epoch counters are contiguous; a new, higher epoch starts at counter 1.
    """
    if epoch_of(nxt) == epoch_of(prev):
        return counter_of(nxt) == counter_of(prev) + 1
    return epoch_of(nxt) > epoch_of(prev) and counter_of(nxt) == 1
