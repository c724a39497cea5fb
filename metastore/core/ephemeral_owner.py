"""A znode's ephemeralOwner and what it encodes (ZooKeeper's EphemeralType): persistent (0), an
ephemeral node's session id, the container mark, or a TTL node's time to live in the low bits
under the 0xFF top byte. Sessions ids are chosen so that they always read as ephemeral owners."""

from __future__ import annotations

import enum

from metastore.errors import BadArguments

CONTAINER_OWNER = 0x8000_0000_0000_0000
TTL_MASK = 0xFF00_0000_0000_0000
_RESERVED_BITS = 0x00FF_FF00_0000_0000
MAX_TTL_MS = 0x0000_00FF_FFFF_FFFF


class EphemeralType(enum.Enum):
    VOID = 0        # persistent
    NORMAL = 1      # ephemeral: the owner is a session id
    CONTAINER = 2
    TTL = 3


def ephemeral_type(owner: int) -> EphemeralType:
    """The kind of a znode from its raw ephemeralOwner; ValueError for a reserved encoding."""
    if owner & TTL_MASK == TTL_MASK:
        if owner & _RESERVED_BITS or not owner & MAX_TTL_MS:
            raise ValueError(f"invalid ephemeral owner {owner:#x}")
        return EphemeralType.TTL
    if owner == CONTAINER_OWNER:
        return EphemeralType.CONTAINER
    return EphemeralType.VOID if owner == 0 else EphemeralType.NORMAL


def ttl_owner(ttl_ms: int) -> int:
    """The ephemeralOwner of a TTL node; BadArguments unless 0 < ttl_ms <= MAX_TTL_MS."""
    if not 0 < ttl_ms <= MAX_TTL_MS:
        raise BadArguments(None, f"ttl must be positive and at most {MAX_TTL_MS}")
    return TTL_MASK | ttl_ms


def ttl_of(owner: int) -> int:
    return owner & MAX_TTL_MS


def is_session_id(session_id: int) -> bool:
    """Session ids must read as NORMAL owners: not 0, not the container mark, top byte not 0xff."""
    return 0 < session_id <= (1 << 64) - 1 and session_id != CONTAINER_OWNER and session_id & TTL_MASK != TTL_MASK


def client_owner(owner: int) -> int:
    """The ephemeralOwner a client sees: 0 for containers and TTL nodes, as ZooKeeper shows them."""
    return 0 if owner == CONTAINER_OWNER or owner & TTL_MASK == TTL_MASK else owner
