"""The management listener of a real ``runner serve`` process: ready line, auth, errors, stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from .runner_process import TOKEN, open_events, read_stream, records, start_runner

pytestmark = pytest.mark.slow


async def test_ready_line_health_and_auth(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "3") as runner:
        ready_line = next(line for line in runner.stdout if line.startswith("curb-hosted "))
        ready = json.loads(ready_line.removeprefix("curb-hosted "))
        assert list(ready) == ["event", "address", "maxSessions", "warmupMs"]
        assert ready["event"] == "ready" and ready["maxSessions"] == 3
        host, port = ready["address"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert TOKEN not in "\n".join(runner.stdout + runner.stderr)

        async with runner.client(token=None) as anonymous:
            health = await anonymous.get("/health")
            assert (health.status_code, health.json()) == (
                200,
                {"ok": True, "protocolVersion": 1, "versions": [1], "state": "ready"},
            )
            for method, path in [
                ("GET", "/v1/runner"),
                ("GET", "/nope"),
                ("GET", "/v1/nope"),
                ("POST", "/v1/sessions"),
            ]:
                answer = await anonymous.request(method, path)
                assert (answer.status_code, answer.json()) == (401, {"error": "unauthorized"}), path
        async with runner.client(token="wrong") as wrong:
            answer = await wrong.get("/v1/runner/events")
            assert (answer.status_code, answer.json()) == (401, {"error": "unauthorized"})
        async with runner.client() as client:
            unknown_version = await client.get("/v2/runner")
            assert unknown_version.status_code == 404
            assert unknown_version.json()["error"] == "unknown_version"
            assert unknown_version.json()["versions"] == [1]
            not_found = await client.get("/v1/nothing/here")
            assert (not_found.status_code, not_found.json()["error"]) == (404, "not_found")
            wrong_method = await client.put("/v1/runner")
            assert wrong_method.json()["error"] == "not_found"
            status = await client.get("/v1/runner")
            assert status.json() == {
                "protocolVersion": 1,
                "maxSessions": 3,
                "activeSessions": 0,
                "draining": False,
                "sessions": [],
            }


async def test_stream_from_zero_from_n_and_malformed(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "5") as runner, runner.client() as client:
        for i in range(3):
            started = await client.post(
                "/v1/sessions", json={"sessionId": f"c{i}", "realtimeUrl": "loopback:", "realtimeToken": "t"}
            )
            assert started.status_code == 202
        lines = await read_stream(runner, "from=0", until=lambda ls: len(records(ls)) >= 4)
        assert lines[0]["producer"] == "runner" and lines[0]["body"]["event"] == "ready"
        assert [line["envelope"] for line in lines] == [1, 2, 3, 4]
        got = await read_stream(runner, "from=2", until=lambda ls: len(ls) >= 2)
        assert [line["envelope"] for line in got] == [3, 4]
        for bad in ["-1", "abc", "1.5", ""]:
            answer = await client.get("/v1/runner/events", params={"from": bad})
            assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request"), bad


async def test_heartbeat_and_following_from_now(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "200") as runner, runner.client() as client:
        with trio.fail_after(10):
            async with open_events(runner) as events:
                assert events.headers["content-type"] == "application/x-ndjson"
                pings = await events.lines(2)
                # The stream follows from now: the ready record is not replayed.
                assert [set(line) for line in pings] == [{"ping"}, {"ping"}]
                assert all(isinstance(line["ping"], int) for line in pings)
                started = await client.post(
                    "/v1/sessions", json={"sessionId": "c", "realtimeUrl": "loopback:", "realtimeToken": "t"}
                )
                assert started.status_code == 202
                lines = await events.lines(until=lambda ls: any("envelope" in line for line in ls))
        record = next(line for line in lines if "envelope" in line)
        assert record["producer"] == "c" and record["envelope"] == 2


async def test_cursor_too_old_and_cursor_ahead(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--retention", "3", "--max-sessions", "5") as runner,
        runner.client() as client,
    ):
        for i in range(4):
            await client.post(
                "/v1/sessions", json={"sessionId": f"c{i}", "realtimeUrl": "loopback:", "realtimeToken": "t"}
            )
        # Records 1..5 were written; 3..5 are retained.
        too_old = await client.get("/v1/runner/events", params={"from": "1"})
        assert (too_old.status_code, too_old.json()) == (
            410,
            {
                "error": "cursor_too_old",
                "detail": too_old.json()["detail"],
                "requested": 1,
                "oldestRetained": 3,
            },
        )
        ahead = await client.get("/v1/runner/events", params={"from": "99"})
        assert ahead.status_code == 410
        assert (ahead.json()["requested"], ahead.json()["oldestRetained"]) == (99, 3)
        resumed = await read_stream(runner, "from=2", until=lambda ls: len(ls) >= 3)
        assert [line["envelope"] for line in resumed] == [3, 4, 5]
        everything = await read_stream(runner, "from=0", until=lambda ls: len(ls) >= 3)
        assert [line["envelope"] for line in everything] == [3, 4, 5]
