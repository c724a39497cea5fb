"""The bookie journal in a directory of its own (a device of its own, BookKeeper's journalDirectories).

`BookieStorage.open(..., journal_directory=J)` makes `<bookie dir>/journal` a link to J and keeps a
copy of the bookie's cookie in J. What must be refused: a journal already in place elsewhere,
another bookie's journal, a journal device that was wiped, replaced or is not mounted.
(tests/test_bookie_sigkill.py kills a bookie whose journal is linked this way.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bookie_fixtures import trio_test

from bookie.entry import Digester, DigestType, master_key
from bookie.errors import CookieMismatch, StorageError
from bookie.storage import AddRequest, BookieStorage, BookieStorageConfig

KEY = master_key(b"pw")
DIGESTER = Digester(DigestType.CRC32C, b"pw")
SMALL = BookieStorageConfig(journal_segment_bytes=4096, entry_log_bytes=8192, checkpoint_every_bytes=16384)


async def _open(directory: Path, journal: Path | None, bookie_id: int = 1) -> BookieStorage:
    return await BookieStorage.open(directory, bookie_id, SMALL, journal_directory=journal)


async def _fill(storage: BookieStorage, ledger: int, count: int) -> None:
    for entry in range(count):
        data = DIGESTER.package(ledger, entry, entry - 1, 0, b"x%d" % entry)
        await storage.add(AddRequest(ledger, entry, KEY, data))


async def _bookie_with_its_journal_inside(directory: Path) -> None:
    """Five adds, closed without a checkpoint: they are in the journal under `directory` only."""
    storage = await _open(directory, None)
    await _fill(storage, 1, 5)
    await storage.close(checkpoint=False)


@trio_test
async def test_the_journal_lives_in_the_configured_directory_and_survives_a_restart(tmp_path):
    directory, journal = tmp_path / "bookie", tmp_path / "disk2" / "journal"
    storage = await _open(directory, journal)
    await _fill(storage, 1, 20)
    await storage.close(checkpoint=False)  # the entries are only in the journal's replay
    assert (directory / "journal").is_symlink() and (directory / "journal").resolve() == journal.resolve()
    assert list(journal.glob("journal.*")) and (journal / "cookie").read_bytes() == (directory / "cookie").read_bytes()
    storage = await _open(directory, journal)
    assert [DIGESTER.verify(storage.read(1, e)).payload for e in range(20)] == [b"x%d" % e for e in range(20)]
    await storage.close()


@trio_test
async def test_a_journal_already_inside_the_bookie_directory_is_not_left_behind(tmp_path):
    directory = tmp_path / "bookie"
    await _bookie_with_its_journal_inside(directory)
    with pytest.raises(StorageError, match="move .* files to"):
        await _open(directory, tmp_path / "disk2")
    assert not (directory / "journal").is_symlink()  # nothing changed: it still opens where it was
    storage = await _open(directory, None)
    assert storage.lac(1) >= 3
    await storage.close()


@trio_test
async def test_a_link_to_another_directory_than_the_configured_one_is_refused(tmp_path):
    directory = tmp_path / "bookie"
    await (await _open(directory, tmp_path / "disk2")).close()
    with pytest.raises(StorageError, match="not to the configured journal directory"):
        await _open(directory, tmp_path / "disk3")


@trio_test
async def test_a_journal_directory_with_foreign_files_and_no_cookie_is_refused(tmp_path):
    journal = tmp_path / "disk2"
    journal.mkdir()
    (journal / "journal.0000000000000001").write_bytes(b"not ours")
    with pytest.raises(StorageError, match="not empty and has no bookie cookie"):
        await _open(tmp_path / "bookie", journal)


@trio_test
async def test_swapped_journal_directories_are_refused(tmp_path):
    for bookie_id in (1, 2):
        storage = await _open(tmp_path / f"bookie{bookie_id}", tmp_path / f"journal{bookie_id}", bookie_id)
        await _fill(storage, 1, 3)
        await storage.close()
    (tmp_path / "bookie1" / "journal").unlink()  # the operator points bookie 1 at bookie 2's journal
    with pytest.raises(CookieMismatch, match="journal of bookie 2"):
        await _open(tmp_path / "bookie1", tmp_path / "journal2")


@trio_test
@pytest.mark.parametrize("checkpoint", [True, False])
async def test_a_wiped_or_unmounted_journal_device_is_refused(tmp_path, checkpoint):
    directory, journal = tmp_path / "bookie", tmp_path / "disk2"
    storage = await _open(directory, journal)
    await _fill(storage, 1, 40)  # past SMALL's checkpoint trigger: entry logs exist either way
    if checkpoint:
        await storage.checkpoint()
    await storage.close(checkpoint=False)
    shutil.rmtree(journal)  # an empty device, or none mounted where the link points
    with pytest.raises(CookieMismatch, match="wiped, replaced or is not mounted"):
        await _open(directory, journal)


@trio_test
async def test_a_journal_of_an_older_layout_gets_its_cookie_copy(tmp_path):
    directory = tmp_path / "bookie"
    await _bookie_with_its_journal_inside(directory)
    (directory / "journal" / "cookie").unlink()  # written by a version without journal cookies
    storage = await _open(directory, None)
    assert (directory / "journal" / "cookie").read_bytes() == (directory / "cookie").read_bytes()
    assert DIGESTER.verify(storage.read(1, 4)).payload == b"x4"
    await storage.close()
