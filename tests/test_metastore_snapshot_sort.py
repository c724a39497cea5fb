"""metastore/wire/snapshot_stream.py `sorted_paths`: runs sorted apart and merged give the one order
the snapshot format needs (a path after every path that sorts before it, parents first)."""

from __future__ import annotations

import random

from metastore.core import paths
from metastore.wire.snapshot_stream import SORT_RUN, sorted_paths


def test_runs_merged_are_the_sorted_paths_without_the_config_node():
    rng = random.Random(5)
    nodes = {f"/{rng.randrange(50)}/{i}": None for i in range(3 * SORT_RUN + 17)}
    nodes.update({"/": None, paths.CONFIG: None, "/zookeeper": None})
    got = sorted_paths(nodes)  # type: ignore[arg-type]
    assert got == sorted(p for p in nodes if p != paths.CONFIG)
    assert len(got) > 3 * SORT_RUN


def test_a_small_tree_is_sorted_in_one_call():
    assert sorted_paths({"/b": None, "/": None, "/a": None}) == ["/", "/a", "/b"]  # type: ignore[arg-type]
