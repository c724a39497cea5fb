"""edge/long_lived.py: the node's long-lived objects are frozen out of the cyclic collector's full
collections, and the garbage among new objects is still collected at each settle."""

from __future__ import annotations

import gc
import weakref

import pytest

from edge import long_lived


class Cyclic:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def thawed():
    long_lived.thaw()  # the test process keeps collecting everything
    yield
    long_lived.thaw()


def test_what_is_alive_at_a_settle_is_frozen_and_new_garbage_is_still_collected():
    alive = [Cyclic() for _ in range(1000)]
    before = long_lived.frozen_objects()
    long_lived.settle("test")
    assert long_lived.frozen_objects() >= before + 1000
    garbage = Cyclic()
    gone = weakref.ref(garbage)
    del garbage
    long_lived.settle("test")  # collects what is not frozen yet
    assert gone() is None
    assert len(alive) == 1000


def test_the_collector_is_off_while_a_state_is_built_and_back_on_after():
    assert gc.isenabled()
    with long_lived.building("test"):
        assert not gc.isenabled()
        long_lived.suspend()  # a SnapBegin after another: still off, one resume turns it on
    assert gc.isenabled()
    long_lived.suspend()
    long_lived.resume()
    long_lived.resume()  # a SnapDiscard after the install: harmless
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off():
    gc.disable()
    try:
        with long_lived.building("test"):
            pass
        long_lived.resume()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_state_built_with_the_collector_off_is_frozen_without_a_collection():
    """A collection then would traverse the whole new state (a restored tree of a million znodes:
    0.41 s) and find nothing: what was built is alive."""
    frozen, collections = gc.get_freeze_count(), sum(g["collections"] for g in gc.get_stats())
    with long_lived.building("test"):
        alive = [[i] for i in range(1000)]
    assert gc.get_freeze_count() >= frozen + 1000
    assert sum(g["collections"] for g in gc.get_stats()) == collections
    assert len(alive) == 1000
