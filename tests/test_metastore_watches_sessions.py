"""Watch triggering rules (ZooKeeper's) and leader-side session expiry."""

from __future__ import annotations

from metastore.core.sessions import SessionExpiry, SessionTracker
from metastore.core.watches import EventType as E
from metastore.core.watches import WatchKind as K
from metastore.core.watches import WatchManager


def test_data_watch_fires_once_on_change():
    w = WatchManager()
    w.add(1, "/a", K.DATA)
    assert w.trigger("/a", E.NODE_DATA_CHANGED) == [(1, E.NODE_DATA_CHANGED, "/a")]
    assert w.trigger("/a", E.NODE_DATA_CHANGED) == []


def test_exists_watch_on_a_missing_node_fires_on_create_and_the_parent_child_watch_too():
    w = WatchManager()
    w.add(1, "/a/b", K.DATA)
    w.add(2, "/a", K.CHILD)
    assert sorted(w.trigger("/a/b", E.NODE_CREATED)) == [(1, E.NODE_CREATED, "/a/b"),
                                                         (2, E.NODE_CHILDREN_CHANGED, "/a")]


def test_delete_fires_data_and_child_watches_on_the_node():
    w = WatchManager()
    w.add(1, "/a", K.DATA)
    w.add(2, "/a", K.CHILD)
    assert sorted(w.trigger("/a", E.NODE_DELETED)) == [(1, E.NODE_DELETED, "/a"), (2, E.NODE_DELETED, "/a")]
    assert w.count() == 0


def test_persistent_watches_stay_and_recursive_ones_see_descendants_but_not_child_lists():
    w = WatchManager()
    w.add(1, "/a", K.PERSISTENT)
    w.add(2, "/a", K.PERSISTENT_RECURSIVE)
    assert sorted(w.trigger("/a", E.NODE_DATA_CHANGED)) == [(1, E.NODE_DATA_CHANGED, "/a"),
                                                           (2, E.NODE_DATA_CHANGED, "/a")]
    assert sorted(w.trigger("/a/b/c", E.NODE_CREATED)) == [(2, E.NODE_CREATED, "/a/b/c")]
    assert sorted(w.trigger("/a/b", E.NODE_CREATED)) == [(1, E.NODE_CHILDREN_CHANGED, "/a"),
                                                        (2, E.NODE_CREATED, "/a/b")]
    assert w.count() == 2


def test_a_connection_hears_an_event_once_and_closing_it_drops_its_watches():
    w = WatchManager()
    w.add(1, "/a", K.DATA)
    w.add(1, "/a", K.PERSISTENT)
    assert w.trigger("/a", E.NODE_DATA_CHANGED) == [(1, E.NODE_DATA_CHANGED, "/a")]
    w.add(1, "/b", K.CHILD)
    w.drop_connection(1)
    assert w.count() == 0 and w.trigger("/a", E.NODE_DATA_CHANGED) == []


def test_remove_reports_whether_the_watch_existed():
    w = WatchManager()
    w.add(3, "/x", K.CHILD)
    assert w.remove(3, "/x", K.CHILD) and not w.remove(3, "/x", K.CHILD)


def test_sessions_expire_after_their_timeout_unless_touched():
    t = SessionTracker()
    t.add(1, 1000, now_ms=0)
    t.add(2, 1000, now_ms=0)
    t.touch(2, now_ms=900)
    assert t.expired(999) == []
    assert t.expired(1000) == [1]
    assert t.expired(1899) == []
    assert t.expired(1900) == [2]


def test_a_new_leader_gives_every_session_a_full_timeout():
    t = SessionTracker()
    t.reset({7: 500, 8: 2000}, now_ms=10_000)
    assert t.expired(10_499) == [] and t.expired(10_500) == [7]
    t.remove(7)
    assert 7 not in t and t.expired(20_000) == [8]


def test_expiry_runs_on_the_leaders_ticks_and_counts_what_comes_between_at_the_next_tick():
    """Between two ticks nothing moves: a creation or touch counts at the next tick's time, so a
    deadline is never before the timeout has passed (ZooKeeper's ExpiryQueue rounds up too)."""
    x = SessionExpiry(tick_ms=50)
    x.created(5, 100)  # not tracking yet: the first tick finds it in the tree instead
    assert x.ticked(1_000, lambda: {5: 100, 6: 300}) == []  # 5: deadline 1_100 (a full timeout from here)
    x.created(7, 100)  # some time after 1_000: counted at 1_050, deadline 1_150
    x.touched((6,))  # likewise: deadline 1_350
    assert x.ticked(1_050, dict) == []
    assert x.ticked(1_100, dict) == [5]
    assert x.ticked(1_150, dict) == [7]
    x.closed(5)
    x.closed(7)
    assert x.ticked(1_300, dict) == []
    x.touched((6,))  # after 1_300: counted at 1_350, deadline 1_650
    assert x.ticked(1_600, dict) == [] and x.ticked(1_650, dict) == [6]


def test_expiry_stopped_by_a_role_change_gives_every_session_a_full_timeout_again():
    x = SessionExpiry(tick_ms=50)
    assert x.ticked(0, lambda: {1: 100}) == []
    x.stopped()
    x.touched((1,))  # no leader's clock meanwhile: the next leadership's reset decides
    assert x.ticked(90, lambda: {1: 100}) == []
    assert x.ticked(189, dict) == [] and x.ticked(190, dict) == [1]


def test_touching_sessions_every_tick_keeps_the_trackers_memory_one_entry_per_session():
    """1,000 sessions heard of on every tick of a 30 s timeout: the tracker holds one deadline per
    session and one bucket per tick of the window (it held a heap entry per touch: 600,000)."""
    expiry = SessionExpiry(50)
    sessions = {sid: 30_000 for sid in range(1, 1001)}
    now = 0
    for _ in range(600):
        expiry.touched(list(sessions))
        assert expiry.ticked(now, lambda: sessions) == []
        now += 50
    tracker = expiry.tracker
    assert len(tracker) == 1000 and len(tracker._heap) <= 30_000 // 50 + 1
    assert sum(len(b) for b in tracker._buckets.values()) == 1000
