"""A node's large long-lived state kept out of the cyclic garbage collector's way (edge).

CPython's cyclic collector traverses every object it tracks in a full collection, with the GIL
held, and runs one each time the objects that survived earlier collections have grown by a
quarter. Every znode is such an object: with a million of them a full collection is over half a
second, and a tree being loaded crosses a quarter's growth again and again. A leader silent
that long loses its followers (`sync_limit_ticks`, 500 ms by default), which drop their clients'
requests and rejoin: loading a million znodes, the large-tree benchmark saw it every 10 to 15 s.

So when a node's state has just become long-lived (recovered at start, at each periodic
snapshot, after a SNAP is installed) the driver calls `settle()`: a full collection of what is
not frozen yet (only what was allocated since the last call, so milliseconds; after a state was
built with the collector off, none: `settle_built`), then
`gc.freeze()`, which moves everything left to a permanent generation that later collections
skip. Frozen objects are still freed by reference counting when they are dropped (a deleted or
superseded znode: the tree holds no reference cycles).

What a freeze gives up is collecting a reference cycle whose objects were alive at a freeze and
became garbage later. Thawing now and then to collect those would bring the full pause back (a
thaw every 20 snapshots cost the benchmark's million-znode load 256 requests at the 20th), so
there is none: with cluster.toml's settings and `snapshot_every_txns` = 500, ninety seconds of
four clients connecting, creating an ephemeral znode, writing, watching and closing in a loop
left no such cycle (a thaw every 20 snapshots collected 0 objects each time).
`frozen_objects()` is in /status for an operator who wants to watch it.

While a large state is being built (restored at start, or from a SNAP as its chunks arrive) the
collector is off altogether (`suspend`/`resume`): every quarter's growth of a tree of a million
new znodes would cost a full collection of all of them, about four times the tree's size in
collector work before the node serves, and none of it finds garbage (refcounting frees the rest).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("quire.edge.long_lived")


# gc.get_freeze_count() walks every frozen object with the GIL held (30 ms for 3 million, measured):
# counted once after each freeze, when first asked, not at every status request (a wiped follower
# polled by `srvr` spent 5% of its SNAP in it).
_frozen_count: int | None = None


def settle(reason: str, *, collect: bool = True) -> None:
    """Collect the garbage among objects not frozen yet (unless `collect` is False), then freeze
    everything still alive."""
    global _frozen_count
    start = time.perf_counter()
    collected = gc.collect() if collect else 0
    gc.freeze()
    _frozen_count = None
    log.debug("event=gc_settle reason=%s collected=%d seconds=%.3f", reason, collected, time.perf_counter() - start)


def frozen_objects() -> int:
    """Objects in the permanent generation (gc.freeze): the node's long-lived state, and any
    reference cycle frozen while alive that has become garbage since. Counted at the first call
    after each freeze (a walk of them all), then the same until the next one."""
    global _frozen_count
    if _frozen_count is None:
        _frozen_count = gc.get_freeze_count()
    return _frozen_count


def thaw() -> None:
    """Unfreeze everything (gc.unfreeze) and forget the count: for a process that stops being a
    node, such as a test run after a driver's."""
    global _frozen_count
    gc.unfreeze()
    _frozen_count = None


_suspended = False  # by us: the collector is back on at resume (a caller that had it off keeps it off)


def suspend() -> None:
    """Turn the cyclic collector off while a large state is built (idempotent)."""
    global _suspended
    if not _suspended and gc.isenabled():
        gc.disable()
        _suspended = True


def resume() -> None:
    """Turn it back on if `suspend` turned it off (idempotent)."""
    global _suspended
    if _suspended:
        _suspended = False
        gc.enable()


@contextmanager
def building(reason: str) -> Iterator[None]:
    """The collector off while the block builds a large state; then the state frozen without a
    collection (`settle_built`), and the collector on again."""
    suspend()
    try:
        yield
        settle_built(reason)  # before the collector is back: its next allocation would collect all of it
    finally:
        resume()


def settle_built(reason: str) -> None:
    """Freeze a state just built with the collector off, without collecting it first, and before
    the collector is back on (on, it collects the youngest generation, which holds all of it, at
    the next allocation). That collection would walk the whole new state (0.41 s with the GIL held
    for a restored tree of a million znodes, measured) and find nothing: what was built is alive,
    and what it replaced was freed by reference counting. What it gives up: the few cycles that
    became garbage while the collector was off (start-up's, a SNAP's bookkeeping)."""
    settle(reason, collect=False)
