"""A runner process across its life: restarts, kills, signals, and stream readers that misbehave."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from .runner_process import open_events, read_stream, start_runner

pytestmark = pytest.mark.slow


def _start(session_id: str, **extra: object) -> dict[str, object]:
    return {"sessionId": session_id, "realtimeUrl": "loopback:", "realtimeToken": "t", **extra}


async def test_restart_then_resume_from_the_last_envelope(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with (
        start_runner(journal, "--max-sessions", "4", "--drain-grace-ms", "200") as runner,
        runner.client() as client,
    ):
        for i in range(3):
            await client.post("/v1/sessions", json=_start(f"c{i}"))
        seen = await read_stream(runner, "from=0", until=lambda ls: len(ls) >= 4)
        runner.signal(signal.SIGTERM)
        assert await runner.wait_exit() == 0
    last = seen[-1]["envelope"]
    async with start_runner(journal) as runner:
        resumed = await read_stream(
            runner, f"from={last}", until=lambda ls: any(line["body"].get("event") == "ready" for line in ls)
        )
    envelopes = [line["envelope"] for line in resumed]
    assert envelopes == list(range(last + 1, last + 1 + len(envelopes)))
    kinds = [(line["producer"], line["body"].get("event") or line["body"].get("name")) for line in resumed]
    # The calls ended by the drain, the runner's own end, then the new runner's start.
    assert (
        ("runner", "draining") in kinds and ("runner", "ended") in kinds and kinds[-1] == ("runner", "ready")
    )
    assert {p for p, name in kinds if name == "curb.ended"} == {"c0", "c1", "c2"}


# The runner is killed under requests in flight; httpx then leaves sockets to the garbage
# collector (encode/httpx#3777), which is its warning, not the runner's.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_kill_during_a_burst_loses_nothing_a_reader_saw(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    seen: list[dict[str, object]] = []
    async with start_runner(journal, "--max-sessions", "400") as runner, runner.client() as client:
        async with open_events(runner, "from=0") as events:

            async def burst(worker: int) -> None:
                for i in range(100):
                    try:
                        await client.post("/v1/sessions", json=_start(f"w{worker}-{i}"))
                    except Exception:  # noqa: BLE001 - the runner was killed under us: any failure
                        return

            async with trio.open_nursery() as nursery:
                for worker in range(8):
                    nursery.start_soon(burst, worker)
                seen.extend(await events.lines(150))
                runner.kill()
                with trio.move_on_after(5):
                    seen.extend(await events.lines())
        assert await runner.wait_exit() == -signal.SIGKILL
    assert len(seen) >= 150
    async with start_runner(journal, "--max-sessions", "1") as runner:
        after = await read_stream(
            runner, "from=0", until=lambda ls: any(line["body"].get("event") == "ready" for line in ls[1:])
        )
    stored = {line["envelope"]: line for line in after}
    for line in seen:
        assert stored[line["envelope"]] == line  # every record a reader was sent is still there, unchanged
    envelopes = [line["envelope"] for line in after]
    assert envelopes == list(range(1, len(envelopes) + 1))
    # The restart closed every call the kill left open, so no conversation stays truncated.
    started = {line["producer"] for line in after if line["body"].get("name") == "curb.started"}
    ended = {
        line["producer"]: line["body"]["payload"]["reason"]
        for line in after
        if line["body"].get("name") == "curb.ended"
    }
    assert started and set(ended) == started
    assert set(ended.values()) == {"runner_crashed"}
    recovered = [line["body"] for line in after if line["body"].get("event") == "recovered"]
    assert len(recovered) == 1 and set(recovered[0]["closedSessions"]) == started


async def test_sigterm_drains_writes_ended_before_the_listener_closes(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "60000") as runner:
        async with open_events(runner, "from=0") as events:
            assert (await events.lines(1))[0]["body"]["event"] == "ready"
            runner.signal(signal.SIGTERM)
            with trio.fail_after(10):
                rest = await events.lines()  # to the end of the stream
        assert await runner.wait_exit() == 0
    assert [(line["body"]["event"], line["body"].get("reason")) for line in rest] == [
        ("draining", "SIGTERM"),
        ("ended", "drained: SIGTERM"),
    ]
    assert [e["event"] for e in runner.lifecycle] == ["ready", "draining", "ended"]


async def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--drain-grace-ms", "60000") as runner,
        runner.client() as client,
    ):
        await client.post("/v1/sessions", json=_start("long-call"))
        runner.signal(signal.SIGINT)
        await runner.wait_for(lambda: any(e["event"] == "draining" for e in runner.lifecycle))
        # It says how long it will wait, and how to leave sooner.
        await runner.wait_for(lambda: any("waiting up to" in line for line in runner.stderr))
        (said,) = [line for line in runner.stderr if "waiting up to" in line]
        assert said == (
            "runner: SIGINT: draining; waiting up to 60 s for 1 call to end (SIGINT again exits at once)"
        )
        runner.signal(signal.SIGINT)
        assert await runner.wait_exit(timeout=5) == 128 + signal.SIGINT
    assert [e["event"] for e in runner.lifecycle] == ["ready", "draining"]


async def test_ctrl_c_on_a_runner_without_calls_exits_at_once(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--drain-grace-ms", "60000") as runner:
        runner.signal(signal.SIGINT)
        assert await runner.wait_exit(timeout=10) == 0
    assert [e["event"] for e in runner.lifecycle] == ["ready", "draining", "ended"]
    assert not any("waiting up to" in line for line in runner.stderr)


async def test_a_reader_that_leaves_is_cleaned_up_within_two_heartbeats(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "300", "--log-level", "debug") as runner:
        async with open_events(runner, "from=0") as events:
            await events.lines(1)
        with trio.fail_after(0.6 + 1.0):  # two heartbeats, plus the margin of a loaded machine
            await runner.wait_for(
                lambda: any("events stream from 0 closed" in line for line in runner.stderr)
            )


async def test_a_stalled_reader_never_slows_appends_and_falls_out_of_the_window(tmp_path: Path) -> None:
    big = {"blob": "x" * 400_000}
    async with (
        start_runner(tmp_path / "j.db", "--retention", "10", "--max-sessions", "40") as runner,
        runner.client() as client,
    ):
        async with open_events(runner, "from=0", receive_buffer=4096) as events:
            with trio.fail_after(30):
                # Each start writes a 400 KB record; the reader reads nothing meanwhile.
                for i in range(30):
                    answer = await client.post("/v1/sessions", json=_start(f"big{i}", clientContext=big))
                    assert answer.status_code == 202
            with trio.fail_after(30):
                got = await events.lines()  # it ends: the reader fell out of the window
        last = got[-1]["envelope"]
        assert last < 31
        refused = await client.get("/v1/runner/events", params={"from": str(last)})
        assert refused.status_code == 410
        assert refused.json()["oldestRetained"] == 22


async def test_replay_reads_the_journal_file(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with (
        start_runner(journal, "--retention", "4", "--max-sessions", "9") as runner,
        runner.client() as client,
    ):
        for i in range(5):
            await client.post("/v1/sessions", json=_start(f"c{i}"))
        streamed = await read_stream(runner, "from=0", until=lambda ls: len(ls) >= 4)

        def replay(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "runner", "replay", "--journal", str(journal), *args],
                capture_output=True,
                text=True,
                timeout=30,
            )

        as_json = await trio.to_thread.run_sync(replay, "--from", "0", "--json")
        assert as_json.returncode == 0
        assert [json.loads(line) for line in as_json.stdout.splitlines()] == streamed
        assert "envelopes 1..2 were pruned" in as_json.stderr
        timeline = await trio.to_thread.run_sync(replay, "--from", "0")
        lines = timeline.stdout.splitlines()
        assert lines[0] == "-- envelopes 1..2 were pruned (outside the retention window) --"
        assert lines[1].startswith("#3 ") and "c1#1" in lines[1] and "curb.started" in lines[1]
        only_c4 = await trio.to_thread.run_sync(replay, "--from", "0", "--producer", "c4", "--json")
        assert [json.loads(line)["producer"] for line in only_c4.stdout.splitlines()] == ["c4"]
