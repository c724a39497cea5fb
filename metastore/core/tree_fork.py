"""A second DataTree sharing the first one's znodes: the leader's view of the future (issue 19).

A new leader prepares requests against the committed tree plus everything it has prepared and
not yet applied (metastore/core/prep.py). That view used to be a deep copy, made by encoding the
tree and decoding it again, on the event loop: at 200,000 znodes it held the loop past the sync
limit, followers gave up on the leader, and a tree of a gigabyte never served again after a
restart (bench/large_tree.py found it). A fork costs a copy of references instead (the path
dict and the small indexes), and both trees copy a shared znode the first time they change it,
the way freeze() keeps a snapshot's view still: the live tree because its epoch moves on, the
fork because its epoch is one no live tree ever has.

DataTree's friend, as metastore/core/tree_assembly.py is: it fills the private fields directly.
"""

from __future__ import annotations

import itertools

from metastore.core.tree import DataTree

_FORK_EPOCHS = itertools.count(-1, -1)  # negative: a live tree's epochs count up from 0


def fork(tree: DataTree) -> DataTree:
    """A tree equal to `tree` now, each changing from here without changing the other."""
    tree._epoch += 1  # every znode shared from now on is copied before the live tree changes it
    twin = DataTree.__new__(DataTree)
    twin.last_zxid = tree.last_zxid
    twin._nodes = dict(tree._nodes)
    twin._sessions = dict(tree._sessions)
    twin._ephemerals = {owner: set(owned) for owner, owned in tree._ephemerals.items()}
    twin._containers = set(tree._containers)
    twin._ttls = set(tree._ttls)
    twin._acls = {acl: list(entry) for acl, entry in tree._acls.items()}  # the reference counts change
    twin._digest = tree._digest
    twin.data_bytes = tree.data_bytes
    twin._epoch = next(_FORK_EPOCHS)
    twin._undo = None
    return twin
