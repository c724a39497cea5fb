"""Quire failovers reconstructed from the nodes' logs: who went LOOKING first, and how long the election took.

Every node logs `event=role ... role=<role>` with a millisecond timestamp. For
each failover the two survivors log role=looking (having been followers) and
one of them later logs role=leader. Votes are ordered (epoch, zxid, id); in
these runs the survivors have the same epoch and zxid, so the higher id holds
the better vote. The report compares elections where that survivor went
LOOKING first with those where the other one did.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path

_ROLE = re.compile(r"^ts=(\S+)Z .* msg=\"event=role node=(\d+) role=(\w+) leader=\S+ epoch=\d+\"")


@dataclass
class Failover:
    new_leader: int
    first_looking: int  # the survivor that logged role=looking first
    looking_gap_ms: float  # between the two survivors' role=looking lines
    looking_to_leader_ms: float  # first role=looking to the new leader's role=leader

    @property
    def order(self) -> str:
        """Which survivor went LOOKING first: the one with the better vote (the higher id, as epoch and
        zxid are equal here), the other one, or both within the same logged millisecond."""
        if self.looking_gap_ms == 0:
            return "same millisecond"
        return "better vote first" if self.first_looking == self.new_leader else "worse vote first"


def failovers(data_dir: Path) -> list[Failover]:
    """Every failover in the logs under `data_dir` (node*/clusterd.log), oldest first."""
    events = []
    for log in data_dir.glob("node*/clusterd.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = _ROLE.match(line)
            if m:
                events.append((datetime.datetime.fromisoformat(m[1]), int(m[2]), m[3]))
    events.sort()
    role: dict[int, str] = {}
    looking: dict[int, datetime.datetime] = {}
    found = []
    for at, node, new_role in events:
        if new_role == "looking" and role.get(node) == "follower":
            looking[node] = at
        elif new_role == "leader" and len(looking) == 2:
            first = min(looking, key=looking.__getitem__)
            times = sorted(looking.values())
            found.append(Failover(node, first, (times[1] - times[0]).total_seconds() * 1000,
                                  (at - times[0]).total_seconds() * 1000))
            looking = {}
        elif new_role == "leader":
            looking = {}
        role[node] = new_role
    return found
