"""A journal file deleted or replaced under a running runner: noticed, no more writes, the path held."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ..runner_process import start_runner
from ._runner import journal_files, one_line_naming, start

pytestmark = pytest.mark.slow


def _delete(journal: Path) -> None:
    for path in journal_files(journal):  # as `rm j.db*` does
        path.unlink(missing_ok=True)


def _replace(journal: Path) -> None:
    other = journal.with_name("other.db")
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    os.replace(other, journal)


@pytest.mark.parametrize(("how", "words"), [(_delete, "was deleted"), (_replace, "was replaced")])
async def test_a_journal_file_taken_away_stops_writes_and_keeps_its_path(
    tmp_path: Path, how: object, words: str
) -> None:
    journal = tmp_path / "j.db"
    async with (
        start_runner(journal, "--max-sessions", "4", "--drain-grace-ms", "100") as runner,
        runner.client() as client,
    ):
        assert (await client.post("/v1/sessions", json=start("c1"))).status_code == 202
        assert callable(how)
        how(journal)
        after = {p.name: p.exists() for p in journal_files(journal)}
        # Nothing more is acknowledged: a record written now would vanish with the process.
        refused = await client.post("/v1/sessions", json=start("c2"))
        assert refused.status_code == 409 and refused.json()["error"] == "runner_at_capacity", refused.text
        assert words in refused.json()["detail"], refused.text
        stop = await client.delete("/v1/sessions/c1")
        assert stop.status_code == 409 and stop.json()["error"] == "runner_at_capacity", stop.text
        assert (await client.get("/health")).status_code == 200
        # The path is still this runner's: a second one is refused and creates nothing there.
        async with start_runner(journal, wait_ready=False) as second:
            code = await second.wait_exit(timeout=60)
        assert code == 1
        one_line_naming([r for r in second.stderr if r.strip()], journal, "in use by another runner")
        assert {p.name: p.exists() for p in journal_files(journal)} == after
        # The log says what happened once, and where the records can still be copied from.
        said = [line for line in runner.stderr if words in line]
        assert said, runner.stderr[-10:]
        found = re.search(r"(/proc/\d+/fd/\d+)", said[0])
        assert found, said[0]
        rescued = tmp_path / "rescued.db"
        shutil.copyfile(found.group(1), rescued)
    with closing(sqlite3.connect(rescued)) as conn:
        bodies = [b for (b,) in conn.execute("SELECT body FROM records WHERE producer = 'c1'")]
    assert any('"curb.started"' in b for b in bodies), bodies
