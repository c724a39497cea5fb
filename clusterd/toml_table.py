"""Reading one TOML table of `cluster.toml`: each key taken once, typed, bounded, the rest refused.

`ConfigError` lives here so that the reader and the loader (clusterd/config.py, which re-exports
it) raise the same error; every message names the file, the table and the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """The configuration is unusable; the message names the file, the place and the fix."""


class Table:
    """One TOML table being read: takes keys one by one, then refuses what is left over."""

    _REQUIRED = object()

    def __init__(self, data: dict[str, Any], path: Path, where: str) -> None:
        self._data = dict(data)
        self._known: list[str] = []
        self._path = path
        self._where = where

    def fail(self, key: str, problem: str) -> None:
        raise ConfigError(f"{self._path}: {self._where}: key {key!r}: {problem}")

    def take(self, key: str, kind: type, default: Any = _REQUIRED, required_hint: str = "") -> Any:
        self._known.append(key)
        if key not in self._data:
            if default is self._REQUIRED:
                hint = f" ({required_hint})" if required_hint else ""
                raise ConfigError(f"{self._path}: {self._where}: missing required key {key!r}{hint}")
            return default
        value = self._data.pop(key)
        # bool is an int subclass in Python, but `port = true` is a typo, not a port.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(key, f"expected {_KIND_NAMES[kind]}, got {describe(value)}")
        return value

    def take_int(self, key: str, *, default: Any = _REQUIRED, minimum: int, maximum: int | None = None) -> int:
        value = self.take(key, int, default)
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            self.fail(key, f"must be {bounds}, got {value}")
        return value

    def take_str(self, key: str, *, default: Any = _REQUIRED) -> str:
        value = self.take(key, str, default)
        if not value.strip():
            self.fail(key, "must not be empty")
        return value

    def finish(self) -> None:
        for key in self._data:
            raise ConfigError(f"{self._path}: {self._where}: unknown key {key!r}"
                              f"{suggest(key, self._known)} (known: {', '.join(self._known)})")


_KIND_NAMES = {int: "an integer", str: "a string", list: "an array", dict: "a table"}


def describe(value: Any) -> str:
    """A TOML value as a message shows it: its TOML kind, and the value itself unless a table or array."""
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}" if kind not in ("array", "table") else kind


def suggest(word: Any, choices: Any) -> str:
    """` (did you mean 'x'?)` for the closest of `choices` to a misspelt `word`, or nothing."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
