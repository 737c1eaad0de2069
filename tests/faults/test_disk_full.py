"""A full disk under the journal: refuse new calls, answer every request, finish once it can.

The journal lives on a 3 MiB tmpfs mounted in the runner's own mount namespace
(``unshare -m``, root as in CI); the test fills and frees it from inside that namespace
(``nsenter``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ..runner_process import read_stream, records, start_runner
from ._runner import start

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _root_and_util_linux() -> None:
    # As the LiveKit tests do: a machine that cannot run these fails them, it does not skip them.
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.fail(
            "the disk-full tests mount a tmpfs in a namespace of their own: they need root and "
            "util-linux (unshare, nsenter), as .ci/run has",
            pytrace=False,
        )


class Disk:
    """The tmpfs of one runner, filled and freed from inside its mount namespace."""

    def __init__(self, pid: int, directory: Path) -> None:
        self.pid = pid
        self.directory = directory

    async def _run(self, script: str) -> None:
        await trio.run_process(
            ["nsenter", "-t", str(self.pid), "-m", "--", "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    async def fill(self) -> None:
        await self._run(f"dd if=/dev/zero of={self.directory}/fill bs=4k; sync")

    async def free(self) -> None:
        await self._run(f"rm -f {self.directory}/fill")


def _in_tmpfs(directory: Path) -> list[str]:
    return ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "tests.faults._in_tmpfs",
            str(directory), "3m", "--"]  # fmt: skip


async def test_a_full_disk_refuses_new_calls_and_stops_once_it_can_write(tmp_path: Path) -> None:
    directory = tmp_path / "disk"
    journal = directory / "j.db"
    async with (
        start_runner(
            journal, "--max-sessions", "8", "--drain-grace-ms", "100", prefix=_in_tmpfs(directory)
        ) as runner,
        runner.client() as client,
    ):
        disk = Disk(runner.process.pid, directory)
        assert (await client.post("/v1/sessions", json=start("c1"))).status_code == 202
        await disk.fill()
        # The stop of a live call answers at once, and says its end is not written yet.
        with trio.fail_after(10):
            stop = await client.delete("/v1/sessions/c1")
        assert stop.status_code == 409 and stop.json()["error"] == "runner_at_capacity", stop.text
        # A new call is refused with the documented code, and nothing of it is registered.
        refused = await client.post("/v1/sessions", json=start("c2"))
        assert refused.status_code == 409 and refused.json()["error"] == "runner_at_capacity", refused.text
        sessions = (await client.get("/v1/runner")).json()["sessions"]
        assert "c2" not in [s["sessionId"] for s in sessions]
        await disk.free()
        # Once it can write, the stopped call's end is written without a restart.
        with trio.fail_after(10):
            while True:
                again = await client.delete("/v1/sessions/c1")
                if again.status_code == 200:
                    break
                assert again.status_code == 409
                await trio.sleep(0.2)
        assert (await client.post("/v1/sessions", json=start("c3"))).status_code == 202
        lines = records(
            await read_stream(
                runner, "from=0", until=lambda ls: any(r["producer"] == "c3" for r in ls), timeout=10
            )
        )
        ends = [(r["producer"], r["body"]["name"]) for r in lines if r["producer"] != "runner"]
        assert [p for p, name in ends if name == "curb.started"] == ["c1", "c3"]
        assert ("c1", "curb.ended") in ends
        # SIGTERM while the disk is full: a clean exit within the shutdown deadline, no traceback.
        await disk.fill()
        runner.signal(signal.SIGTERM)
        code = await runner.wait_exit(timeout=30)
        assert code in (0, 1)
    stderr = "\n".join(runner.stderr)
    assert "database or disk is full" in stderr
    assert "cannot rollback" not in stderr and "Traceback" not in stderr, stderr
