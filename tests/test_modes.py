"""The runner's other modes, as real processes: direct-join (``runner join``) and ``runner dev``.

Neither takes calls from a host: the routes that place or retire calls answer 501
runner_takes_no_calls, while the one call it was handed is there to read, stop and
follow on the events stream.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .runner_process import RunnerProcess, open_events, read_stream, records, start_runner
from .test_calls import (
    STREAM_TIMEOUT_S,
    answer,
    answered_before_its_body,
    assert_complete,
    call_start,
    conforming_lines,
    conforms,
    ended_reason,
    of,
    refused,
)

pytestmark = pytest.mark.slow

JOIN = ("--url", "loopback://j", "--token", "t", "--session-id", "j1")


async def wait_connected(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    """Poll GET /v1/sessions/{id} (bounded) until the call is connected: a runner is ready
    before its one call has joined."""
    with trio.fail_after(10):
        for _ in range(400):
            response = await client.get(f"/v1/sessions/{session_id}")
            if response.status_code == 404:
                refused(response, 404, "session_not_found")
            elif answer(response, 200, "LiveCall")["state"] == "connected":
                return response.json()
            await trio.sleep(0.02)
    raise AssertionError(f"{session_id} never connected")


async def assert_takes_no_calls(runner: RunnerProcess) -> None:
    """The three routes that place or retire calls answer 501, whatever the body.

    Each on a connection of its own: a 501 is answered before the body is read, and a
    connection reused after that can hang (see
    test_calls.test_an_answer_given_before_the_body_leaves_the_connection_usable, and
    test_a_501_given_before_the_body_leaves_the_connection_usable below).
    """
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/sessions", {"json": call_start("another")}),
        ("POST", "/v1/sessions", {"content": b"not json"}),
        ("GET", "/v1/runner", {}),
        ("POST", "/v1/runner/drain", {}),
    ]
    for method, path, kwargs in requests:
        async with runner.client() as client:
            refused(await client.request(method, path, **kwargs), 501, "runner_takes_no_calls")


def replay_journal(journal: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "runner", "replay", "--journal", str(journal), "--from", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def lifecycle_events(runner: RunnerProcess) -> list[tuple[str, Any]]:
    return [(body["event"], body.get("reason")) for body in runner.lifecycle]


# -- direct-join ------------------------------------------------------------------------------


async def test_direct_join_takes_no_calls_but_serves_its_one(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", *JOIN, command="join") as runner, runner.client() as client:
        live = await wait_connected(client, "j1")
        assert live["sessionId"] == "j1"
        await assert_takes_no_calls(runner)
        # Nor does it take host messages: it has no host-to-agent path.
        message = {"id": "m-1", "name": "ops.notice", "payload": {}}
        async with runner.client() as fresh:
            refused(await fresh.post("/v1/sessions/j1/messages", json=message), 501, "runner_takes_no_calls")
        # The refused drain changed nothing.
        assert answer(await client.get("/v1/sessions/j1"), 200, "LiveCall")["state"] == "connected"
        refused(await client.get("/v1/sessions/j2"), 404, "session_not_found")
        lines = conforming_lines(
            await read_stream(
                runner,
                "from=0",
                until=lambda ls: "curb.started" in [line["body"].get("name") for line in of(ls, "j1")],
                timeout=STREAM_TIMEOUT_S,
            )
        )
        assert runner.process.returncode is None
    assert lines[0]["body"]["event"] == "ready"
    started = of(lines, "j1")[0]
    assert (started["seq"], started["body"]["name"]) == (1, "curb.started")
    assert started["body"]["payload"]["transport"] == "loopback"
    assert started["body"]["payload"]["direction"] == "inbound"
    assert [event for event, _ in lifecycle_events(runner)] == ["ready"]


async def test_direct_join_exits_0_once_its_call_is_stopped(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", *JOIN, command="join") as runner, runner.client() as client:
        await wait_connected(client, "j1")
        async with open_events(runner, "from=0") as events:
            stopped = await client.delete("/v1/sessions/j1", params={"reason": "caller_hung_up"})
            assert answer(stopped, 200, "StopCallResponse") == {"sessionId": "j1", "stopped": True}
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines = await events.lines()  # to the end of the stream
        assert await runner.wait_exit() == 0
    recs = records(lines)
    assert ended_reason(recs, "j1") == "caller_hung_up"
    assert_complete(recs, "j1")
    assert [
        (line["body"]["event"], line["body"].get("reason")) for line in recs if line["class"] == "lifecycle"
    ] == [
        ("ready", None),
        ("draining", "call_ended"),
        ("ended", "drained: call_ended"),
    ]
    assert recs[-1]["body"]["event"] == "ended"
    assert lifecycle_events(runner) == [
        ("ready", None),
        ("draining", "call_ended"),
        ("ended", "drained: call_ended"),
    ]
    draining = next(line["body"] for line in recs if line["body"].get("event") == "draining")
    assert draining["activeSessions"] == 0
    # Last: every line against the schema, the draining record named call_ended included.
    conforming_lines(lines)


async def test_direct_join_that_cannot_join_exits_1(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    join = ("--url", "loopback://j?fail=nope", "--token", "t", "--session-id", "j1")
    async with start_runner(journal, *join, command="join") as runner:
        assert await runner.wait_exit() == 1
        await runner.wait_for(
            lambda: any(event == "ended" for event, _ in lifecycle_events(runner)), timeout=5
        )
    assert lifecycle_events(runner) == [
        ("ready", None),
        ("draining", "call_ended"),
        ("ended", "start_failed"),
    ]
    assert any("nope" in line for line in runner.stderr), runner.stderr[-10:]
    lines = replay_journal(journal)
    assert_complete(lines, "j1")
    assert ended_reason(lines, "j1") == "start_failed: loopback join refused: nope"
    for line in lines:
        conforms("JournalRecord", line)
        if line["class"] == "lifecycle" and line["body"]["event"] != "draining":
            conforms("Lifecycle", line["body"])  # draining call_ended: see the test above
        if line["producer"] == "j1":
            conforms(
                {"curb.started": "CallStartedEvent", "curb.ended": "CallEndedEvent"}.get(
                    line["body"]["name"], "ConversationEventBody"
                ),
                line["body"],
            )
    assert lines[-1]["body"] == {"event": "ended", "reason": "start_failed"}


async def test_a_501_given_before_the_body_leaves_the_connection_usable(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", *JOIN, command="join") as runner, runner.client() as client:
        await wait_connected(client, "j1")
        got = [
            await answered_before_its_body(runner, "POST", path)
            for path in ["/v1/sessions", "/v1/sessions/j1/messages"]
        ]
    assert got == [(501, 200), (501, 200)]


# -- dev --------------------------------------------------------------------------------------


async def test_dev_takes_no_calls_and_runs_its_own(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--drain-grace-ms", "100", command="dev") as runner,
        runner.client() as client,
    ):
        live = await wait_connected(client, "dev")
        assert live["sessionId"] == "dev"
        await assert_takes_no_calls(runner)
        assert answer(await client.get("/v1/sessions/dev"), 200, "LiveCall")["state"] == "connected"
        async with open_events(runner, "from=0") as events:
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines = await events.lines(
                    until=lambda ls: any(line.get("body", {}).get("name") == "curb.started" for line in ls)
                )
            runner.signal(signal.SIGTERM)
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines += await events.lines()
        assert await runner.wait_exit() == 0
    conforming_lines(lines)
    assert_complete(records(lines), "dev")
    assert ended_reason(records(lines), "dev") == "runner_draining"
    assert lifecycle_events(runner) == [
        ("ready", None),
        ("draining", "SIGTERM"),
        ("ended", "drained: SIGTERM"),
    ]
