"""AutoRecovery in the simulated ledger world: an auditor and replication workers on its scheduler.

`SimAutoRecovery(world)` audits every `audit_ms` of simulated time, as ledger/autorecovery/auditor.py
does while leading, with the real pure planning (ledger/autorecovery/planning.py):

- a bookie that is down is *missing*; missing for `grace_ms` it is *lost* (LossTracker); one back
  within the grace period is forgotten and causes no copying;
- every ledger with a fragment on a lost bookie is marked (ledgers_to_mark): its ReplicationTask is
  created, or widened (`merged`) when more of its bookies are lost;
- a due task not being worked on is taken by a replication worker, which first judges its lost
  bookies again (`ReplicationTask.rejudged` over the bookies up then, the worker's list_bookies):
  one back after the grace period is lost no more (read from, not replaced), and the shrunk task
  is what is deleted or written back; then a client running
  sim/replication_op.py's ReplicationOp (the worker's order: copy every entry the lost bookie held
  from surviving replicas to a replacement with recovery adds, and only when every copy is
  durable CAS the replacement into the metadata, through the metastore when the world runs on a
  SimCluster; re-read on a conflict; copy again if the fragment changed);
- a finished repair deletes its task unless the task was widened meanwhile (the real worker's
  delete at the version read); a failed one (Unrepairable, a failed copy) is written back with an
  exponential backoff (`ReplicationTask.failed`); an OPEN ledger whose last fragment has a lost
  bookie waits for its writer (or a recoverer) to close it and is tried again `open_wait_ms` later.
`replica_check()` runs the auditor's replica check with the worker's refill on every CLOSED ledger
(every copy its metadata names read; a missing or bad one copied back from the others).

What is not modelled: the task and lock znodes (tasks live here; one worker per ledger at a time,
as the lock ensures), the auditor's election, decommissioning, pausing, and the worker fencing and
closing an abandoned OPEN ledger itself (a recoverer of the schedule does it). The auditor reads
metadata from the freshest metastore node (LedgerWorld.meta.read), not through a session.

`check_rereplicated` is the oracle after it settles: every entry of a closed ledger has Qw genuine
copies, with the writer's payload, on live bookies the metadata names, none of them lost.
"""

from __future__ import annotations

from dataclasses import replace

from ledger.autorecovery.planning import LossTracker, ReplicationTask, entries_on, ledgers_to_mark
from ledger.metadata import LedgerMetadata
from ledger.quorum import write_quorum
from ledger.read_op import verify_entry
from ledger.writer import Writer
from sim.ledger_world import InvariantViolation, LedgerWorld
from sim.replication_op import WAITING, ReplicationOp

RETRY_MIN_MS, RETRY_MAX_MS = 100, 2_000   # the real backoff doubles from 1 s to 60 s: scaled to the sim


