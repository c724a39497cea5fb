"""The watch index's memory accounting (metastore/core/watches.py), on the real core.

Hypothesis drives random sequences of adds, setWatches-style batches, removals, triggers and
closed connections against small bounds; after every step the bytes the manager counts must
equal the cost of the watches it holds, and neither bound may ever be passed. Derandomized
(tests/conftest.py)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from metastore.core.watches import WatchKind, WatchLimitExceeded, WatchLimits, WatchManager, watch_cost
from metastore.wire.jute_defs import EventType

LIMITS = WatchLimits(per_connection_bytes=3 * watch_cost("/a/bb"), total_bytes=5 * watch_cost("/a/bb"))
paths = st.sampled_from(["/a", "/a/b", "/a/bb", "/c", "/a/b/c"])
conns = st.integers(1, 3)
kinds = st.sampled_from(list(WatchKind))
steps = st.one_of(
    st.tuples(st.just("add"), conns, paths, kinds),
    st.tuples(st.just("batch"), conns, st.lists(st.tuples(paths, kinds), max_size=4)),
    st.tuples(st.just("remove"), conns, paths, kinds),
    st.tuples(st.just("trigger"), paths, st.sampled_from(list(EventType)[1:5])),
    st.tuples(st.just("drop"), conns))


def held(w: WatchManager, conn: int) -> int:
    return sum(watch_cost(p) for k in WatchKind for p in list(w._by_kind[k]) if w.has(conn, p, k))


@given(st.lists(steps, max_size=40))
def test_counted_bytes_match_the_watches_held_and_never_pass_a_bound(script):
    w = WatchManager(limits=LIMITS)
    for step in script:
        before = {c: held(w, c) for c in (1, 2, 3)}
        try:
            if step[0] == "add":
                w.add(step[1], step[2], step[3])
            elif step[0] == "batch":
                w.add_many(step[1], step[2])
            elif step[0] == "remove":
                w.remove(step[1], step[2], step[3])
            elif step[0] == "trigger":
                w.trigger(step[1], step[2])
            else:
                w.drop_connection(step[1])
        except WatchLimitExceeded:
            assert {c: held(w, c) for c in (1, 2, 3)} == before, "a refused batch set some of its watches"
        for c in (1, 2, 3):
            assert w.bytes_of(c) == held(w, c) <= LIMITS.per_connection_bytes
        assert w.total_bytes == sum(held(w, c) for c in (1, 2, 3)) <= LIMITS.total_bytes


def test_a_watch_held_already_costs_nothing_and_the_error_names_the_setting():
    w = WatchManager(limits=WatchLimits(per_connection_bytes=watch_cost("/x"), total_bytes=1 << 20))
    w.add(1, "/x", WatchKind.DATA)
    w.add(1, "/x", WatchKind.DATA)  # the same watch again: no second charge
    try:
        w.add(1, "/y", WatchKind.DATA)
    except WatchLimitExceeded as e:
        assert e.setting == "max_watch_bytes_per_connection" and "removeWatches" in str(e)
    else:
        raise AssertionError("a second watch passed the bound")
    assert w.trigger("/x", EventType.NODE_DATA_CHANGED) == [(1, EventType.NODE_DATA_CHANGED, "/x")]
    w.add(1, "/y", WatchKind.DATA)  # the fired watch's bytes came back
