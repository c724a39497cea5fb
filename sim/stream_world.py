"""Named logs on simulated bookies: stream/ownership.py's protocol run by competing owners.

A `StreamStory` is one log written by owners that take it over one after another or at the same
time (a contender does not wait for the last owner to die: that is what a lock whose holder was
paused past its session looks like), while owners crash or pause and bookies crash and restart.
Each owner runs the real protocol generators (take_over, roll, complete) against a
LedgerWorld: its ledgers are written by the real ledger Writer, recovered by the real
RecoveryOp and read by ReadEntryOp, on SimBookies; the log's segment list is a versioned
register whose compare-and-set is the metastore multi's (every change sets the log znode at the
version it was read at). Record sets are the real encoding (stream/record_set.py).

Checked after every simulated millisecond (`StreamWorld.check`), on what a reader can see (every
completed segment's records, then the in-progress segment's up to what its writer had
acknowledged, since no LAC a reader learns is past that):
- it only ever grows: each view is a prefix of the next, so no reader sees a record twice, out of
  order, or one that later disappears;
- transaction ids strictly increase along it;
- segments belong to owners in the order of their epochs: after an owner's first segment, no
  record of an earlier owner becomes visible (a deposed owner adds nothing after its successor's
  recovery).
After the story (bookies back, the network healed, paused owners resumed), a last owner takes
over and closes the log; then every record acknowledged to any owner is visible exactly once,
at the position it was acknowledged at, and every segment's ledger holds what its writer wrote
(LedgerWorld.check_closed_ledger).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from bookie.entry import Digester, DigestType
from ledger.errors import LedgerError
from ledger.read_op import ReadEntryOp
from sim.ledger_world import InvariantViolation, LedgerWorld
from stream import ownership as O
from stream.errors import StreamError
from stream.log_metadata import LogMetadata, LogSettings
from stream.position import Position
from stream.record_set import RecordSetBuilder, decode
from stream.segment_list import SegmentList

LOG = "orders"
FAULT_WINDOW_MS = 300
META_DELAY_MS = (1, 6)      # a metastore round trip
WRITE_EVERY_MS = 3          # an owner appends a record set this often while it may
MAX_IN_FLIGHT = 3
PASSWORD = b"quire-stream:orders"


@dataclass(frozen=True)
class StreamStory:
    """Everything a run depends on; its repr replays it."""
    seed: int
    bookies: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    roll_entries: int                                  # an owner rolls after this many entries
    owners: tuple[tuple[int, int], ...]                # (start ms, records it writes); the first starts at 0
    owner_faults: tuple[tuple[int, str, int, int], ...]  # (ms, "crash" | "pause", owner index, pause ms)
    bookie_faults: tuple[tuple[int, str, int], ...]    # (ms, "crash" | "restart", bookie)
    loss: float = 0.0


def story_from_seed(seed: int) -> StreamStory:
    """A story determined by one integer, of the shape tests/test_stream_sim.py draws."""
    rng = random.Random(seed)
    e = rng.randint(1, 3)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    bookies = e + rng.randint(0, 2)
    owners = ((0, rng.randint(5, 60)),) + tuple(
        (rng.randint(1, FAULT_WINDOW_MS), rng.randint(0, 60)) for _ in range(rng.randint(0, 3)))
    owner_faults = tuple(sorted((rng.randint(0, FAULT_WINDOW_MS), rng.choice(("crash", "pause")),
                                 rng.randrange(len(owners)), rng.randint(5, 150)) for _ in range(rng.randint(0, 3))))
    bookie_faults = tuple(sorted((rng.randint(0, FAULT_WINDOW_MS), rng.choice(("crash", "restart")),
                                  rng.randint(1, bookies)) for _ in range(rng.randint(0, 3))))
    return StreamStory(seed, bookies, e, qw, qa, rng.randint(1, 6), owners, owner_faults, bookie_faults,
                       rng.choice((0.0, 0.0, 0.05)))


@dataclass
class _Pending:
    """An action of an owner's protocol being executed: its result is sent once `ready()`."""
    action: O.Action
    ready_at: int = 0
    client: str | None = None            # the ledger client it waits for, if any
    reads: list[str] = field(default_factory=list)  # ReadEntryOp clients (a recovery's head and tail)
    result: Any = None


