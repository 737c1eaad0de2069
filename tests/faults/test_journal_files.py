"""Journal files a runner must refuse, before it writes anything to them."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ..runner_process import start_runner
from ._runner import digest, journal_files, one_line_naming, refused_start, start

pytestmark = pytest.mark.slow


async def _journal_with_calls(path: Path, calls: int = 30) -> None:
    """A real journal, big enough that a page in its middle holds records."""
    async with (
        start_runner(path, "--max-sessions", "64", "--drain-grace-ms", "100") as runner,
        runner.client() as client,
    ):
        for i in range(calls):
            payload = {"note": "x" * 2000, "i": str(i)}
            assert (
                await client.post("/v1/sessions", json=start(f"c{i}", clientContext=payload))
            ).status_code == 202
        runner.signal(15)
        await runner.wait_exit()


async def refused_unchanged(path: Path, words: str) -> None:
    """A runner started on ``path`` exits 1 with one line naming it and ``words``, its files untouched."""
    before = digest(*journal_files(path))
    code, stderr = await refused_start(path)
    assert code == 1
    one_line_naming(stderr, path, words)
    assert digest(*journal_files(path)) == before


async def test_a_damaged_page_is_refused_at_start_naming_the_file(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    await _journal_with_calls(journal)
    with closing(sqlite3.connect(journal)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = journal.stat().st_size
    assert size > 32 * 1024
    with journal.open("r+b") as file:
        file.seek(size // 2 // 4096 * 4096)
        file.write(b"\xa5" * 4096)
    await refused_unchanged(journal, "damaged")


async def test_a_foreign_sqlite_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    foreign = tmp_path / "app.db"
    with closing(sqlite3.connect(foreign)) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
        conn.execute("INSERT INTO people VALUES ('ada')")
        conn.commit()
    # Not switched to WAL, no migrations table: the file is as it was, and no -wal was made.
    await refused_unchanged(foreign, "not a runner journal")
    with closing(sqlite3.connect(foreign)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["people"]


async def test_a_file_that_is_not_sqlite_is_refused_unchanged(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 200)
    await refused_unchanged(notes, "cannot be read")


async def test_a_journal_from_a_newer_runner_is_refused(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    await _journal_with_calls(journal, calls=1)
    with closing(sqlite3.connect(journal)) as conn:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
            " VALUES ('curb-runner', '9999_future', 'x')"
        )
        conn.commit()
    await refused_unchanged(journal, "newer runner")
