"""The znode Stat, as ZooKeeper defines it (and its client protocol carries it).

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, unsafe_hash=True)
class Stat:
    czxid: int = 0           # zxid of the transaction that created the znode
    mzxid: int = 0           # zxid of the last setData (or the create)
    ctime: int = 0           # ms since the epoch, leader's view, at creation
    mtime: int = 0           # ms since the epoch at the last setData
    version: int = 0         # number of setData since creation
    cversion: int = 0        # number of changes to the children (also numbers sequential children)
    aversion: int = 0        # number of setACL
    ephemeral_owner: int = 0  # session id of an ephemeral's owner, 0 otherwise (also marks containers/TTL, see tree)
    data_length: int = 0
    num_children: int = 0
    pzxid: int = 0           # zxid of the last change to the children (create or delete of a child)
