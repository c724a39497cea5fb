"""Znode paths, with ZooKeeper's rules (PathUtils.validatePath).

A valid path is absolute ("/" is the root), has no trailing "/" (except the root
itself), no empty segment, no "." or ".." segment, and no character that
ZooKeeper refuses: NUL, U+0001..U+001F, U+007F..U+009F, U+D800..U+F8FF,
U+FFF0..U+FFFF. ZooKeeper checks Java UTF-16 code units, so every character
outside the Basic Multilingual Plane (a surrogate pair in Java) is refused too.

A sequential create is validated with a digit appended (as ZooKeeper does), so
"/queue/" is a valid prefix for a sequential child named "/queue/0000000007".
"""

from __future__ import annotations

import re

from metastore.errors import BadArguments

ROOT = "/"
ZOOKEEPER = "/zookeeper"
QUOTA = "/zookeeper/quota"
CONFIG = "/zookeeper/config"
# DataTree.isSpecialPath: these can never be deleted (BadArguments).
SPECIAL = frozenset((ROOT, ZOOKEEPER, QUOTA, CONFIG))

_INVALID_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff]")


def validate_path(path: str, *, sequential: bool = False) -> None:
    """Raise BadArguments (with the reason) unless `path` is a valid znode path."""
    if not isinstance(path, str):
        raise BadArguments(None, "path must be a string")
    if sequential:
        path += "1"
    if not path:
        raise BadArguments(path, "path length must be > 0")
    if path[0] != "/":
        raise BadArguments(path, "path must start with / character")
    if len(path) == 1:
        return
    if path[-1] == "/":
        raise BadArguments(path, "path must not end with / character")
    bad = _INVALID_CHAR.search(path)
    if bad is not None:
        what = "null character" if bad.group() == "\x00" else "invalid character"
        raise BadArguments(path, f"{what} not allowed @{bad.start()}")
    for segment in path[1:].split("/"):
        if not segment:
            raise BadArguments(path, "empty node name specified")
        if segment in (".", ".."):
            raise BadArguments(path, "relative paths not allowed")


def parent_of(path: str) -> str:
    """"/a/b" -> "/a", "/a" -> "/". The root has no parent (BadArguments)."""
    if path == ROOT:
        raise BadArguments(path, "the root has no parent")
    return path[:path.rindex("/")] or ROOT


def basename(path: str) -> str:
    """"/a/b" -> "b"; the root's name is ""."""
    return path[path.rindex("/") + 1:]


def join(parent: str, name: str) -> str:
    return ("" if parent == ROOT else parent) + "/" + name


def split(path: str) -> tuple[str, str]:
    """(parent, name) of a path other than the root."""
    i = path.rindex("/")
    return (path[:i] or ROOT), path[i + 1:]


def sequential_path(path: str, parent_cversion: int) -> str:
    """The final path of a sequential create: the parent's create counter as %010d.

    The counter is the parent's internal cversion (number of children ever
    created), read at prepare time; after 2**31 creates it is negative, and the
    suffix then carries a minus sign, as in ZooKeeper.
    """
    return path + "%010d" % parent_cversion


def is_special(path: str) -> bool:
    return path in SPECIAL