class SimOwner:
    """One would-be owner: runs the protocol, then appends record sets while it owns the log."""

    def __init__(self, world: StreamWorld, index: int, records: int) -> None:
        self.world, self.index, self.name = world, index, f"o{index}"
        self.quota = records
        self.state = "taking_over"      # -> writing -> rolling -> writing ... -> completing -> done | fenced | failed
        self.protocol: Generator | None = world.take_over(LOG)
        self.pending: _Pending | None = None
        self.send: Any = None           # the next value for the protocol
        self.throw: BaseException | None = None
        self.owned: O.Owned | None = None
        self.tally = O.SegmentTally()
        self.client: str | None = None  # the ledger client of our segment
        self.next_txid = 0
        self.written = 0
        self.in_flight: list[tuple[int, list[int], list[bytes]]] = []  # (entry id, txids, payloads)
        self.acked: list[tuple[Position, int, bytes]] = []
        self.paused_until = -1
        self.crashed = False
        self.error: BaseException | None = None
        self._clients: list[str] = []
        self._last_write = -WRITE_EVERY_MS

    @property
    def alive(self) -> bool:
        return not self.crashed and self.world.now >= self.paused_until

    def step(self) -> None:
        if not self.alive or self.state in ("done", "fenced", "failed"):
            return
        if self.state == "writing":
            self._collect_acks()
        if self.protocol is not None:
            self._advance()
        elif self.state == "writing":
            self._write()

    # -- the protocol ------------------------------------------------------------------------------
    def _advance(self) -> None:
        while self.protocol is not None:
            if self.pending is not None:
                if not self._ready(self.pending):
                    return
                self.send, self.pending = self.pending.result, None
            try:
                if self.throw is not None:
                    error, self.throw = self.throw, None
                    action = self.protocol.throw(error)
                else:
                    action = self.protocol.send(self.send)
            except StopIteration as done:
                self.protocol = None
                self._finished(done.value)
                return
            except (StreamError, LedgerError) as e:
                self.protocol = None
                self.state, self.error = ("fenced" if self.owned is not None else "failed"), e
                self.world.note(f"{self.name} {self.state}: {e}")
                return
            self.send = None
            self.pending = self._start(action)

    def _finished(self, value: Any) -> None:
        if isinstance(value, O.Owned):
            self.owned, self.tally = value, O.SegmentTally()
            self.client = self._client_for(value.segment.ledger_id)
            self.world.writer_of[value.segment.ledger_id] = self.name
            self.world.epoch_of[self.name] = value.listing.log.epoch
            self.state = "writing"
            self.world.note(f"{self.name} owns segment {value.segment.seq} (ledger {value.segment.ledger_id}, "
                            f"epoch {value.listing.log.epoch})")
        else:  # complete: the log is closed
            self.state = "done"
            self.world.note(f"{self.name} closed the log")

    def _client_for(self, ledger_id: int) -> str:
        name = f"{self.name}/w{ledger_id}"
        self.world.ledgers.writer(name, ledger_id, password=PASSWORD)
        self._clients.append(name)
        return name

    def _start(self, action: O.Action) -> _Pending:
        w, now = self.world, self.world.now
        delay = w.rng.randint(*META_DELAY_MS)
        if isinstance(action, O.Now):
            return _Pending(action, now, result=now)
        if isinstance(action, (O.ReadList, O.ApplyChange, O.DeleteLedger)):
            return _Pending(action, now + delay)  # executed when it arrives (`_ready`)
        if isinstance(action, O.CreateLedger):
            return _Pending(action, now + delay)
        if isinstance(action, O.CloseLedger):
            assert self.client is not None
            w.ledgers.close(self.client)
            return _Pending(action, now, client=self.client)
        assert isinstance(action, O.RecoverSegment)
        name = f"{self.name}/r{action.segment.ledger_id}"
        w.ledgers.recoverer(name, action.segment.ledger_id, password=PASSWORD)
        self._clients.append(name)
        return _Pending(action, now, client=name)

    def _ready(self, p: _Pending) -> bool:
        w = self.world
        if w.now < p.ready_at:
            return False
        a = p.action
        if isinstance(a, O.Now):
            pass
        elif isinstance(a, O.ReadList):
            p.result = w.listing
        elif isinstance(a, O.ApplyChange):
            p.result = w.apply(self.name, a.before, a.after)
        elif isinstance(a, O.DeleteLedger):
            w.deleted.add(a.ledger_id)
        elif isinstance(a, O.CreateLedger):
            live = sorted(b for b, bk in w.ledgers.bookies.items() if bk.alive)
            if len(live) < w.story.ensemble:
                p.ready_at = w.now + 5  # not enough bookies: the real client retries too
                return False
            ensemble = tuple(w.rng.sample(live, w.story.ensemble))
            p.result = w.ledgers.create_ledger(ensemble, w.story.write_quorum, w.story.ack_quorum,
                                               password=PASSWORD, digest=DigestType.CRC32C).ledger_id
            w.writer_of[p.result] = self.name
        elif isinstance(a, O.CloseLedger):
            client = w.ledgers.clients[p.client]
            if not client.done:
                return False
            if client.error is not None:
                self.throw = client.error
            else:
                p.result = client.result.last_entry
        else:
            assert isinstance(a, O.RecoverSegment)
            return self._recovered(p)
        return True

    def _recovered(self, p: _Pending) -> bool:
        """A recovery, then the reads of its first and last entries."""
        w = self.world
        client = w.ledgers.clients[p.client]
        if not client.done:
            return False
        if client.error is not None:
            self.throw = client.error
            return True
        metadata = client.result
        if metadata.last_entry < 0:
            p.result = O.RecoveredTail(-1, None, None)
            return True
        if not p.reads:
            for entry_id in sorted({0, metadata.last_entry}):
                name = f"{self.name}/read{metadata.ledger_id}.{entry_id}"
                w.ledgers.start_op(name, metadata.ledger_id, ReadEntryOp(metadata, entry_id, w.digester),
                                   password=PASSWORD)
                self._clients.append(name)
                p.reads.append(name)
        reads = [w.ledgers.clients[name] for name in p.reads]
        if not all(r.done for r in reads):
            return False
        failed = next((r.error for r in reads if r.error is not None), None)
        if failed is not None:
            self.throw = failed
            return True
        head, tail = decode(reads[0].result.payload), decode(reads[-1].result.payload)
        p.result = O.RecoveredTail(metadata.last_entry, head, tail)
        return True

    # -- writing -----------------------------------------------------------------------------------
    def _collect_acks(self) -> None:
        client = self.world.ledgers.clients[self.client]
        if client.failed or client.broken_at is not None:
            self.state, self.error = "fenced", next(iter(client.failed.values()), client.error)
            self.world.note(f"{self.name} fenced at an append: {self.error}")
            return
        acked = set(client.acked)
        while self.in_flight and self.in_flight[0][0] in acked:
            entry_id, txids, payloads = self.in_flight.pop(0)
            for slot, (txid, payload) in enumerate(zip(txids, payloads)):
                self.acked.append((Position(self.owned.segment.seq, entry_id, slot), txid, payload))
        if not self.in_flight and (self.written >= self.quota or
                                   (self.tally.records and len(client.acked) >= self.world.story.roll_entries)):
            self.state = "completing" if self.written >= self.quota else "rolling"
            self.protocol = (O.complete if self.state == "completing" else O.roll)(LOG, self.owned, self.tally)
            self.send = None

    def _write(self) -> None:
        w = self.world
        if (self.written >= self.quota or len(self.in_flight) >= MAX_IN_FLIGHT
                or w.now - self._last_write < WRITE_EVERY_MS):
            return
        self._last_write = w.now
        if not self.tally.records:
            self.next_txid = max(self.next_txid, self.owned.listing.last_txid + 1)
        builder = RecordSetBuilder(1 << 16, self.next_txid - 1)
        for _ in range(min(w.rng.randint(1, 3), self.quota - self.written)):
            builder.add(self.next_txid, b"%s:%d" % (self.name.encode(), self.next_txid))
            self.next_txid += 1
            self.written += 1
        data = builder.encode(self.tally.records, self.tally.bytes)
        entry_id = w.ledgers.append(self.client, data)
        self.tally.sealed(builder.first_txid, builder.last_txid, builder.count, builder.payload_bytes)
        record_set = decode(data)
        self.in_flight.append((entry_id, record_set.txids, record_set.payloads))

    # -- faults --------------------------------------------------------------------------------------
    def crash(self) -> None:
        self.crashed = True
        for name in self._clients:
            self.world.ledgers.crash_client(name)

    def pause(self, ms: int) -> None:
        self.paused_until = self.world.now + ms
        for name in self._clients:
            self.world.ledgers.pause_client(name)

    def resume(self) -> None:
        self.paused_until = -1
        if not self.crashed:
            for name in self._clients:
                self.world.ledgers.resume_client(name)


