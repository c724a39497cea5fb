"""Write quorums, ack quorums and coverage: the arithmetic of seed 001.

- The write quorum of an entry is the Qw bookies of its fragment's ensemble
  starting at index `entry_id % E` (seed 001, "Write Quorums"): with E=4, Qw=3
  entry 0 goes to B1 B2 B3, entry 1 to B2 B3 B4, entry 2 to B3 B4 B1, ...
  There are only E distinct write quorums in an ensemble.
- An entry is replicated once Qa bookies of its write quorum acknowledged it
  (seed 001, "Ack Quorums").
- Coverage (seed 001, "Closing a ledger as a reader"): a set of responses
  covers the ensemble when every one of its E write quorums has at least
  (Qw - Qa) + 1 responders. Then no write quorum has Qa bookies left that did
  not answer, so:
    * after fence responses with coverage, an old writer can never gather Qa
      acks for a new entry;
    * after LAC responses with coverage, the highest LAC bounds from below
      every entry that any writer acknowledged;
    * after explicit "no such entry" answers from (Qw - Qa) + 1 bookies of one
      entry's write quorum, that entry cannot have been acknowledged (Qa
      bookies would have had to store it) -- "absent". A timeout or an
      unavailable bookie says nothing and never counts (BookKeeper #2281, #3405).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """The ensemble indexes an entry is written to: Qw of them, from entry_id % E on (wrapping)."""
    assert 1 <= write_quorum <= ensemble_size and entry_id >= 0
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum))


def write_quorum(ensemble: Sequence[int], entry_id: int, write_quorum_size: int) -> tuple[int, ...]:
    """The bookies an entry is written to, in write-set order."""
    return tuple(ensemble[i] for i in write_set(entry_id, len(ensemble), write_quorum_size))


def ack_quorum_met(acks: Iterable[int], quorum: Iterable[int], ack_quorum_size: int) -> bool:
    """True when at least Qa bookies of `quorum` (an entry's write quorum) are among `acks`."""
    return len(set(acks) & set(quorum)) >= ack_quorum_size


class Coverage:
    """Responses by ensemble index, and whether every write set in view has (Qw - Qa) + 1 of them.

    `Coverage.ensemble(E, Qw, Qa)` watches all E write quorums (fencing, reading
    LACs); `Coverage.entry(E, Qw, Qa, entry_id)` watches one entry's write
    quorum (deciding that the entry is absent).
    """

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                 write_sets: Iterable[tuple[int, ...]]) -> None:
        assert 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size
        self.needed = write_quorum_size - ack_quorum_size + 1
        self.write_sets = tuple(dict.fromkeys(tuple(sorted(s)) for s in write_sets))
        self.responded: set[int] = set()

    @classmethod
    def ensemble(cls, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> Coverage:
        sets = (write_set(i, ensemble_size, write_quorum_size) for i in range(ensemble_size))
        return cls(ensemble_size, write_quorum_size, ack_quorum_size, sets)

    @classmethod
    def entry(cls, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, entry_id: int) -> Coverage:
        return cls(ensemble_size, write_quorum_size, ack_quorum_size,
                   [write_set(entry_id, ensemble_size, write_quorum_size)])

    def add(self, index: int) -> bool:
        """Record a response from ensemble index `index`; returns covered()."""
        self.responded.add(index)
        return self.covered()

    def covered(self) -> bool:
        return all(len(self.responded.intersection(s)) >= self.needed for s in self.write_sets)
