"""The bookie journal's preallocated segments (bookie/journal.py): records are written in place into
zero fill, the zero fill is a clean end only in the newest segment, and a rolled segment ends at its
last record. Real files, real fsync."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookie.journal import PREALLOCATE_BYTES, Journal, JournalCorrupt
from bookie.storage_codec import FILE_HEADER_BYTES, JournalRecord, Kind, encode_journal_record, scan_journal

SEGMENT_BYTES = 64 << 10


def _record(entry_id: int, size: int = 100) -> bytes:
    return encode_journal_record(JournalRecord(Kind.ADD, 7, entry_id, bytes([entry_id % 251]) * size))


def _open(path: Path) -> Journal:
    return Journal.open(path, from_seq=1, segment_bytes=SEGMENT_BYTES)


def _entry_ids(journal: Journal) -> list[int]:
    return [record.value for record in journal.records()]


def test_the_newest_segment_is_preallocated_and_its_zero_fill_is_a_clean_end(tmp_path, caplog):
    journal = _open(tmp_path)
    for i in range(10):
        journal.append([_record(i)])
        journal.sync()
    journal.close()
    (segment,) = sorted(tmp_path.iterdir())
    records_end = FILE_HEADER_BYTES + 10 * len(_record(0))
    assert segment.stat().st_size == FILE_HEADER_BYTES + PREALLOCATE_BYTES
    scan = scan_journal(segment.read_bytes(), FILE_HEADER_BYTES)
    assert (scan.end, scan.stop, scan.zero_fill) == (records_end, None, True)

    journal = _open(tmp_path)
    assert _entry_ids(journal) == list(range(10))
    assert segment.stat().st_size == FILE_HEADER_BYTES + PREALLOCATE_BYTES, "a clean end is not cut"
    assert "truncating" not in caplog.text
    journal.append([_record(10)])  # after the last record, not after the zero fill
    journal.sync()
    journal.close()
    assert _entry_ids(_open(tmp_path)) == list(range(11))


def test_a_record_larger_than_the_preallocation_grows_the_file(tmp_path):
    journal = _open(tmp_path)
    big = _record(0, PREALLOCATE_BYTES + 1000)
    journal.append([_record(1), big])
    journal.sync()
    journal.close()
    assert _entry_ids(_open(tmp_path)) == [1, 0]


def test_rolled_segments_end_at_their_last_record_and_zero_fill_there_is_refused(tmp_path):
    journal = _open(tmp_path)
    for i in range(2000):  # about 3 segments of SEGMENT_BYTES
        journal.append([_record(i)])
    journal.sync()
    journal.close()
    segments = sorted(tmp_path.iterdir())
    assert len(segments) >= 3
    for segment in segments[:-1]:
        raw = segment.read_bytes()
        scan = scan_journal(raw, FILE_HEADER_BYTES)
        assert (scan.end, scan.stop, scan.zero_fill) == (len(raw), None, False), segment.name
    assert _entry_ids(_open(tmp_path)) == list(range(2000))

    with open(segments[0], "ab") as file:  # as if its records had been lost to zeros
        file.write(bytes(4096))
    with pytest.raises(JournalCorrupt, match="only the newest segment is preallocated"):
        _open(tmp_path)


def test_a_roll_right_after_reopening_cuts_the_zero_fill_of_the_segment_it_closes(tmp_path):
    journal = _open(tmp_path)
    journal.append([_record(0)])
    journal.sync()
    journal.close()
    journal = _open(tmp_path)
    journal.roll()  # as a checkpoint does, before anything else was written in this run
    journal.append([_record(1)])
    journal.sync()
    journal.close()
    first = sorted(tmp_path.iterdir())[0]
    assert first.stat().st_size == FILE_HEADER_BYTES + len(_record(0))
    assert _entry_ids(_open(tmp_path)) == [0, 1]


def test_a_torn_record_inside_the_zero_fill_is_cut(tmp_path):
    journal = _open(tmp_path)
    journal.append([_record(0), _record(1)])
    journal.sync()
    journal.close()
    (segment,) = sorted(tmp_path.iterdir())
    torn = _record(2)
    with open(segment, "r+b") as file:
        file.seek(FILE_HEADER_BYTES + 2 * len(torn))
        file.write(torn[: len(torn) // 2])
    journal = _open(tmp_path)
    assert _entry_ids(journal) == [0, 1]
    journal.append([_record(3, 10)])  # shorter than the torn bytes it lands on: they were cut first
    journal.sync()
    journal.close()
    assert _entry_ids(_open(tmp_path)) == [0, 1, 3]
