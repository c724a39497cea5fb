"""One benchmark step: run it, and if it fails, record the failure in the report and go on
(a benchmark part measures what it can; the report lists what failed and why)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def recorded_step(name: str, body: Callable[[], T], *, progress: Callable[[str], None], failures: list[str],
                  label: str | None = None) -> T | None:
    """`body()`, or None after appending its traceback to `failures` under `name`; `label` is what
    the progress line says (default: `name`)."""
    progress(f"[{time.strftime('%H:%M:%S')}] {label or name} ...")
    try:
        return body()
    except Exception:  # noqa: BLE001 - recorded in the report, the part goes on
        failures.append(f"{name}:\n{traceback.format_exc()}")
        progress(f"  FAILED: {traceback.format_exc().splitlines()[-1]}")
        return None
