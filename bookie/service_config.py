"""The bookie port's limits (BookieServiceConfig), built by clusterd from cluster.toml's bookie_* keys."""

from __future__ import annotations

from dataclasses import dataclass, fields

from bookie import protocol as P


@dataclass(frozen=True)
class BookieServiceConfig:
    """Limits of the bookie's client port.

    - max_entry_bytes: the largest packaged entry accepted (frames may be this plus
      protocol.FRAME_OVERHEAD_BYTES); keep it equal to the storage's.
    - max_in_flight: requests of one connection being served at once; beyond it, OVERLOADED.
    - max_in_flight_bytes: bytes of the adds one connection has waiting for their journal fsync;
      beyond it, OVERLOADED (one add is always admitted, however large).
    - max_outgoing_bytes: answers queued for one connection before it is cut off.
    - max_long_poll_ms: a long poll's timeout is capped at this.
    - handshake_timeout_ms: a new connection that has not sent a whole frame within this is closed
      (with TLS, the TLS handshake counts against it too).
    - read_timeout_ms: a connection that stops in the middle of a frame for this long is closed
      (one idle between frames is not: pooled clients keep their connections open).
    - max_connections, max_connections_per_address: beyond them, a new connection is closed at once.
    - max_outgoing_bytes_total, max_in_flight_bytes_total: the same two over every connection of the
      bookie together (a connection whose answer would pass the first is cut off; an add past the
      second is answered OVERLOADED, one add always admitted).
    So one connection holds at most max_frame_bytes + max_in_flight_bytes + max_outgoing_bytes, and
    all of them together at most connections x max_frame_bytes + max_in_flight_bytes_total +
    max_outgoing_bytes_total plus one answer per connection.
    """

    max_entry_bytes: int = 5 << 20
    max_in_flight: int = 10_000
    max_in_flight_bytes: int = 256 << 20
    max_outgoing_bytes: int = 64 << 20
    max_outgoing_bytes_total: int = 1 << 30
    max_in_flight_bytes_total: int = 1 << 30
    max_long_poll_ms: int = 60_000
    receive_bytes: int = 1 << 18
    handshake_timeout_ms: int = 10_000
    read_timeout_ms: int = 30_000
    max_connections: int = 1024
    max_connections_per_address: int = 60

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"BookieServiceConfig.{f.name} must be positive, got {getattr(self, f.name)}")

    @property
    def max_frame_bytes(self) -> int:
        return self.max_entry_bytes + P.FRAME_OVERHEAD_BYTES
