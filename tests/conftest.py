"""Shared pytest configuration."""

from __future__ import annotations

import os

import pytest


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
