"""What the runner says on stderr, as an operator (or a log collector) reads it."""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio

from .runner_process import RunnerProcess, read_stream, start_runner

pytestmark = pytest.mark.slow

PUBLIC_LINE = "runner: public listener on "


@contextmanager
def refusing_url() -> Iterator[str]:
    """An HTTP base URL whose port is bound but never listens: every connection is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


def _start(session_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "realtimeUrl": "loopback:", "realtimeToken": "t"}


async def _failed_call(tmp_path: Path, *flags: str) -> tuple[list[str], Path]:
    """One call whose opening turn fails at the model; the runner's stderr once it exited."""
    journal = tmp_path / "j.db"
    with refusing_url() as url:
        async with (
            start_runner(
                journal, *flags, agent="tests.agents:unreachable_model", env={"TEST_LLM_URL": url}
            ) as runner,
            runner.client() as client,
        ):
            assert (await client.post("/v1/sessions", json=_start("call-7"))).status_code == 202
            await read_stream(
                runner, "from=0", until=lambda ls: any("role" in line.get("body", {}) for line in ls)
            )
            await client.delete("/v1/sessions/call-7", params={"reason": "test_done"})
            await client.post("/v1/runner/drain")
            assert await runner.wait_exit() == 0
            return runner.stderr, journal
    raise AssertionError("unreachable")


async def test_json_lines_carry_time_level_logger_and_the_session_id(tmp_path: Path) -> None:
    stderr, _ = await _failed_call(tmp_path, "--log-format", "json")
    logged = [json.loads(line) for line in stderr]
    assert logged, stderr
    for line in logged:
        assert {"timestamp", "level", "logger", "message"} <= line.keys(), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"]), line
    by_message = {line["message"].split(" (")[0]: line for line in logged}
    started = by_message["call call-7 started"]
    assert (started["level"], started["logger"], started["session_id"]) == ("info", "runner.calls", "call-7")
    assert started["message"] == "call call-7 started (transport loopback, inbound)"
    ended = next(line for line in logged if line["message"].startswith("call call-7 ended"))
    assert ended["session_id"] == "call-7"
    assert re.fullmatch(
        r"call call-7 ended \(transport loopback, reason test_done\) after \d+\.\d s", ended["message"]
    )
    # The failed turn: a warning that names the call, the stage and the reason, logged by a task
    # of the call, so it carries the session id too.
    (failed,) = [line for line in logged if line["level"] == "warning"]
    assert failed["session_id"] == "call-7"
    assert re.fullmatch(
        r"call call-7: turn turn_\w+ failed at the model \(llm\): unavailable: cannot reach "
        r"openai-compatible: ConnectError",
        failed["message"],
    ), failed
    # Routine events stay quiet at the default level: no stream connects, no server banner.
    assert not [
        line for line in logged if "events stream" in line["message"] or "Running on" in line["message"]
    ]
    # Outside a call there is no session id.
    assert all("session_id" not in line for line in logged if "call-7" not in line["message"])


async def test_text_lines_start_with_time_level_and_logger_and_replay_shows_the_failure(
    tmp_path: Path,
) -> None:
    stderr, journal = await _failed_call(tmp_path)
    lines = [line for line in stderr if not line.startswith(PUBLIC_LINE)]
    assert lines
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) +runner[.\w]*", line), (
            line
        )
    (warning,) = [line for line in lines if " WARNING " in line]
    assert re.fullmatch(
        r"\S+ WARNING runner\.agent \[call-7\]: call call-7: turn turn_\w+ failed at the model \(llm\): "
        r"unavailable: cannot reach openai-compatible: ConnectError",
        warning,
    ), warning
    # replay shows the turn as interrupted, and why.
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "runner", "replay", "--journal", str(journal)], capture_stdout=True
        )
    (turn,) = [line for line in done.stdout.decode().splitlines() if "assistant:" in line]
    assert turn.endswith(
        "assistant:  [interrupted: unavailable: cannot reach openai-compatible: ConnectError]"
    ), turn


async def test_debug_shows_routine_events(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--log-level", "debug", "--heartbeat-ms", "200") as runner:
        await read_stream(runner, "from=0", until=lambda ls: len(ls) >= 1)
        await runner.wait_for(lambda: any("events stream from 0 closed" in line for line in runner.stderr))
    assert any(" DEBUG   runner.events: events stream from 0 closed" in line for line in runner.stderr)


FORGED = "\n2026-01-01T00:00:00.000Z ERROR   runner: forged"


async def _forging_attempts(runner: RunnerProcess) -> None:
    """A join failure whose reason comes from the URL, and a DELETE reason, each with a line break."""
    async with runner.client() as client:
        url = "loopback://x?fail=" + quote("gone" + FORGED + "-by-url\x1b[2J")
        refused = await client.post("/v1/sessions", json={**_start("call-url"), "realtimeUrl": url})
        assert refused.status_code == 502, refused.text
        assert (await client.post("/v1/sessions", json=_start("call-reason"))).status_code == 202
        stopped = await client.delete(
            "/v1/sessions/call-reason", params={"reason": "done" + FORGED + "-by-reason\u2028x"}
        )
        assert stopped.status_code in (200, 202, 204), stopped.text
        await client.post("/v1/runner/drain")
    assert await runner.wait_exit() == 0


async def test_outside_text_cannot_forge_a_text_line(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner:
        await _forging_attempts(runner)
    record = re.compile(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) +[\w.]+( \[[^\]]+\])?: "
    )
    for line in runner.stderr:
        # Every line is a record or one of the runner's own `runner: ` lines; none was forged.
        assert record.match(line) or line.startswith("runner: "), line
        assert "forged" not in line or "\\n2026-01-01" in line, line
        assert "\x1b" not in line and "\u2028" not in line, line
    said = "\n".join(runner.stderr)
    assert "\\n2026-01-01T00:00:00.000Z ERROR   runner: forged-by-url\\x1b[2J" in said
    assert "\\n2026-01-01T00:00:00.000Z ERROR   runner: forged-by-reason\\u2028x" in said


async def test_json_mode_writes_nothing_but_json_lines(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--log-format", "json") as runner:
        await _forging_attempts(runner)
    logged = [json.loads(line) for line in runner.stderr]
    # The operator's lines are records too, the address in a field of its own.
    (listening,) = [line for line in logged if line["message"].startswith("public listener on ")]
    assert (listening["logger"], listening["level"]) == ("runner", "info")
    assert listening["message"] == "public listener on " + listening["address"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", listening["address"]), listening
    messages = "\n".join(line["message"] for line in logged)
    assert "forged-by-url" in messages and "forged-by-reason" in messages
