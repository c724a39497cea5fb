"""metastore/core/tree_assembly.py checks a restored znode's path by its last name only, its parent
having been checked whole when it was added. Against the whole check (paths.validate_path and a
parent in the tree), on any path: the same paths pass and the same fail."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from metastore.core import paths
from metastore.core.tree_assembly import TreeAssembler
from metastore.errors import BadArguments

EXISTING = ["/", "/a", "/a/b", "/a/b.c", "/x", "/zookeeper", "/zookeeper/quota"]
RECORD_TAIL = (0, 0, 0, 0, 0, 0, 0, 0, 0)  # czxid .. owner: a persistent znode


def assembler() -> TreeAssembler:
    a = TreeAssembler(1, {})
    for path in EXISTING:
        a.add((path, b"", (), *RECORD_TAIL))
    return a


def accepted_by_the_whole_check(path: str) -> bool:
    try:
        paths.validate_path(path)
    except BadArguments:
        return False
    return path == paths.ROOT or (path != paths.CONFIG and paths.parent_of(path) in EXISTING)


names = st.sampled_from(["a", "b", "b.c", "x", ".", "..", "", "zookeeper", "config", "quota", "\x00", "\x1f", "é",
                         "\ud800", "ok"])


@given(st.lists(names, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
       | st.text(alphabet="/ab.\x00", max_size=8))
@example("/")
@example("//a")
@example("/zookeeper/config")
@example("/a/")
def test_the_last_name_check_accepts_exactly_what_the_whole_check_accepts(path):
    a = assembler()
    try:
        a.add((path, b"", (), *RECORD_TAIL))
        taken = True
    except (ValueError, BadArguments):
        taken = False
    assert taken == (accepted_by_the_whole_check(path) and path not in EXISTING)  # a znode comes once
