"""A ledger world in one process, driven by one seed: simulated bookies, a metadata store, and
clients running the real pure ledger operations (Writer, RecoveryOp, ReadEntryOp, ...).

The metadata store is a MetaRegister (sim/bookies.py) of its own, or, built with
`metastore=` a SimCluster, the simulated metastore itself (sim/ledger_meta.py): the
world then runs on the cluster's scheduler (one clock, one heap, one seed), and
every metadata read and compare-and-set is a ZooKeeper request through Zab.

Every request a client's operation sends travels to a SimBookie and back with
a random delay. Requests and answers can be lost (probability `loss`, or a
`drop` rule), then the client learns BookieUnavailable after `timeout_ms`,
as a real client's request timeout; a request to a crashed bookie fails the
same way. `hold` rules park matching requests (an arbitrarily slow link)
until `release`: stories use them to build exact interleavings ("entry 0
reached only bookie 1"). Metadata requests go through the same rules with
bookie None (with a MetaRegister only: the metastore's faults are the cluster's).
Clients get a Tick every tick_ms and can crash (they stop).

With `journal=True` every bookie keeps a SimJournal (sim/bookie_journal.py): a request's
records are durable only after a group-commit fsync `fsync_ms` (a random latency in that
range) later, the bookie answers only then, and a crash loses the unsynced records (all, or
with `keep_unsynced` a random prefix of them) and the answers waiting for them (their clients
time out), the bookie restarting from what its journal kept. Off, bookies answer at once and a
crash loses nothing, drawing exactly what they drew before.

Oracles: `check_closed_ledger` (every entry acknowledged to any writer is in
the closed ledger, with Qa genuine copies on the bookies the metadata
records, with the payload the writer gave) and a per-client check that no
acknowledgement ever follows a broken (fenced) writer's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bookie import errors as B
from bookie.entry import Digester, DigestType, master_key, password_key
from ledger import actions as A
from ledger.metadata import Fragment, LedgerMetadata
from ledger.quorum import write_quorum
from ledger.read_op import verify_entry
from ledger.recovery_op import RecoveryOp
from ledger.writer import Writer
from sim.bookie_journal import SimJournal
from sim.bookies import MetaRegister, SimBookie
from sim.cluster import SimCluster
from sim.replication_op import BookiesListed, ListBookies
from sim.ledger_meta import ZabMetadata
from sim.scheduler import Scheduler

BOOKIE_REQUESTS = (A.SendAdd, A.SendRead, A.SendFence, A.SendReadLac, A.SendLac, A.SendLongPoll)


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class Msg:
    """A request in flight: `bookie` None for the metadata store."""
    client: str
    bookie: int | None
    action: object


@dataclass
class SimClient:
    name: str
    ledger_id: int
    op: object
    digester: Digester
    key: bytes
    alive: bool = True
    ticking: bool = True      # a tick is scheduled (they stop while it is paused or crashed)
    acked: list[int] = field(default_factory=list)
    acked_at: list[int] = field(default_factory=list)      # the time of each acknowledgement
    done_at: int | None = None
    failed: dict[int, Exception] = field(default_factory=dict)
    payloads: dict[int, bytes] = field(default_factory=dict)
    result: object = None
    error: Exception | None = None
    broken_at: int | None = None      # time of the first FailAdds / Failed
    trace: list[str] = field(default_factory=list)
    requests: list[object] = field(default_factory=list)   # every bookie request its operation sent

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class Rule:
    match: Callable[[Msg], bool]
    kind: str                  # "drop" | "hold"
    held: list[Msg] = field(default_factory=list)


class LedgerWorld:
    """`bookies` SimBookies and the clients of ledgers kept in a MetaRegister, or with
    `metastore`, in that SimCluster's metastore: the world then shares the cluster's
    scheduler and random stream (`seed` is the cluster's), and a metadata request not
    answered within `metadata_timeout_ms` is a ConnectionLoss (sim/ledger_meta.py)."""

    def __init__(self, seed: int = 0, bookies: int = 5, *, min_delay_ms: int = 1, max_delay_ms: int = 5,
                 timeout_ms: int = 40, tick_ms: int = 10, loss: float = 0.0, metastore: SimCluster | None = None,
                 metadata_timeout_ms: int = 2_000, journal: bool = False, fsync_ms: tuple[int, int] = (1, 4),
                 keep_unsynced: bool = True) -> None:
        self.sched = Scheduler(seed) if metastore is None else metastore.sched
        self.rng = self.sched.rng
        self._at = self.sched.bind(self._dispatch)  # _at(t, *event): _dispatch(event) at t
        self.bookies = {i: SimBookie(i, journal=SimJournal(keep_unsynced) if journal else None)
                        for i in range(1, bookies + 1)}
        self.fsync_ms = fsync_ms
        self._waiting: dict[int, list[tuple[int, Msg, A.Event]]] = {}  # bookie -> answers awaiting an fsync
        self.metastore = metastore
        self.meta: MetaRegister | ZabMetadata = (
            MetaRegister() if metastore is None else ZabMetadata(metastore, self, metadata_timeout_ms))
        self.clients: dict[str, SimClient] = {}
        self.rules: list[Rule] = []
        self.min_delay_ms, self.max_delay_ms = min_delay_ms, max_delay_ms
        self.timeout_ms, self.tick_ms, self.loss = timeout_ms, tick_ms, loss
        self._next_ledger = 1
        self.gone: set[int] = set()      # bookies lost for good (lose_bookie)
        self.autorecovery: list = []     # sim.autorecovery.SimAutoRecovery instances running on this world
        self.log: list[str] = []

    # -- setup ------------------------------------------------------------------------------
    def create_ledger(self, ensemble: tuple[int, ...], write_quorum_size: int, ack_quorum_size: int, *,
                      password: bytes = b"secret", digest: DigestType = DigestType.CRC32C) -> LedgerMetadata:
        """A new OPEN ledger on `ensemble`. In the metastore, a create through Zab: the world
        runs until it committed (ZabMetadata.create)."""
        ledger_id = self._next_ledger
        self._next_ledger += 1
        metadata = LedgerMetadata(ledger_id, len(ensemble), write_quorum_size, ack_quorum_size,
                                  (Fragment(0, tuple(ensemble)),), digest, password_key(password, b"check"), 0)
        self.meta.create(metadata)
        return metadata

    def _open(self, name: str, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """What opening the ledger reads; in the metastore, through `name`'s new session."""
        if isinstance(self.meta, ZabMetadata):
            return self.meta.open(name, ledger_id)
        return self.meta.read(ledger_id)

    def _client(self, name: str, ledger_id: int, op: object, password: bytes) -> SimClient:
        metadata, _ = self.meta.read(ledger_id)
        client = SimClient(name, ledger_id, op, Digester(metadata.digest_type, password), master_key(password))
        self.clients[name] = client
        self._at(self.now + self.tick_ms, "tick", name)
        return client

    def writer(self, name: str, ledger_id: int, *, password: bytes = b"secret", writer_cls: type = Writer,
               **kw) -> SimClient:
        metadata, version = self._open(name, ledger_id)
        op = writer_cls(metadata, version, Digester(metadata.digest_type, password), **kw)
        return self._client(name, ledger_id, op, password)

    def recoverer(self, name: str, ledger_id: int, *, password: bytes = b"secret", **kw) -> SimClient:
        metadata, version = self._open(name, ledger_id)
        op = RecoveryOp(metadata, version, Digester(metadata.digest_type, password), **kw)
        client = self._client(name, ledger_id, op, password)
        self._execute(client, op.start())
        return client

    def start_op(self, name: str, ledger_id: int, op: object, *, password: bytes = b"secret") -> SimClient:
        """Any other operation with start()/step() (ReadEntryOp, ReadLacOp, LongPollOp, CloseOp)."""
        client = self._client(name, ledger_id, op, password)
        self._execute(client, op.start())
        return client

    # -- the application's calls on a writer ------------------------------------------------------
    def append(self, name: str, payload: bytes) -> int:
        client = self.clients[name]
        entry_id, actions = client.op.append(payload)
        client.payloads[entry_id] = payload
        self._execute(client, actions)
        return entry_id

    def close(self, name: str) -> None:
        client = self.clients[name]
        self._execute(client, client.op.close())

    # -- faults ---------------------------------------------------------------------------------------
    def drop(self, match: Callable[[Msg], bool]) -> Rule:
        rule = Rule(match, "drop")
        self.rules.append(rule)
        return rule

    def hold(self, match: Callable[[Msg], bool]) -> Rule:
        rule = Rule(match, "hold")
        self.rules.append(rule)
        return rule

    def release(self, rule: Rule) -> None:
        """Remove the rule; held requests now travel (in the order they were sent)."""
        self.rules.remove(rule)
        for msg in rule.held:
            self._travel(msg)
        rule.held.clear()

    def crash_bookie(self, bookie: int) -> None:
        self._note(f"crash bookie {bookie}")
        b = self.bookies[bookie]
        b.alive = False
        if b.journal is not None:  # unsynced records lost (a random prefix may survive); replayed
            b.journal.crash(self.rng)
            b.recover()
            for _, msg, _ in self._waiting.pop(bookie, []):
                self._fail_later(msg, "crashed before its fsync")

    def lose_bookie(self, bookie: int) -> None:
        """The bookie is gone for good: crashed, its disk wiped, never restarted (`gone`)."""
        self.crash_bookie(bookie)
        self.bookies[bookie].wipe()
        self.gone.add(bookie)

    def restart_bookie(self, bookie: int) -> None:
        self._note(f"restart bookie {bookie}")
        self.bookies[bookie].alive = True

    def crash_client(self, name: str) -> None:
        self._note(f"crash client {name}")
        self.clients[name].alive = False

    def pause_client(self, name: str) -> None:
        """As SIGSTOP: the client handles nothing until resumed, and answers meanwhile are lost."""
        self._note(f"pause client {name}")
        self.clients[name].alive = False

    def resume_client(self, name: str) -> None:
        self._note(f"resume client {name}")
        client = self.clients[name]
        client.alive = True
        if not client.ticking:  # its ticks stopped while it was paused
            client.ticking = True
            self._at(self.now + self.tick_ms, "tick", name)

    # -- scheduling -----------------------------------------------------------------------------------
    @property
    def now(self) -> int:
        """Simulated milliseconds (the scheduler's clock, shared with a metastore cluster)."""
        return self.sched.now

    def _delay(self) -> int:
        return self.rng.randint(self.min_delay_ms, self.max_delay_ms)

    def _note(self, text: str) -> None:
        self.log.append(f"[{self.now:6d}] {text}")

    def run(self, ms: int) -> None:
        self.run_until(lambda: False, ms)

    def run_until(self, predicate: Callable[[], bool], timeout_ms: int = 10_000) -> bool:
        """Run the scheduler (with a metastore cluster: both worlds) until `predicate()` holds
        (True) or `timeout_ms` simulated ms pass (False)."""
        return self.sched.run_until(predicate, timeout_ms)

    def _dispatch(self, event: tuple) -> None:
        kind = event[0]
        if kind == "tick":
            client = self.clients[event[1]]
            if client.alive and not client.done:
                self._step(client, A.Tick())
                self._at(self.now + self.tick_ms, "tick", client.name)
            else:
                client.ticking = False
        elif kind == "arrive":
            self._arrive(event[1])
        elif kind == "fsync":
            self._synced(self.bookies[event[1]], event[2])
        elif kind == "answer":
            client = self.clients[event[1]]
            if client.alive:
                self._step(client, event[2])

    # -- executing actions ------------------------------------------------------------------------------
    def _step(self, client: SimClient, event: A.Event) -> None:
        self._execute(client, client.op.step(event))

    def _execute(self, client: SimClient, actions: list) -> None:
        for action in actions:
            if isinstance(action, BOOKIE_REQUESTS):
                client.requests.append(action)
                self._send(Msg(client.name, action.bookie, action))
            elif isinstance(action, (A.WriteMetadata, A.ReadMetadata)):
                if isinstance(self.meta, ZabMetadata):
                    self.meta.request(client, action)
                else:
                    self._send(Msg(client.name, None, action))
            elif isinstance(action, A.ChooseBookies):
                live = sorted(b for b, bk in self.bookies.items() if bk.alive and b not in action.exclude)
                chosen = tuple(self.rng.sample(live, min(action.count, len(live))))
                self._at(self.now + 1, "answer", client.name, A.BookiesChosen(chosen))
            elif isinstance(action, ListBookies):  # the replication worker's list_bookies: the live ones
                live = tuple(sorted(b for b, bk in self.bookies.items() if bk.alive))
                self._at(self.now + self._delay(), "answer", client.name, BookiesListed(live))
            elif isinstance(action, A.RequestIdle):
                self._at(self.now, "answer", client.name, A.Idle())  # after whatever is due now
            else:
                self._record(client, action)

    def _record(self, client: SimClient, action: object) -> None:
        client.trace.append(f"{self.now}: {action!r}"[:200])
        if isinstance(action, A.Acknowledge):
            if client.broken_at is not None:
                raise InvariantViolation(f"{client.name} acknowledged {action.entry_ids} after it broke")
            assert list(action.entry_ids) == list(range(len(client.acked), len(client.acked) + len(action.entry_ids)))
            client.acked += action.entry_ids
            client.acked_at += [self.now] * len(action.entry_ids)
        elif isinstance(action, A.FailAdds):
            client.failed.update({e: action.error for e in action.entry_ids})
            client.broken_at = self.now if client.broken_at is None else client.broken_at
        elif isinstance(action, A.Completed):
            client.result, client.done_at = action.result, self.now
        elif isinstance(action, A.Failed):
            client.error = action.error
            client.broken_at = self.now if client.broken_at is None else client.broken_at
        else:
            raise TypeError(f"unknown action {action!r}")

    def _send(self, msg: Msg) -> None:
        for rule in self.rules:
            if rule.match(msg):
                if rule.kind == "hold":
                    rule.held.append(msg)
                else:
                    self._fail_later(msg, "dropped")
                return
        self._travel(msg)

    def _travel(self, msg: Msg) -> None:
        if self.loss and msg.bookie is not None and self.rng.random() < self.loss:
            self._fail_later(msg, "request lost")
            return
        self._at(self.now + self._delay(), "arrive", msg)

    def _fail_later(self, msg: Msg, why: str) -> None:
        if isinstance(msg.action, A.SendLac):
            return  # fire and forget
        if msg.bookie is None:
            self._at(self.now + self.timeout_ms, "answer", msg.client, A.MetadataBadVersion())
            return
        self._at(self.now + self.timeout_ms, "answer", msg.client,
                 failure(msg.action, B.BookieUnavailable(f"bookie {msg.bookie}: {why}")))

    def _arrive(self, msg: Msg) -> None:
        client = self.clients[msg.client]
        if msg.bookie is None:
            self._at(self.now + self._delay(), "answer", msg.client, self._metadata(client, msg.action))
            return
        bookie = self.bookies[msg.bookie]
        if not bookie.alive:
            self._fail_later(msg, "down")
            return
        answer = serve(bookie, client, msg.action)
        journal = bookie.journal
        if journal is not None:
            self._sync(bookie)
            if bookie.wait_for > journal.durable_seq:  # answered once its records are durable
                if answer is not None:
                    self._waiting.setdefault(bookie.id, []).append((bookie.wait_for, msg, answer))
                return
        if answer is not None:
            self._reply(msg, answer)

    def _sync(self, bookie: SimBookie) -> None:
        """Start the bookie's next group commit if records are queued and none is in flight."""
        if bookie.journal.needs_sync():
            generation = bookie.journal.begin_sync()
            self._at(self.now + self.rng.randint(*self.fsync_ms), "fsync", bookie.id, generation)

    def _synced(self, bookie: SimBookie, generation: int) -> None:
        """A group commit finished (unless a crash came first): store its adds, send the answers
        it held back (in the order the requests arrived), start the next one."""
        adds = bookie.journal.end_sync(generation)
        if adds is None:
            return
        bookie.synced(adds)
        waiting = self._waiting.get(bookie.id, [])
        ready = [w for w in waiting if w[0] <= bookie.journal.durable_seq]
        self._waiting[bookie.id] = [w for w in waiting if w[0] > bookie.journal.durable_seq]
        for _, msg, answer in ready:
            self._reply(msg, answer)
        self._sync(bookie)

    def _reply(self, msg: Msg, answer: A.Event) -> None:
        if self.loss and self.rng.random() < self.loss:
            self._fail_later(msg, "answer lost")  # the bookie did it; the client cannot know
            return
        self._at(self.now + self._delay(), "answer", msg.client, answer)

    def _metadata(self, client: SimClient, action: object) -> A.Event:
        if isinstance(action, A.ReadMetadata):
            return A.MetadataRead(*self.meta.read(client.ledger_id))
        version = self.meta.cas(action.metadata, action.expected_version)
        self._note(f"{client.name} CAS v{action.expected_version} -> {version} {action.metadata.state.value}")
        return A.MetadataBadVersion() if version is None else A.MetadataWritten(version)

    # -- oracles ----------------------------------------------------------------------------------------
    def acknowledged_by(self, writer: str, time: int) -> int:
        """The last entry `writer` had acknowledged to its application at `time` (NO_ENTRY if none)."""
        w = self.clients[writer]
        count = sum(1 for t in w.acked_at if t <= time)
        return w.acked[count - 1] if count else -1

    def check_closed_ledger(self, ledger_id: int) -> LedgerMetadata:
        """Every acknowledged entry is in the closed ledger, on Qa recorded bookies, with its payload."""
        metadata, _ = self.meta.read(ledger_id)
        if not metadata.is_closed:
            raise InvariantViolation(f"ledger {ledger_id} is {metadata.state.value}, not CLOSED")
        writers = [c for c in self.clients.values() if c.ledger_id == ledger_id and isinstance(c.op, Writer)]
        for w in writers:
            if w.acked and w.acked[-1] > metadata.last_entry:
                raise InvariantViolation(f"{w.name} acknowledged up to {w.acked[-1]} but the ledger closed at "
                                         f"{metadata.last_entry}")
        payloads = {e: p for w in writers for e, p in w.payloads.items()}
        digester = writers[0].digester if writers else None
        for entry_id in range(metadata.last_entry + 1):
            quorum = write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum)
            copies = 0
            for b in quorum:
                data = self.bookies[b].has(ledger_id, entry_id)
                if data is None or digester is None:
                    copies += data is not None
                    continue
                entry = verify_entry(digester, ledger_id, entry_id, data)
                if entry is None or (entry_id in payloads and entry.payload != payloads[entry_id]):
                    raise InvariantViolation(f"entry {entry_id} on bookie {b} is not what the writer appended")
                copies += 1
            if copies < metadata.ack_quorum:
                raise InvariantViolation(f"entry {entry_id} has {copies} copies on its recorded write quorum "
                                         f"{quorum}, fewer than Qa={metadata.ack_quorum}")
        return metadata


