"""Znode paths: ZooKeeper's PathUtils.validatePath rules, and the helpers around them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.errors import BadArguments
from metastore.core.paths import basename, join, parent_of, sequential_path, split, validate_path

VALID = ["/", "/a", "/a/b", "/a/.../b", "/.a", "/a.", "/..a", "/é/ß", "/a b", "/a-\u00a0", "/\uf900", "/zookeeper"]
INVALID = [
    "", "a", "a/b", "/a/", "//", "//a", "/a//b",     # not absolute, trailing slash, empty segment
    "/.", "/..", "/a/.", "/a/../b", "/./a",           # relative segments
    "/a\x00b", "/\x01", "/\x1f", "/\x7f", "/\x9f",   # NUL and control characters
    "/\ud800", "/\ue000", "/\uf8ff", "/\ufff0", "/\uffff",  # surrogates, private use, specials
    "/\U0001f600",                                    # outside the BMP: a surrogate pair in Java
]


@pytest.mark.parametrize("path", VALID)
def test_valid_paths(path):
    validate_path(path)


@pytest.mark.parametrize("path", INVALID)
def test_invalid_paths_are_bad_arguments(path):
    with pytest.raises(BadArguments) as info:
        validate_path(path)
    assert info.value.code == -8


def test_a_sequential_prefix_may_end_with_a_slash():
    validate_path("/queue/", sequential=True)
    validate_path("/queue/item-", sequential=True)
    with pytest.raises(BadArguments):
        validate_path("/queue//", sequential=True)
    with pytest.raises(BadArguments):
        validate_path("/queue/", sequential=False)


def test_parent_basename_join_split():
    assert parent_of("/a/b/c") == "/a/b" and parent_of("/a") == "/"
    assert basename("/a/b") == "b" and basename("/") == ""
    assert join("/", "a") == "/a" and join("/a", "b") == "/a/b"
    assert split("/a/b") == ("/a", "b") and split("/a") == ("/", "a")
    with pytest.raises(BadArguments):
        parent_of("/")


def test_sequential_suffix_is_the_counter_as_ten_digits():
    assert sequential_path("/q/item-", 7) == "/q/item-0000000007"
    assert sequential_path("/q/", 2**31 - 1) == "/q/2147483647"
    assert sequential_path("/q/", -(2**31)) == "/q/-2147483648"  # after overflow, as Java's %010d


def _java_reference(path: str) -> bool:
    """PathUtils.validatePath transcribed over UTF-16 code units (the test's oracle)."""
    units = path.encode("utf-16-be", "surrogatepass")
    chars = [int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2)]
    if not chars or chars[0] != ord("/"):
        return False
    if len(chars) == 1:
        return True
    if chars[-1] == ord("/"):
        return False
    last = ord("/")
    for i in range(1, len(chars)):
        c = chars[i]
        dot, slash = ord("."), ord("/")
        if c == 0 or (c == slash and last == slash):
            return False
        if c == dot and last == dot:
            if chars[i - 2] == slash and (i + 1 == len(chars) or chars[i + 1] == slash):
                return False
        elif c == dot:
            if chars[i - 1] == slash and (i + 1 == len(chars) or chars[i + 1] == slash):
                return False
        elif 0 < c <= 0x1F or 0x7F <= c <= 0x9F or 0xD800 <= c <= 0xF8FF or 0xFFF0 <= c <= 0xFFFF:
            return False
        last = c
    return True


path_chars = st.sampled_from("/./a\x00\x1f\x7f\x9f\ud800\ue000\ufff0é\U0001f600")


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(st.text(path_chars, max_size=8) | st.text(max_size=8).map(lambda s: "/" + s))
def test_validate_path_agrees_with_zookeepers_rules(path):
    try:
        validate_path(path)
        ok = True
    except BadArguments:
        ok = False
    assert ok == _java_reference(path)
