"""Choosing bookies for ensembles (pure).

Seed 000: a ledger is striped over an ensemble of E bookies so that load and
data spread over the cluster. We spread by starting each choice at a rotating
offset among the eligible bookies (so consecutive ledgers land on different
sets) and never place two slots of one ensemble on the same bookie. Writable
bookies only: read-only ones serve reads but refuse adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ledger.errors import NotEnoughBookies


class Rng(Protocol):
    """What placement needs of a random.Random (passed in: pure code owns no randomness)."""

    def randrange(self, stop: int) -> int: ...

    def sample(self, population: Sequence[Any], k: int) -> list[Any]: ...


def choose_ensemble(available: Iterable[int], size: int, rng: Rng) -> tuple[int, ...]:
    """E distinct bookies out of `available`, starting at a random offset in id order."""
    pool = sorted(set(available))
    if len(pool) < size:
        raise NotEnoughBookies(f"need {size} writable bookies, only {len(pool)} available ({pool}): "
                               "start more bookies or use a smaller ensemble")
    start = rng.randrange(len(pool))
    rotated = pool[start:] + pool[:start]
    return tuple(rotated[:size])


def choose_replacement(available: Iterable[int], ensemble: Sequence[int], failed: Iterable[int],
                       rng: Rng) -> dict[int, int]:
    """New bookies for the `failed` members of `ensemble`: {failed id: replacement id}.

    Replacements are distinct, not already in the ensemble and not failed themselves."""
    failed = [b for b in dict.fromkeys(failed) if b in ensemble]
    chosen = choose_outside(available, (*ensemble, *failed), len(failed), rng)
    if len(chosen) < len(failed):
        pool = sorted(set(available) - set(ensemble) - set(failed))
        raise NotEnoughBookies(f"no bookie outside ensemble {list(ensemble)} can replace {failed} "
                               f"(candidates: {pool}): start more bookies")
    return dict(zip(failed, chosen))


def choose_outside(available: Iterable[int], exclude: Iterable[int], count: int, rng: Rng) -> tuple[int, ...]:
    """Up to `count` distinct bookies of `available` outside `exclude`, at random; fewer when there
    are not enough (what too few means is the operation's to decide: a writer's ensemble change
    fails with NotEnoughBookies)."""
    pool = sorted(set(available) - set(exclude))
    return tuple(rng.sample(pool, min(count, len(pool))))
