"""Where a tablespace lives (pure): its znodes under /tablespaces/<name> (`leader`, ephemeral;
`checkpoint`) and its named log, `tablespace.<name>`."""

from __future__ import annotations

ROOT = "/tablespaces"


def log_name(tablespace: str) -> str:
    return f"tablespace.{tablespace}"


def leader_path(tablespace: str) -> str:
    return f"{ROOT}/{tablespace}/leader"


def checkpoint_path(tablespace: str) -> str:
    return f"{ROOT}/{tablespace}/checkpoint"


def checkpoint_password(tablespace: str) -> bytes:
    """The checkpoint ledgers' password. Not a secret: every replica needs it."""
    return f"quire-tablespace:{tablespace}".encode()
