"""Shared pytest configuration."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Every hypothesis test is deterministic: the same examples on every run, no example database, so
# a failure replays exactly (a test's own @settings inherits this and may only change other fields).
settings.register_profile("quire", derandomize=True, database=None)
settings.load_profile("quire")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="run the long randomized tests marked @pytest.mark.soak (see docs/testing.md)")


def pytest_configure(config: pytest.Config) -> None:
    # Runs before test modules are imported: --soak also raises the example counts
    # that tests read from QUIRE_SOAK at import time.
    if config.getoption("--soak"):
        os.environ.setdefault("QUIRE_SOAK", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (the Spark verifiers' tests): 2 cores,
    2 shuffle partitions, no UI. The JVM starts once; every verifier reuses it (getOrCreate)."""
    from replay.spark_session import build_session  # only sessions that use Spark pay for importing it
    session = build_session("local[2]", app_name="quire-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _collect_everything_again():
    """A driver run in this process freezes what is alive (edge/long_lived.py); thawed after each
    test, so that what the test left behind is collected like anything else."""
    yield
    from edge import long_lived
    long_lived.thaw()
