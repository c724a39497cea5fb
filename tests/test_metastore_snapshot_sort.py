"""metastore/wire/snapshot_stream.py `sorted_items`: runs sorted apart and merged give the one order
the snapshot format needs (a path after every path that sorts before it, parents first)."""

from __future__ import annotations

import random

from metastore.core import paths
from metastore.wire.snapshot_stream import SORT_RUN, sorted_items


def test_runs_merged_are_the_sorted_pairs_without_the_config_node():
    rng = random.Random(5)
    nodes = {f"/{rng.randrange(50)}/{i}": i for i in range(3 * SORT_RUN + 17)}
    nodes.update({"/": -1, paths.CONFIG: -2, "/zookeeper": -3, "/zookeeper/quota": -4})
    got = sorted_items(nodes)  # type: ignore[arg-type]
    assert got == sorted((p, n) for p, n in nodes.items() if p != paths.CONFIG)
    assert len(got) > 3 * SORT_RUN


def test_a_small_tree_is_sorted_in_one_call():
    assert sorted_items({"/b": 2, "/": 0, "/a": 1}) == [("/", 0), ("/a", 1), ("/b", 2)]  # type: ignore[arg-type]


def test_a_tree_without_the_config_node_keeps_every_pair():
    assert sorted_items({"/zookeeper/quota": 1, "/zookeeper": 0}) == [("/zookeeper", 0), ("/zookeeper/quota", 1)]  # type: ignore[arg-type]
