"""Text tables for people (clusterctl status, bookie ls, the demo): the one place they are laid
out, by tabulate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned on two spaces, no rules: easy to read and to cut with awk."""
    return tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True, stralign="left")
