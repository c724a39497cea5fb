"""Ledger metadata kept in the simulated metastore: the ledger world's requests as ZooKeeper
requests through Zab (sim.cluster.SimCluster), answered as the real SDK answers them.

The znode and its bytes are the real ones: ledger `n`'s metadata is
`ledger.metadata.encode` at `ledger.metadata.ledger_path(LEDGER_ROOT, n)`, the
hierarchical layout ledger/manager.py uses. What each request of a ledger operation
becomes mirrors ledger/driver.py (`OpDriver._metadata`) over ledger/manager.py:

* ReadMetadata: a getData on the node the client's session is connected to, served at once
  from what that node has applied. ZooKeeper serves reads locally, so the answer may be
  stale, but never older than what the session has already seen (a server behind the
  client's lastZxidSeen does not take its connection). A session whose node is down or not
  in BROADCAST (a server that lost its leader drops its clients) gets ConnectionLoss; the
  real driver then reads again for as long as the operation lives, backing off from
  METADATA_RETRY_S to METADATA_RETRY_MAX_S (stamina); the model reads again every
  METADATA_RETRY_MS, through whichever node the session reconnects to: a faster retry than
  the driver's, which explores more interleavings.
* WriteMetadata: a setData with the expected version, submitted through Zab. Acknowledged:
  MetadataWritten(new version). Refused with BadVersion: MetadataBadVersion at once (the
  manager's MetadataConflict). Refused with NoNode: the ledger vanished, which cannot happen
  here (nothing deletes a ledger): an InvariantViolation.
* ConnectionLoss and unknown outcomes. A write whose node fails it (no leader), whose node
  crashes or changes role while it is in flight, or which is not answered within
  `timeout_ms` (the session's read timeout) reaches the real driver as a MetastoreError.
  The driver does not retry a write: after its METADATA_RETRY_S sleep it answers
  MetadataBadVersion ("outcome unknown: the operation re-reads"). The model does exactly
  that, and it does not withdraw the request: a write that was in flight may still commit
  later, as on a real ensemble. That is sound only because MetadataBadVersion never claims
  the CAS failed: every operation takes it as "lost or unknown" and decides on what it
  re-reads (Writer: "our CAS landed; only its answer was lost"; CloseOp: CLOSED at our last
  entry is success; RecoveryOp: IN_RECOVERY or CLOSED is adopted). A re-read may still
  miss a write that commits after it (a stale read, or a commit still to come): the
  operation then CASes again on the version it read, and Zab lets at most one CAS per
  version win. The sweep runs exactly these races.
* Ledger creation (`create`): the real manager creates the parent znodes (ensure_path) and
  the ledger znode (a one-op multi; here a plain create, which makes the same tree). The
  world picks the id (the manager's id-generator znode is not simulated) and runs until the
  create commits; after an unknown outcome it tries again, and NodeExists then means its
  own earlier create landed.

Opening a ledger (LedgerWorld.writer, .recoverer) reads on a serving node picked at random,
where the client's session starts. Sessions: each ledger client is connected to one node at a
time (a new one, at random, after a ConnectionLoss), and its requests go under that node's
default session (sim.cluster gives one per node), so the leader never sees a session move;
per-client sessions, expiry and watches are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger import actions as A
from ledger.metadata import LedgerMetadata, decode, encode, ledger_path
from metastore.core.acl import OPEN_ACL_UNSAFE
from metastore.wire import jute
from metastore.wire import jute_records as J
from metastore.wire.jute_defs import OpCode, Perms
from replay.invariants import InvariantViolation
from sim.client_ops import ClientOp, client_request
from sim.cluster import SimCluster
from zab.core.actions import Phase

if TYPE_CHECKING:
    from sim.ledger_world import LedgerWorld, SimClient

# ledger/manager.py's DEFAULT_ROOT and LEDGER_ACL (sim/ never imports the manager: it runs on
# MetaClient, an edge); tests/test_sim_mixed.py checks that they stay equal.
LEDGER_ROOT = "/quire/ledgers"
LEDGER_ACL = (J.ACL(int(Perms.READ | Perms.WRITE | Perms.CREATE | Perms.DELETE), J.Id("world", "anyone")),)
METADATA_RETRY_MS = 50  # ledger/driver.py's METADATA_RETRY_S
CREATE_ATTEMPTS = 20


@dataclass
class Session:
    """A ledger client's connection to the metastore: the node it talks to (None: to be
    chosen) and the highest zxid it has seen (ZooKeeper's lastZxidSeen)."""
    node: int | None = None
    seen_zxid: int = 0


class ZabMetadata:
    """The ledger world's metadata store in `cluster`'s metastore (module docstring)."""

    def __init__(self, cluster: SimCluster, world: LedgerWorld, timeout_ms: int) -> None:
        self.cluster, self.world, self.timeout_ms = cluster, world, timeout_ms
        self.sessions: dict[str, Session] = {}
        self.writes: list[ClientOp] = []     # every CAS submitted, whatever became of it
        self.connection_losses = 0
        self._in_flight: dict[int, tuple[str, A.WriteMetadata]] = {}  # cxid -> waiting client
        self._setup = Session()

    # -- nodes and sessions ------------------------------------------------------------------------
    def _serves(self, node: int, seen_zxid: int) -> bool:
        peer = self.cluster.nodes[node].peer
        return peer is not None and peer.phase is Phase.BROADCAST and peer.last_committed >= seen_zxid

    def _connect(self, session: Session) -> int | None:
        if session.node is not None and self._serves(session.node, session.seen_zxid):
            return session.node
        serving = [i for i in sorted(self.cluster.nodes) if self._serves(i, session.seen_zxid)]
        session.node = self.world.rng.choice(serving) if serving else None
        return session.node

    def _freshest(self) -> int:
        """The live node that has applied the most, a serving one first (where an open reads)."""
        alive = self.cluster.alive()
        assert alive, "no metastore node is up"
        return max(alive, key=lambda i: (self._serves(i, 0), self.cluster.peer(i).last_committed, -i))

    def readable(self, ledger_id: int) -> bool:
        """Whether a client could open the ledger now: a serving node has its znode."""
        return any(self._serves(i, 0) and self.read_on(i, ledger_id) is not None for i in self.cluster.alive())

    def open(self, client: str, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """`client` opens the ledger: its session connects to a serving node holding the znode,
        picked at random, and reads there (as stale as a fresh ZooKeeper session's first read may
        be). If no node serves, it reads on the freshest live node: a setup shortcut where a real
        open would wait."""
        serving = [i for i in sorted(self.cluster.nodes)
                   if self._serves(i, 0) and self.read_on(i, ledger_id) is not None]
        node = self.world.rng.choice(serving) if serving else self._freshest()
        found = self.read_on(node, ledger_id)
        if found is None:
            raise KeyError(ledger_id)
        self.sessions[client] = Session(node, self.cluster.peer(node).last_committed)
        return found

    def connect(self, client: str, node: int) -> None:
        """Connect `client`'s session to `node` now (a story's choice; it keeps what it has seen)."""
        self.sessions.setdefault(client, Session()).node = node

    # -- setup and oracles: reads outside any operation --------------------------------------------
    def read_on(self, node: int, ledger_id: int) -> tuple[LedgerMetadata, int] | None:
        """The metadata and version `node` has applied for `ledger_id` (None: no such znode)."""
        znode = self.cluster.peer(node).sm.tree.node(ledger_path(LEDGER_ROOT, ledger_id))
        return None if znode is None else (decode(znode.data), znode.version)

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The metadata on the live node that has applied the most (what the oracles and the
        world's readers read); KeyError if it has none."""
        found = self.read_on(self._freshest(), ledger_id)
        if found is None:
            raise KeyError(ledger_id)
        return found

    def create(self, metadata: LedgerMetadata) -> int:
        """Create the ledger's znode (and its parents) through Zab, running the scheduler until
        the create commits; returns its version, 0."""
        path = ledger_path(LEDGER_ROOT, metadata.ledger_id)
        for _ in range(CREATE_ATTEMPTS):
            node = self._connect(self._setup)
            if node is None:
                self.cluster.run(METADATA_RETRY_MS)
                continue
            ops = [self._create(node, p, b"", acl) for p, acl in self._missing_parents(node, path)]
            last = self._create(node, path, encode(metadata), LEDGER_ACL)
            self.cluster.run_until(lambda: all(op.status != "pending" for op in (*ops, last)), self.timeout_ms)
            if last.status == "acked" or last.error == "NodeExists":  # NodeExists: our earlier try landed
                self._setup.seen_zxid = max(self._setup.seen_zxid, last.zxid or last.result.zxid)
                return 0
            self._setup.node = None
            self.cluster.run(METADATA_RETRY_MS)
        raise AssertionError(f"ledger {metadata.ledger_id}: no create committed in {CREATE_ATTEMPTS} attempts")

    def _missing_parents(self, node: int, path: str) -> list[tuple[str, tuple]]:
        tree = self.cluster.peer(node).sm.tree
        parts = path.split("/")[1:-1]
        prefixes = ["/" + "/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        return [(p, OPEN_ACL_UNSAFE if len(p) <= len(LEDGER_ROOT) else LEDGER_ACL)
                for p in prefixes if tree.node(p) is None]

    def _create(self, node: int, path: str, data: bytes, acl: tuple) -> ClientOp:
        body = jute.CreateRequest(path, data, acl, 0)
        return self.cluster.submit(node, client_request(OpCode.CREATE, body, node, self.world.now), key=path)

    # -- the operations' requests ------------------------------------------------------------------
    def request(self, client: SimClient, action: A.ReadMetadata | A.WriteMetadata) -> None:
        """`client`'s operation asked for `action`: it reaches the metastore after a network delay."""
        self.world.sched.at(self.world.now + self._delay(), self._arrive, (client.name, client.ledger_id, action))

    def _delay(self) -> int:
        return self.world.rng.randint(self.world.min_delay_ms, self.world.max_delay_ms)

    def _arrive(self, event: tuple) -> None:
        name, ledger_id, action = event
        if isinstance(action, A.ReadMetadata) and not self.world.clients[name].alive:
            return  # a crashed client's retry loop ends with it (a write already sent still lands)
        session = self.sessions.setdefault(name, Session())
        node = self._connect(session)
        if node is None:
            self._connection_loss(name, ledger_id, action)
        elif isinstance(action, A.ReadMetadata):
            self._read(name, session, node, ledger_id)
        else:
            self._write(name, node, ledger_id, action)

    def _read(self, name: str, session: Session, node: int, ledger_id: int) -> None:
        found = self.read_on(node, ledger_id)
        if found is None:
            raise InvariantViolation(f"{name}: ledger {ledger_id}'s znode is missing on node {node}, "
                                     f"which has seen {session.seen_zxid:#x}")
        session.seen_zxid = max(session.seen_zxid, self.cluster.peer(node).last_committed)
        self._answer(name, A.MetadataRead(*found))

    def _write(self, name: str, node: int, ledger_id: int, action: A.WriteMetadata) -> None:
        path = ledger_path(LEDGER_ROOT, ledger_id)
        body = jute.SetDataRequest(path, encode(action.metadata), action.expected_version)
        op = self.cluster.submit(node, client_request(OpCode.SET_DATA, body, node, self.world.now), key=path,
                                 value=f"{name} {action.metadata.state.value} v{action.expected_version}")
        self.writes.append(op)
        if op.status != "pending":
            self._connection_loss(name, ledger_id, action)
            return
        self._in_flight[op.cxid] = (name, action)
        op.on_done = self._written
        self.world.sched.at(self.world.now + self.timeout_ms, self._timeout, (op,))

    def _written(self, op: ClientOp) -> None:
        """Called by the cluster as the write settles; only schedules (never steps anything)."""
        waiting = self._in_flight.pop(op.cxid, None)
        if waiting is None:
            return  # its client timed out long ago; the oracles still see what it did
        name, action = waiting
        session = self.sessions[name]
        if op.status == "acked":
            session.seen_zxid = max(session.seen_zxid, op.zxid)
            self._answer(name, A.MetadataWritten(op.version))
        elif op.status == "refused" and op.error in ("BadVersion", "NoNode"):
            session.seen_zxid = max(session.seen_zxid, op.result.zxid)
            if op.error == "NoNode":
                raise InvariantViolation(f"{name}: ledger znode {op.key} vanished (nothing deletes ledgers)")
            self._answer(name, A.MetadataBadVersion())
        else:  # failed, unknown, or another ZooKeeper error: a MetastoreError to the driver
            self._connection_loss(name, None, action)

    def _timeout(self, event: tuple) -> None:
        (op,) = event
        waiting = self._in_flight.pop(op.cxid, None)
        if waiting is not None:  # still pending: the session gives up on its connection
            self._connection_loss(waiting[0], None, waiting[1])

    def _connection_loss(self, name: str, ledger_id: int | None, action: object) -> None:
        """The driver's answer to a MetastoreError, after its retry sleep: read again, or
        report a write as MetadataBadVersion (outcome unknown: the operation re-reads)."""
        self.connection_losses += 1
        self.sessions.setdefault(name, Session()).node = None  # the client reconnects elsewhere
        self.world._note(f"{name}: metastore ConnectionLoss on {type(action).__name__}")
        if isinstance(action, A.ReadMetadata):
            assert ledger_id is not None
            retry_at = self.world.now + METADATA_RETRY_MS + self._delay()
            self.world.sched.at(retry_at, self._arrive, (name, ledger_id, action))
        else:
            self._answer(name, A.MetadataBadVersion(), METADATA_RETRY_MS)

    def _answer(self, name: str, event: A.Event, after_ms: int = 0) -> None:
        self.world._at(self.world.now + after_ms + self._delay(), "answer", name, event)
