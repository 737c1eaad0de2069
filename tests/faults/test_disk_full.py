"""A full disk under the journal: refuse new calls, answer every request, finish once it can.

The journal lives on a 3 MiB tmpfs mounted in the runner's own mount namespace
(``unshare -m``, root as in CI); the test fills and frees it from inside that namespace
(``nsenter``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ..runner_process import read_stream, records, start_runner
from ..websocket.ino_client import RUNNER_ENV, Addresses, InoSocket, agent_ref, connect, public_address
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


async def test_a_settings_change_refused_on_a_full_disk_changes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "disk"
    journal = directory / "j.db"
    async with (
        start_runner(
            journal, "--drain-grace-ms", "100", agent="tests.agents:tunable", prefix=_in_tmpfs(directory)
        ) as runner,
        runner.client() as client,
    ):
        disk = Disk(runner.process.pid, directory)
        assert (await client.post("/v1/sessions", json=start("c1"))).status_code == 202
        await disk.fill()
        refused = await client.patch("/v1/sessions/c1", json={"tts": {"voice": "en+f3"}})
        assert refused.status_code == 409 and refused.json()["error"] == "runner_at_capacity", refused.text
        await disk.free()
        # Once it can write, an unrelated change shows the voice as it was: the refused one
        # was never applied (it was before, with no record of it).
        with trio.fail_after(10):
            while (
                after := await client.patch("/v1/sessions/c1", json={"stt": {"language": "en"}})
            ).status_code == 409:
                await trio.sleep(0.2)
        assert after.status_code == 200, after.text
        assert after.json()["settings"]["tts"]["voice"] == "en"
        lines = records(
            await read_stream(runner, "from=0", until=lambda ls: len(records(ls)) >= 3, timeout=10)
        )
        settings = [r["body"]["payload"] for r in lines if r["body"].get("name") == "curb.settings"]
        assert [s["outcome"] for s in settings] == ["accepted"]
        assert settings[0]["settings"]["tts"]["voice"] == "en"


@asynccontextmanager
async def _speaking_on_a_small_disk(
    tmp_path: Path, end_user: str
) -> AsyncIterator[tuple[Disk, InoSocket, str]]:
    """A speaking agent's runner on a small tmpfs, and a socket of a new person's conversation.

    Yields the disk, the socket and the conversation's id. On exit, a copy of the journal's
    files is at ``tmp_path/copy`` (the tmpfs leaves with the runner's mount namespace).
    """
    directory = tmp_path / "disk"
    journal = directory / "j.db"
    async with start_runner(
        journal, agent=agent_ref("speaking"), env=RUNNER_ENV, prefix=_in_tmpfs(directory)
    ) as runner:
        addresses = Addresses(management=runner.address, public=public_address(runner.stderr) or "")
        disk = Disk(runner.process.pid, directory)
        token, session_id = await addresses.api().person(end_user)
        async with connect(addresses, token, session_id, tools=["open_page"]) as sock:
            yield disk, sock, session_id
        copy = tmp_path / "copy"
        copy.mkdir()
        await disk._run(f"cp {journal} {journal}-wal {copy}/")


async def test_turns_finished_on_a_full_disk_are_stored_and_charged_alike(tmp_path: Path) -> None:
    async with _speaking_on_a_small_disk(tmp_path, "eu-full") as (disk, sock, session_id):
        await sock.say("When is checkout?")
        # The next turns finish (their usage frame sent) while the disk is full.
        for _ in range(3):
            await sock.send("user_message", text="Please open page spa")
            call = (await sock.until_type("tool.call"))[-1]
            await disk.fill()
            await sock.send("tool.result", call_id=call["call_id"], result="The spa page is open.")
            frames = await sock.turn_end()
            assert "usage" in [f["type"] for f in frames]
            await disk.free()
    # Each turn's write ended before its last frame: a copy of the files shows them all.
    with sqlite3.connect(tmp_path / "copy" / "j.db") as conn:
        stored = {
            t
            for (t,) in conn.execute(
                "SELECT DISTINCT turn_id FROM agent_messages WHERE conversation_id = ?", (session_id,)
            )
        }
        charged = {
            t
            for (t,) in conn.execute(
                "SELECT DISTINCT turn_id FROM agent_usage WHERE conversation_id = ?", (session_id,)
            )
        }
    # Each turn is either kept and charged, or (its write refused) neither: never one alone.
    assert stored == charged
    assert len(stored) >= 1


async def test_a_turn_whose_record_fails_after_its_usage_is_neither_kept_nor_charged(tmp_path: Path) -> None:
    failed: dict[str, str] = {}  # the turns that failed: their id, and the words only they said
    finished: dict[str, str] = {}
    async with _speaking_on_a_small_disk(tmp_path, "eu-failed") as (disk, sock, _):
        await sock.say("When is checkout?")
        for i in range(3):
            await sock.send("user_message", text="Please open page spa")
            call = (await sock.until_type("tool.call"))[-1]
            await disk.fill()
            marker = f"The spa page is open, reference Q{i}X."
            await sock.send("tool.result", call_id=call["call_id"], result=marker)
            frames = await sock.turn_end()
            # The model answered (its usage was sent), then the turn's record could not be written.
            assert "usage" in [f["type"] for f in frames], frames
            (failed if frames[-1]["type"] == "interrupted" else finished)[call["turn"]] = marker
            await disk.free()
        # A turn on a disk with room again: it must not take the failed turns' words along.
        await sock.say("When is breakfast?")
    assert failed, "no turn failed on the full disk: the test did not reach its case"
    with sqlite3.connect(tmp_path / "copy" / "j.db") as conn:
        contents = [c for (c,) in conn.execute("SELECT content FROM agent_messages")]
        charged = {t for (t,) in conn.execute("SELECT DISTINCT turn_id FROM agent_usage")}
    for turn, marker in failed.items():
        # What the person was told failed is kept nowhere: neither its words nor its charge.
        assert not any(marker in c for c in contents), (turn, marker)
        assert turn not in charged, turn
    for turn, marker in finished.items():
        assert any(marker in c for c in contents) and turn in charged, (turn, marker)
