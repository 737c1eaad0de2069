"""examples/host.py against two real runners: calls placed, each conversation printed once."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from ..runner_process import start_runner
from .helpers import TOKEN


async def _run_example(urls: list[str], state: Path, *extra: str) -> str:
    env = {**os.environ, "CURB_MANAGEMENT_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "examples.host", *urls, "--state-dir", str(state), "--talk-seconds", "0.2"]
    with trio.fail_after(60):
        done = await trio.run_process(
            [*argv, *extra], capture_stdout=True, capture_stderr=True, env=env, check=False
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


@pytest.mark.slow
async def test_the_example_host_places_follows_and_resumes(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "a.db") as a, start_runner(tmp_path / "b.db") as b:
        urls = [a.base_url, b.base_url]
        first = await _run_example(urls, tmp_path / "state", "--calls", "2", "--backend", "asyncio")
        placed = dict(re.findall(r"^placed (\S+) on (\S+)$", first, re.MULTILINE))
        # One call each: the pool put the second call where there was room.
        assert sorted(placed.values()) == sorted(urls)
        for session_id in placed:
            assert f"[{session_id}] started over loopback" in first
            assert first.count(f"[{session_id}] ended (host_done)") == 1

        second = await _run_example(urls, tmp_path / "state", "--calls", "1")
        (again,) = re.findall(r"^placed (\S+) on", second, re.MULTILINE)
        assert f"[{again}] ended (host_done)" in second
        # The saved cursors: nothing of the first run's calls is printed twice.
        assert not any(session_id in second for session_id in placed), (first, second)