class StreamWorld:
    """A LedgerWorld, the log's segment list in a versioned register, and the owners of the story."""

    def __init__(self, story: StreamStory, take_over: Callable[[str], O.Protocol] = O.take_over) -> None:
        """`take_over`: the protocol an owner runs to take the log over (a test passes a broken one
        to see the oracles catch it)."""
        self.story = story
        self.take_over = take_over
        self.ledgers = LedgerWorld(seed=story.seed, bookies=story.bookies, loss=story.loss)
        self.rng = self.ledgers.rng
        self.digester = Digester(DigestType.CRC32C, PASSWORD)
        settings = LogSettings(ensemble=story.ensemble, write_quorum=story.write_quorum,
                               ack_quorum=story.ack_quorum)
        self.listing = SegmentList(LogMetadata(0, settings), 0)
        self.owners: list[SimOwner] = []
        self.writer_of: dict[int, str] = {}     # ledger id -> the owner that created it
        self.epoch_of: dict[str, int] = {}      # owner -> the epoch it took over at
        self.deleted: set[int] = set()
        self.visible: list[tuple[Position, int, bytes]] = []
        self._entries: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        self._records_before: dict[tuple[int, int], int] = {}

    @property
    def now(self) -> int:
        return self.ledgers.now

    def note(self, text: str) -> None:
        self.ledgers.log.append(f"[{self.now:6d}] {text}")

    def apply(self, owner: str, before: SegmentList, after: SegmentList) -> SegmentList | None:
        """The multi's compare-and-set: applied only if the list is still at the version read."""
        if before.log_version != self.listing.log_version:
            self.note(f"{owner} CAS v{before.log_version} refused (list at v{self.listing.log_version})")
            return None
        for segment in after.segments:
            if segment.ledger_id in self.deleted:
                raise InvariantViolation(f"{owner} put deleted ledger {segment.ledger_id} in the list")
        self.listing = before.applied(before.change_to(after))
        self.note(f"{owner} CAS v{before.log_version} -> {self.listing.log_version}: "
                  + " ".join(f"{s.seq}:{s.ledger_id}:{s.state.value[0]}{s.last_entry}" for s in self.listing.segments))
        return self.listing

    # -- running -------------------------------------------------------------------------------------
    def run(self) -> None:
        story = self.story
        starts = dict(enumerate(story.owners))
        for ms in range(FAULT_WINDOW_MS + 1):
            for index, (start, records) in starts.items():
                if start == ms:
                    self.owners.append(SimOwner(self, index, records))
            for when, kind, index, pause_ms in story.owner_faults:
                if when == ms and index < len(self.owners):
                    owner = self.owners[index]
                    (owner.crash() if kind == "crash" else owner.pause(pause_ms))
                    self.note(f"{kind} owner {owner.name}")
            for when, kind, bookie in story.bookie_faults:
                if when == ms:
                    (self.ledgers.crash_bookie if kind == "crash" else self.ledgers.restart_bookie)(bookie)
            self.tick()
        # heal: bookies back, the network whole, paused owners resumed; they finish what they can
        self.ledgers.loss = 0.0
        for b in self.ledgers.bookies:
            self.ledgers.restart_bookie(b)
        for owner in self.owners:
            owner.resume()
        for _ in range(2_000):
            self.tick()
            if all(o.state in ("done", "fenced", "failed") or o.crashed for o in self.owners):
                break
        # a last owner takes over and closes the log
        last = SimOwner(self, len(self.owners), 0)
        self.owners.append(last)
        for _ in range(5_000):
            self.tick()
            if last.state in ("done", "fenced", "failed"):
                break
        if last.state != "done":
            raise InvariantViolation(f"the last owner could not close the log: {last.state} {last.error}")
        self.check_final()

    def tick(self) -> None:
        for owner in self.owners:
            if owner.paused_until >= 0 and self.now >= owner.paused_until:
                owner.resume()
            owner.step()
        self.ledgers.run(1)
        self.check()

    # -- oracles -------------------------------------------------------------------------------------
    def _records(self, ledger_id: int, entry_id: int) -> list[tuple[int, bytes]]:
        key = (ledger_id, entry_id)
        if key not in self._entries:
            writer = next(c for c in self.ledgers.clients.values()
                          if c.ledger_id == ledger_id and entry_id in c.payloads)
            record_set = decode(writer.payloads[entry_id])
            self._entries[key] = list(zip(record_set.txids, record_set.payloads))
            self._records_before[key] = record_set.records_before
        return self._entries[key]

    def _before(self, ledger_id: int, entry_id: int) -> int:
        self._records(ledger_id, entry_id)
        return self._records_before[(ledger_id, entry_id)]

    def readable(self) -> list[tuple[Position, int, bytes]]:
        """What a reader can see now (see the module docstring)."""
        out = []
        for segment in self.listing.segments:
            if segment.completed:
                last = segment.last_entry
            else:
                writer = self.ledgers.clients.get(f"{self.writer_of[segment.ledger_id]}/w{segment.ledger_id}")
                last = writer.acked[-1] if writer is not None and writer.acked else -1
            count = 0
            for entry_id in range(last + 1):
                if self._before(segment.ledger_id, entry_id) != count:
                    raise InvariantViolation(f"entry {entry_id} of segment {segment.seq} says {count} records "
                                             "are not before it")
                for slot, (txid, payload) in enumerate(self._records(segment.ledger_id, entry_id)):
                    out.append((Position(segment.seq, entry_id, slot), txid, payload))
                    count += 1
            if segment.completed and count != segment.records:
                raise InvariantViolation(f"segment {segment.seq} records {segment.records} records, holds {count}")
        return out

    def check(self) -> None:
        now = self.readable()
        if now[:len(self.visible)] != self.visible:
            raise InvariantViolation(f"what readers see changed: {self.visible[-3:]} then {now[:len(self.visible)][-3:]}")
        txids = [txid for _, txid, _ in now]
        if any(b <= a for a, b in zip(txids, txids[1:])):
            raise InvariantViolation(f"transaction ids do not increase: {txids}")
        epochs = [self.epoch_of.get(self.writer_of[s.ledger_id], -1) for s in self.listing.segments]
        if any(b < a for a, b in zip(epochs, epochs[1:])):
            raise InvariantViolation(f"segments of an earlier owner after a later one's: epochs {epochs}")
        for position, _, payload in now:
            owner = self.writer_of[self.listing.segment(position.segment).ledger_id]
            if not payload.startswith(owner.encode() + b":"):
                raise InvariantViolation(f"record {payload!r} at {position} is not its segment owner {owner}'s")
        self.visible = now

    def check_final(self) -> None:
        if any(not s.completed for s in self.listing.segments):
            raise InvariantViolation("a closed log has a segment in progress")
        seen = {(p, txid, payload) for p, txid, payload in self.visible}
        if len(seen) != len(self.visible):
            raise InvariantViolation("a record is visible twice")
        for owner in self.owners:
            for record in owner.acked:
                if record not in seen:
                    raise InvariantViolation(f"{owner.name}'s acknowledged record {record} is not visible")
        for segment in self.listing.segments:
            self.ledgers.check_closed_ledger(segment.ledger_id)
