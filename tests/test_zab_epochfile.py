"""Epoch files: atomic writes, leftovers of a crash, corruption, the current <= accepted rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zab.storage.epochfile import (
    ACCEPTED_EPOCH,
    CURRENT_EPOCH,
    encode_epoch,
    parse_epoch,
    read_epoch,
    read_epochs,
    write_epoch,
)
from zab.storage.storage_errors import EpochFileError, StorageError
from zab.core.zxid import EPOCH_MAX


def test_new_node_reads_zero_zero(tmp_path):
    assert read_epochs(tmp_path) == (0, 0)


def test_write_then_read(tmp_path):
    write_epoch(tmp_path, ACCEPTED_EPOCH, 7)
    write_epoch(tmp_path, CURRENT_EPOCH, 6)
    assert read_epochs(tmp_path) == (7, 6)
    write_epoch(tmp_path, CURRENT_EPOCH, 7)
    assert read_epochs(tmp_path) == (7, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ACCEPTED_EPOCH, CURRENT_EPOCH]


def test_content_format(tmp_path):
    write_epoch(tmp_path, ACCEPTED_EPOCH, 12)
    content = (tmp_path / ACCEPTED_EPOCH).read_bytes()
    digits, crc = content.rstrip(b"\n").split(b" ")
    assert digits == b"12" and len(crc) == 8 and content.endswith(b"\n")
    assert len(encode_epoch(EPOCH_MAX)) == 20  # the longest content
    assert parse_epoch(encode_epoch(EPOCH_MAX)) == EPOCH_MAX


def test_crash_leftover_tmp_is_ignored_and_overwritten(tmp_path):
    # A crash between creating the tmp file and the rename leaves it behind.
    write_epoch(tmp_path, ACCEPTED_EPOCH, 3)
    (tmp_path / (ACCEPTED_EPOCH + ".tmp")).write_bytes(b"4 gar")
    (tmp_path / (CURRENT_EPOCH + ".tmp")).write_bytes(b"")
    assert read_epochs(tmp_path) == (3, 0)
    write_epoch(tmp_path, ACCEPTED_EPOCH, 4)
    assert read_epochs(tmp_path) == (4, 0)
    assert not (tmp_path / (ACCEPTED_EPOCH + ".tmp")).exists()


@pytest.mark.parametrize(
    "content",
    [b"", b"7", b"7\n", b"07 00000000\n", b"garbage\n", b"\x00" * 12, b"7 deadbeef\n", b"7 " + b"a" * 100],
)
def test_corrupt_file_names_the_file_and_the_remedy(tmp_path, content):
    (tmp_path / CURRENT_EPOCH).write_bytes(content)
    with pytest.raises(StorageError) as info:
        read_epochs(tmp_path)
    assert isinstance(info.value, EpochFileError)
    assert CURRENT_EPOCH in str(info.value) and "wipe" in str(info.value)


def test_flipped_digit_is_caught_by_the_checksum(tmp_path):
    write_epoch(tmp_path, ACCEPTED_EPOCH, 15)
    path = tmp_path / ACCEPTED_EPOCH
    path.write_bytes(path.read_bytes().replace(b"15", b"16", 1))
    with pytest.raises(EpochFileError, match="checksum"):
        read_epoch(tmp_path, ACCEPTED_EPOCH)


def test_current_above_accepted_is_refused(tmp_path):
    write_epoch(tmp_path, ACCEPTED_EPOCH, 2)
    write_epoch(tmp_path, CURRENT_EPOCH, 3)
    with pytest.raises(EpochFileError, match="more than"):
        read_epochs(tmp_path)


def test_current_without_accepted_is_refused(tmp_path):
    write_epoch(tmp_path, CURRENT_EPOCH, 1)
    with pytest.raises(EpochFileError):
        read_epochs(tmp_path)


def test_bad_names_and_values_are_bugs(tmp_path):
    with pytest.raises(ValueError):
        write_epoch(tmp_path, "epoch", 1)
    with pytest.raises(ValueError):
        write_epoch(tmp_path, ACCEPTED_EPOCH, -1)
    with pytest.raises(ValueError):
        write_epoch(tmp_path, ACCEPTED_EPOCH, EPOCH_MAX + 1)


def test_creates_missing_data_dir(tmp_path):
    data_dir: Path = tmp_path / "node1" / "data"
    write_epoch(data_dir, ACCEPTED_EPOCH, 1)
    assert read_epochs(data_dir) == (1, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_fuzz_parse_epoch(content):
    try:
        value = parse_epoch(content)
    except EpochFileError:
        return
    assert encode_epoch(value) == content


@settings(max_examples=200, deadline=None)
@given(st.integers(0, EPOCH_MAX), st.integers(0, 30), st.integers(0, 255))
def test_fuzz_mutated_epochs(value, position, byte):
    content = bytearray(encode_epoch(value))
    if position < len(content):
        content[position] = byte
    try:
        parsed = parse_epoch(bytes(content))
    except EpochFileError:
        return
    assert encode_epoch(parsed) == bytes(content)
