"""Random fault stories for the simulated ledger world (sim.ledger_world.LedgerWorld).

A `Story` is one ledger (ensemble, write and ack quorums) written by one writer
while bookies crash, restart and lose fence requests, requests and answers are
lost, the writer may crash, and up to three recoverers start at different times
(some crashing halfway). Afterwards every bookie comes back and the network heals;
then the ledger must be CLOSED and `check` holds:
- every entry acknowledged to the writer is in the closed ledger, with Qa genuine copies on the bookies
  the metadata records for it, holding the writer's payload (LedgerWorld.check_closed_ledger);
- every recoverer that finished agrees on the same closed metadata;
- the writer got no acknowledgement after its first failure (checked as it happens by the world);
- readers of the open ledger (every 20 ms: read the LAC, then the entry at it) never see a LAC past
  what the writer had acknowledged, and read exactly the writer's payload.
The run is deterministic from the Story; tests/test_ledger_sim_random.py draws stories with
hypothesis, `story_from_seed` from one integer (sim.explore).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bookie.entry import Digester, DigestType
from ledger.read_op import ReadEntryOp, ReadLacOp
from ledger.writer import WriterState
from sim.ledger_world import InvariantViolation, LedgerWorld

FAULT_WINDOW_MS = 200
BOOKIE_FAULTS = ("crash", "restart", "lose_fences")
JOURNAL_FSYNC_MS = (1, 12)  # long enough that crashes often catch records unsynced


@dataclass(frozen=True)
class Story:
    """Everything a ledger run depends on; its repr is a Python literal that replays it."""
    seed: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    bookies: int
    entries: int
    loss: float
    bookie_faults: tuple[tuple[int, str, int], ...]   # (ms, "crash" | "restart" | "lose_fences", bookie)
    writer_crash_ms: int | None
    recoverers: tuple[tuple[int, int | None], ...]    # (start ms, crash after ms or None)
    journal: bool = False   # bookies answer after a simulated fsync; a crash loses unsynced records


def story_from_seed(seed: int, max_faults: int = 6) -> Story:
    """A story determined by one integer, with the shape hypothesis draws (at most `max_faults`
    bookie faults)."""
    rng = random.Random(seed)
    e = rng.randint(1, 5)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    bookies = rng.randint(e, e + 3)
    faults = [(rng.randint(0, FAULT_WINDOW_MS), rng.choice(BOOKIE_FAULTS), rng.randint(1, bookies))
              for _ in range(rng.randint(0, max_faults))]
    recoverers = [(rng.randint(0, FAULT_WINDOW_MS), rng.choice((None, rng.randint(1, 60))))
                  for _ in range(rng.randint(1, 3))]
    writer_crash_ms = rng.choice((None, rng.randint(0, 150)))
    entries, loss = rng.randint(1, 40), rng.choice((0.0, 0.02, 0.1))
    # Drawn last: with the journal off, a seed plays exactly the story it played before the journal.
    return Story(seed=seed, ensemble_size=e, write_quorum=qw, ack_quorum=qa, bookies=bookies,
                 entries=entries, loss=loss, bookie_faults=tuple(sorted(faults)),
                 writer_crash_ms=writer_crash_ms, recoverers=tuple(recoverers), journal=bool(rng.randint(0, 1)))


def run_story(story: Story) -> LedgerWorld:
    """Play `story` on a fresh LedgerWorld, heal, and run every live recoverer to its end."""
    world = LedgerWorld(seed=story.seed, bookies=story.bookies, loss=story.loss, journal=story.journal,
                        fsync_ms=JOURNAL_FSYNC_MS)
    ensemble = tuple(range(1, story.ensemble_size + 1))
    lid = world.create_ledger(ensemble, story.write_quorum, story.ack_quorum).ledger_id
    w = world.writer("w", lid)
    appended = 0
    for ms in range(FAULT_WINDOW_MS + 1):
        for when, fault, bookie in story.bookie_faults:
            if when == ms:
                apply_fault(world, fault, bookie)
        for i, (start, crash_after) in enumerate(story.recoverers):
            if start == ms:
                world.recoverer(f"r{i}", lid)
            if crash_after is not None and start + crash_after == ms:
                world.crash_client(f"r{i}")
        if story.writer_crash_ms == ms:
            world.crash_client("w")
        if w.alive and ms % 2 == 0 and appended < story.entries and w.op.state is WriterState.OPEN:
            world.append("w", b"entry %d" % appended)
            appended += 1
        if ms % 20 == 10:
            start_reader(world, lid, ms)
        world.run(1)
    heal(world)
    recoverers = [c for name, c in world.clients.items() if name.startswith("r") and c.alive]
    if not recoverers:
        recoverers = [world.recoverer("final", lid)]
    assert world.run_until(lambda: all(r.done for r in recoverers), 60_000), "recovery made no progress"
    return world


def start_reader(world: LedgerWorld, lid: int, ms: int) -> None:
    """An open-ledger reader: its LAC, then (when it completes, see check) the entry at that LAC."""
    metadata, _ = world.meta.read(lid)
    world.start_op(f"lac{ms}", lid, ReadLacOp(metadata))


def check_readers(world: LedgerWorld) -> None:
    """No open-ledger reader saw a LAC past the writer's acknowledgements or another payload."""
    digester = Digester(DigestType.CRC32C, b"secret")
    for name, c in list(world.clients.items()):
        if not name.startswith("lac") or c.result is None:
            continue
        lac = c.result
        if lac > world.acknowledged_by("w", c.done_at):
            raise InvariantViolation(f"reader {name} saw LAC {lac} at {c.done_at}, past what the writer "
                                     f"had acknowledged ({world.acknowledged_by('w', c.done_at)})")
        if lac >= 0:
            metadata, _ = world.meta.read(1)
            reader = world.start_op(f"read{name}", 1, ReadEntryOp(metadata, lac, digester))
            world.run_until(lambda: reader.done, 5_000)
            if reader.result is not None and reader.result.payload != world.clients["w"].payloads[lac]:
                raise InvariantViolation(f"reader {name} read entry {lac} as {reader.result.payload!r}")


def apply_fault(world: LedgerWorld, fault: str, bookie: int) -> None:
    """One of BOOKIE_FAULTS on `bookie`; "lose_fences" drops every fence request sent to it from now."""
    if fault == "crash":
        world.crash_bookie(bookie)
    elif fault == "restart":
        world.restart_bookie(bookie)
    else:
        world.drop(lambda m, b=bookie: m.bookie == b and type(m.action).__name__ == "SendFence")


def heal(world: LedgerWorld) -> None:
    """Every bookie up, every drop rule gone, no more loss."""
    for b in world.bookies:
        world.restart_bookie(b)
    world.rules.clear()
    world.loss = 0.0


def check(world: LedgerWorld) -> None:
    """The oracles after a story (module docstring); raises InvariantViolation or AssertionError."""
    lid = 1
    closed, _ = world.meta.read(lid)
    world.check_closed_ledger(lid)
    recoverers = [c for name, c in world.clients.items() if name.startswith(("r", "final"))]
    finished = [c for c in recoverers if c.result is not None]
    assert finished and all(c.result == closed for c in finished), "recoverers disagree"
    assert all(c.error is None for c in recoverers)
    check_readers(world)