def serve(bookie: SimBookie, client: SimClient, action: object) -> A.Event | None:
    """What a bookie answers to one request (None: no answer expected)."""
    lid, key = client.ledger_id, client.key
    try:
        match action:
            case A.SendAdd(b, entry_id, data, recovery):
                bookie.add(lid, entry_id, data, key, recovery)
                return A.AddAcked(b, entry_id)
            case A.SendRead(b, entry_id, fence):
                return A.ReadAnswered(b, entry_id, bookie.read(lid, entry_id, fence, key))
            case A.SendFence(b):
                return A.FenceAnswered(b, bookie.fence(lid, key))
            case A.SendReadLac(b):
                return A.LacAnswered(b, bookie.read_lac(lid))
            case A.SendLac(b, lac):
                bookie.write_lac(lid, lac, key)
                return None
            case A.SendLongPoll(b, entry_id, _):
                return A.LongPollAnswered(b, *bookie.long_poll(lid, entry_id))
    except B.BookieError as e:
        return None if isinstance(action, A.SendLac) else failure(action, e)
    raise TypeError(f"not a bookie request: {action!r}")


def failure(action: object, error: B.BookieError) -> A.Event:
    match action:
        case A.SendAdd(b, entry_id, _, _):
            return A.AddFailed(b, entry_id, error)
        case A.SendRead(b, entry_id, _):
            return A.ReadFailed(b, entry_id, error)
        case A.SendFence(b):
            return A.FenceFailed(b, error)
        case A.SendReadLac(b):
            return A.LacFailed(b, error)
        case A.SendLongPoll(b, _, _):
            return A.LongPollFailed(b, error)
    raise TypeError(f"no failure event for {action!r}")
