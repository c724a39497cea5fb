"""Events into the ledger operations and actions out of them (sans-I/O).

Every operation (Writer, CloseOp, RecoveryOp, ReadEntryOp, ReadLacOp,
LongPollOp) is a pure object: `start()` and `step(event)` return a list of
actions. A driver (the trio SDK in ledger/client.py, or the simulator in
sim/bookies.py) executes the actions in order and feeds every outcome back as
an event. Operations never call anything: no callbacks, no clocks (Tick is an
event), no randomness.

Bookie requests name the bookie by id; the ledger id and master key are the
driver's (one operation works on one ledger). Every request a driver sends
must come back as exactly one event: an answer or a failure carrying a
bookie.errors class (BookieUnavailable for a timeout or a lost connection).
"""

from __future__ import annotations

from dataclasses import dataclass

from bookie.errors import BookieError
from ledger.errors import LedgerError
from ledger.metadata import LedgerMetadata


# -- events ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tick:
    """Abstract time: drivers send one every tick_ms (speculative reads, retries)."""


@dataclass(frozen=True, slots=True)
class Idle:
    """The answer to RequestIdle: the application has had its turn since the request (a driver
    sends it once every task runnable at the request has run: no timer, no tick)."""


@dataclass(frozen=True, slots=True)
class AddAcked:
    bookie: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class AddFailed:
    bookie: int
    entry_id: int
    error: BookieError


@dataclass(frozen=True, slots=True)
class ReadAnswered:
    bookie: int
    entry_id: int
    data: bytes  # the packaged entry exactly as the bookie stores it (digest not yet checked)


@dataclass(frozen=True, slots=True)
class ReadFailed:
    bookie: int
    entry_id: int
    error: BookieError


@dataclass(frozen=True, slots=True)
class FenceAnswered:
    """The bookie persisted the fence; `lac` is the highest LAC it has seen (NO_ENTRY for none)."""
    bookie: int
    lac: int


@dataclass(frozen=True, slots=True)
class FenceFailed:
    bookie: int
    error: BookieError


@dataclass(frozen=True, slots=True)
class LacAnswered:
    bookie: int
    lac: int


@dataclass(frozen=True, slots=True)
class LacFailed:
    bookie: int
    error: BookieError


@dataclass(frozen=True, slots=True)
class LongPollAnswered:
    """The bookie's LAC when it answered (at or past `entry_id`, or unchanged at its timeout) and the
    entry if it has it."""
    bookie: int
    lac: int
    data: bytes | None


@dataclass(frozen=True, slots=True)
class LongPollFailed:
    bookie: int
    error: BookieError


@dataclass(frozen=True, slots=True)
class MetadataWritten:
    """The compare-and-set of the last WriteMetadata succeeded; the znode is now at `version`."""
    version: int


@dataclass(frozen=True, slots=True)
class MetadataBadVersion:
    """The compare-and-set lost (someone else changed the metadata), or its outcome is unknown."""


@dataclass(frozen=True, slots=True)
class MetadataRead:
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True)
class BookiesChosen:
    """Placement's answer to ChooseBookies: up to `count` bookies, none of the excluded ones."""
    bookies: tuple[int, ...]


Event = (Tick | Idle | AddAcked | AddFailed | ReadAnswered | ReadFailed | FenceAnswered | FenceFailed | LacAnswered
         | LacFailed | LongPollAnswered | LongPollFailed | MetadataWritten | MetadataBadVersion | MetadataRead
         | BookiesChosen)


# -- actions --------------------------------------------------------------------------------
@dataclass(slots=True)
class SendAdd:
    """Add the packaged entry on `bookie`; `recovery` adds are accepted by a fenced bookie.
    Never changed once made, but not frozen like the other actions: a writer makes one per bookie
    per append, and a frozen dataclass's __init__ (object.__setattr__ per field) costs about three
    times as much, a tenth of the client's CPU per entry in a profile of pipelined appends."""
    bookie: int
    entry_id: int
    data: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class SendRead:
    bookie: int
    entry_id: int
    fence: bool = False


@dataclass(frozen=True, slots=True)
class SendFence:
    """Fence the ledger on `bookie` (persisted before the answer) and learn its LAC."""
    bookie: int


@dataclass(frozen=True, slots=True)
class SendReadLac:
    bookie: int


@dataclass(frozen=True, slots=True)
class SendLac:
    """Explicit LAC (fire and forget): lets tailing readers see the last entry of a quiet writer."""
    bookie: int
    lac: int


@dataclass(frozen=True, slots=True)
class SendLongPoll:
    """Answer when the bookie's LAC passes `previous_lac` (with entry `entry_id` if it has it), or at
    the bookie's long-poll timeout with its LAC unchanged."""
    bookie: int
    entry_id: int
    previous_lac: int


@dataclass(frozen=True, slots=True)
class RequestIdle:
    """Send one Idle event once the application has had its turn (it may be starting its next append)."""


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    """Compare-and-set the ledger's metadata: only if the znode is still at `expected_version`."""
    metadata: LedgerMetadata
    expected_version: int


@dataclass(frozen=True, slots=True)
class ReadMetadata:
    pass


@dataclass(frozen=True, slots=True)
class ChooseBookies:
    """Ask placement for `count` bookies outside `exclude` (answer with BookiesChosen)."""
    count: int
    exclude: frozenset[int]


@dataclass(frozen=True, slots=True)
class Acknowledge:
    """These appends are durable (Qa acks from the bookies the metadata records), in entry order."""
    entry_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FailAdds:
    """These appends will never be acknowledged; `error` says whether their outcome is unknown."""
    entry_ids: tuple[int, ...]
    error: LedgerError


@dataclass(frozen=True, slots=True)
class Completed:
    """The operation is done: `result` is the closed metadata, the Entry read, the LAC, ..."""
    result: object


@dataclass(frozen=True, slots=True)
class Failed:
    """The operation gave up."""
    error: LedgerError


Action = (SendAdd | SendRead | SendFence | SendReadLac | SendLac | SendLongPoll | RequestIdle | WriteMetadata
          | ReadMetadata | ChooseBookies | Acknowledge | FailAdds | Completed | Failed)
