"""One runner owns a journal: a second one on the same file, or on a taken port, changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ..runner_process import read_stream, records, start_runner
from ._runner import journal_files, one_line_naming, refused_start, start

pytestmark = pytest.mark.slow


async def test_a_second_runner_on_the_same_journal_is_refused_and_the_first_goes_on(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with (
        start_runner(journal, "--max-sessions", "4", "--drain-grace-ms", "100") as first,
        first.client() as client,
    ):
        assert (await client.post("/v1/sessions", json=start("live"))).status_code == 202
        head = len(await read_stream(first, "from=0", until=lambda ls: len(records(ls)) >= 2))
        for command in ("serve", "dev"):
            async with start_runner(journal, command=command, wait_ready=False) as second:
                code = await second.wait_exit(timeout=60)
            assert code == 1
            one_line_naming([r for r in second.stderr if r.strip()], journal, "in use by another runner")
        # The live call was not "recovered" by the second runner, and the first still writes.
        assert (await client.get("/v1/sessions/live")).json()["state"] == "connected"
        assert (await client.post("/v1/sessions", json=start("after"))).status_code == 202
        stopped = await client.delete("/v1/sessions/live")
        assert stopped.status_code == 200 and stopped.json()["stopped"] is True
        lines = records(
            await read_stream(
                first,
                "from=0",
                until=lambda ls: any(
                    r["producer"] == "live" and r["body"].get("name") == "curb.ended" for r in ls
                ),
            )
        )
        assert len(lines) > head
        reasons = [r["body"]["payload"]["reason"] for r in lines if r["body"].get("name") == "curb.ended"]
        assert reasons == ["stopped_by_host"]
        assert not any(r["body"].get("event") == "recovered" for r in lines)
        first.signal(signal.SIGTERM)
        assert await first.wait_exit() == 0
    assert not any("Traceback" in line for line in first.stderr)


async def test_a_taken_port_refuses_the_start_before_recovery(tmp_path: Path) -> None:
    crashed = tmp_path / "crashed.db"
    # A journal a kill left with an open call: a runner that starts on it would close it.
    async with start_runner(crashed) as runner, runner.client() as client:
        assert (await client.post("/v1/sessions", json=start("open-call"))).status_code == 202
        runner.kill()
        await runner.wait_exit()
    before = {p.name: p.read_bytes() if p.exists() else None for p in journal_files(crashed)}
    async with start_runner(tmp_path / "other.db") as holder:
        code, stderr = await refused_start(crashed, "--address", holder.address)
    assert code == 1
    said = one_line_naming(stderr, Path(holder.address), "cannot listen")
    # What to do about it: the flag that moves this listener, and port 0.
    assert "another port with --address HOST:PORT; port 0 takes a free one" in said, said
    assert {p.name: p.read_bytes() if p.exists() else None for p in journal_files(crashed)} == before


async def test_a_taken_public_port_says_which_flag_moves_it(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "holder.db") as holder:
        taken = next(line for line in holder.stderr if "public listener on" in line).split()[-1]
        code, stderr = await refused_start(tmp_path / "other.db", "--public-address", taken)
    assert code == 1
    said = one_line_naming(stderr, Path(taken), "cannot listen")
    assert "another port with --public-address HOST:PORT; port 0 takes a free one" in said, said
