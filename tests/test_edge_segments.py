"""edge/segments.py on real files: the newest segment's writer and fail-stop."""

from __future__ import annotations

import os

import pytest

from edge.segments import FailStop, SegmentWriter, remove_durably, truncate_durably


class LogBroken(Exception):
    pass


def test_a_sealed_segment_ends_at_its_records_and_a_reopened_one_continues(tmp_path):
    path = tmp_path / "seg.1"
    writer = SegmentWriter.create(path, b"HEAD", preallocate_bytes=1 << 16)
    writer.write(b"rec1", 4)
    assert writer.datasync() and not writer.datasync()  # nothing new: no second fdatasync
    assert path.stat().st_size > 1 << 16  # preallocated past the records
    assert writer.seal(8)
    assert path.read_bytes() == b"HEADrec1"
    again = SegmentWriter(path, preallocate_bytes=1 << 16)  # another run: opened on first use
    again.write(b"rec2", 8)
    assert again.seal(12)
    assert path.read_bytes() == b"HEADrec1rec2"


def test_seal_cuts_zero_fill_even_of_a_segment_this_run_never_wrote(tmp_path):
    path = tmp_path / "seg.2"
    path.write_bytes(b"HEADrec1" + bytes(1000))  # a crashed run's preallocation
    assert SegmentWriter(path, preallocate_bytes=4096).seal(8)
    assert path.read_bytes() == b"HEADrec1"


def test_a_new_segment_never_overwrites_an_existing_file(tmp_path):
    path = tmp_path / "seg.3"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        SegmentWriter.create(path, b"HEAD", preallocate_bytes=4096)
    assert path.read_bytes() == b"old"


def test_after_a_disk_error_the_log_refuses_everything_with_its_own_error():
    stop = FailStop(LogBroken, "journal /x", "restart the bookie")
    assert stop.run(lambda: 5) == 5

    def failing() -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(LogBroken, match="restart the bookie"):
        stop.run(failing)
    with pytest.raises(LogBroken, match="failed earlier"):
        stop.check()


def test_truncate_and_remove_are_durable_operations_on_real_files(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    truncate_durably(path, 3)
    assert path.read_bytes() == b"abc"
    remove_durably(path)
    assert not path.exists() and os.listdir(tmp_path) == []
