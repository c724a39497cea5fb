"""The version `clusterd --version` and `clusterctl --version` print."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_version() -> str:
    """Quire's version: the installed distribution's, else the one pyproject.toml declares
    (a checkout run through PYTHONPATH without `pip install`), else "unknown"."""
    try:
        return metadata.version("quire")
    except metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