class SimAutoRecovery:
    """The auditor and the workers of one LedgerWorld (module docstring)."""

    def __init__(self, world: LedgerWorld, *, grace_ms: int = 150, audit_ms: int = 25, open_wait_ms: int = 100,
                 copy_window: int = 4) -> None:
        self.world, self.audit_ms, self.open_wait_ms, self.copy_window = world, audit_ms, open_wait_ms, copy_window
        self.tracker = LossTracker(grace_ms)
        self.tasks: dict[int, ReplicationTask] = {}
        self.running: dict[int, tuple[str, ReplicationTask]] = {}  # ledger -> (worker client, task it took)
        self.ever_lost: set[int] = set()
        self.workers = 0
        self.repaired: list[int] = []       # ledgers whose task was finished
        self.failures: list[str] = []
        self.stopped = False
        world.autorecovery.append(self)
        world.sched.at(world.now + audit_ms, self._audit, ())

    # -- the auditor ---------------------------------------------------------------------------------
    def _audit(self, _: tuple) -> None:
        if self.stopped:
            return
        world, now = self.world, self.world.now
        self._collect()
        self.tracker.observe(world.bookies, [b for b, bk in world.bookies.items() if bk.alive], now)
        lost = self.tracker.lost(now)
        self.ever_lost |= lost
        for ledger_id, bookies in ledgers_to_mark(self._ledgers(), lost).items():
            task = self.tasks.get(ledger_id)
            if task is None:
                self.tasks[ledger_id] = ReplicationTask(ledger_id, bookies, now)
                world._note(f"auditor: ledger {ledger_id} under-replicated, lost {sorted(bookies)}")
            elif not task.covers(bookies):
                self.tasks[ledger_id] = task.merged(bookies)
        for ledger_id, task in sorted(self.tasks.items()):
            if ledger_id not in self.running and task.due(now):
                self._take(task)
        world.sched.at(now + self.audit_ms, self._audit, ())

    def _ledgers(self) -> list[LedgerMetadata]:
        """Every ledger's metadata (a ledger whose create has not committed yet is not listed)."""
        found = []
        for ledger_id in range(1, self.world._next_ledger):
            try:
                found.append(self.world.meta.read(ledger_id)[0])
            except KeyError:
                continue
        return found

    def replica_check(self) -> None:
        """The auditor's replica check, shortened: every bookie of every CLOSED ledger without a task
        is marked `damaged`, and the worker's refill (reading each copy from the bookie itself first)
        copies back whatever it misses or holds bad. The real check reads every copy and marks only
        the bookies that miss one; the copies made are the same."""
        for metadata in self._ledgers():
            if metadata.is_closed and metadata.ledger_id not in self.tasks:
                self.tasks[metadata.ledger_id] = ReplicationTask(metadata.ledger_id, frozenset(), self.world.now,
                                                                 damaged=metadata.bookies)

    # -- the workers -----------------------------------------------------------------------------------
    def _take(self, task: ReplicationTask) -> None:
        world = self.world
        registered = [b for b, bk in world.bookies.items() if bk.alive]  # the worker's list_bookies
        rejudged = task.rejudged(registered)  # no decommissioning in the sim: nothing is drained
        if rejudged != task:
            world._note(f"worker: ledger {task.ledger_id}: bookies {sorted(task.lost - rejudged.lost)} are back, "
                        f"lost {sorted(rejudged.lost)}")
            task = self.tasks[task.ledger_id] = rejudged
        metadata = next(m for m in self._ledgers() if m.ledger_id == task.ledger_id)
        self.workers += 1
        name = f"ar{self.workers}"
        op = ReplicationOp(task.ledger_id, task.lost, metadata.digest_type, world.rng, refill=task.damaged,
                           copy_window=self.copy_window)
        world._note(f"{name}: repairs ledger {task.ledger_id} for lost {sorted(task.lost)}")
        world.start_op(name, task.ledger_id, op)
        self.running[task.ledger_id] = (name, task)

    def _collect(self) -> None:
        """Settle the tasks of workers that finished."""
        for ledger_id, (name, taken) in list(self.running.items()):
            worker = self.world.clients[name]
            if not worker.done:
                continue
            del self.running[ledger_id]
            now = self.world.now
            if worker.error is not None:
                self.failures.append(f"{name}: {type(worker.error).__name__}: {worker.error}")
                self.tasks[ledger_id] = self.tasks[ledger_id].failed(str(worker.error), now, RETRY_MIN_MS, RETRY_MAX_MS)
            elif worker.result == WAITING:  # the open tail is its writer's: try again later
                self.tasks[ledger_id] = replace(self.tasks[ledger_id], next_attempt_ms=now + self.open_wait_ms)
            elif self.tasks[ledger_id] == taken:  # the delete at the version read
                del self.tasks[ledger_id]
                self.repaired.append(ledger_id)
            # else: widened meanwhile, the next pass does the rest

    def idle(self) -> bool:
        """No task left and no worker running."""
        return not self.tasks and not self.running

    def stop(self) -> None:
        self.stopped = True


    def check_copied_before_replaced(self) -> None:
        """Every replacement a worker saw committed holds every entry the bookie it replaced held
        (the worker copies first, then CASes), unless it was lost for good itself since. Checked
        before any replica check could refill what a worker skipped."""
        world = self.world
        for name, client in world.clients.items():
            if not isinstance(client.op, ReplicationOp):
                continue
            for metadata, repair in client.op.committed:
                for old, new in repair.replacements:
                    missing = [e for e in entries_on(metadata, repair.index, old)
                               if new not in world.gone and world.bookies[new].has(metadata.ledger_id, e) is None]
                    if missing:
                        raise InvariantViolation(f"{name} named bookie {new} in place of {old} in ledger "
                                                 f"{metadata.ledger_id} without entries {missing}")


# -- oracles ------------------------------------------------------------------------------------------
def same_but_repaired(before: LedgerMetadata, after: LedgerMetadata, lost: set[int]) -> bool:
    """`after` is `before` with only lost bookies replaced: no other change was lost."""
    if (before.state, before.last_entry, before.length, len(before.fragments)) != \
            (after.state, after.last_entry, after.length, len(after.fragments)):
        return False
    for f, g in zip(before.fragments, after.fragments):
        if f.first_entry != g.first_entry or len(f.ensemble) != len(g.ensemble):
            return False
        for b, c in zip(f.ensemble, g.ensemble):
            if b != c and b not in lost:
                return False
    return True


def check_rereplicated(world: LedgerWorld, ledger_id: int, gone: set[int]) -> LedgerMetadata:
    """Every entry of the closed ledger has Qw genuine copies with the writer's payload on live bookies
    its metadata names, and the metadata names none of the `gone` bookies (lost for good)."""
    metadata, _ = world.meta.read(ledger_id)
    if not metadata.is_closed:
        raise InvariantViolation(f"ledger {ledger_id} is {metadata.state.value}, not CLOSED")
    if metadata.bookies & gone:
        raise InvariantViolation(f"ledger {ledger_id} still names lost bookies {sorted(metadata.bookies & gone)}")
    writers = [c for c in world.clients.values() if c.ledger_id == ledger_id and isinstance(c.op, Writer)]
    payloads = {e: p for w in writers for e, p in w.payloads.items()}
    digester = writers[0].digester
    for entry_id in range(metadata.last_entry + 1):
        for b in write_quorum(metadata.ensemble_for(entry_id), entry_id, metadata.write_quorum):
            bookie = world.bookies[b]
            data = bookie.has(ledger_id, entry_id)
            entry = None if data is None else verify_entry(digester, ledger_id, entry_id, data)
            if not bookie.alive or entry is None or (entry_id in payloads and entry.payload != payloads[entry_id]):
                raise InvariantViolation(f"ledger {ledger_id} entry {entry_id}: no genuine copy on bookie {b} "
                                         f"(alive={bookie.alive}, held={data is not None}) of its write quorum")
    return metadata
