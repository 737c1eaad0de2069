"""A worker whose LiveKit server cannot be reached: /health answers, and a signal drains it."""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path

import httpx
import pytest
import trio
from livekit import api

from ..host.helpers import free_port
from ..runner_process import start_runner

pytestmark = pytest.mark.slow

LIVEKIT_ENV = {"LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret-0123456789abcdef0123456789ab"}


@asynccontextmanager
async def _refusing() -> AsyncIterator[str]:
    """A loopback port nothing listens on: every connection is refused."""
    yield f"ws://127.0.0.1:{free_port()}"


@asynccontextmanager
async def _silent() -> AsyncIterator[str]:
    """A listener that takes connections (the kernel's backlog) and never says a word."""
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def _health(address: str) -> httpx.Response:
    """GET /health, each try bounded: an answer within 30 s, or the test fails."""
    async with httpx.AsyncClient(timeout=2) as client:
        with trio.fail_after(30):
            while True:
                try:
                    return await client.get(f"http://{address}/health")
                except (httpx.ConnectError, httpx.TimeoutException):
                    await trio.sleep(0.2)


@pytest.mark.parametrize("server", [_refusing, _silent], ids=["refused", "silent"])
async def test_a_worker_that_cannot_reach_livekit_answers_health_and_drains_on_sigterm(
    tmp_path: Path, server: object
) -> None:
    journal = tmp_path / "j.db"
    address = f"127.0.0.1:{free_port()}"
    assert callable(server)
    async with (
        server() as url,
        start_runner(
            journal, "--address", address, "--url", url, "--drain-grace-ms", "100",
            command="start", env=LIVEKIT_ENV, wait_ready=False,
        ) as runner,
    ):  # fmt: skip
        health = await _health(address)
        assert health.status_code == 200, health.text
        assert health.json() == {
            "ok": True,
            "protocolVersion": 1,
            "versions": [1],
            "state": "starting",
            "livekit": "connecting",
        }
        # Not in LiveKit's pool, so not ready; still answering, and it keeps trying.
        assert not any(line.startswith("curb-hosted") for line in runner.stdout)
        runner.signal(signal.SIGTERM)
        assert await runner.wait_exit(timeout=30) == 0
    assert not any("Traceback" in line for line in runner.stderr), runner.stderr
    with closing(sqlite3.connect(journal)) as conn:
        events = [
            e for (e,) in conn.execute("SELECT body ->> 'event' FROM records WHERE producer = 'runner'")
        ]
    assert events[-2:] == ["draining", "ended"], events
    assert "ready" not in events


def _signed(body: str, secret: str = LIVEKIT_ENV["LIVEKIT_API_SECRET"]) -> str:
    """The ``Authorization`` LiveKit sends with a webhook: a token of the body's SHA-256."""
    digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    return api.AccessToken(LIVEKIT_ENV["LIVEKIT_API_KEY"], secret).with_sha256(digest).to_jwt()


async def test_a_workers_webhook_route_takes_only_what_the_server_signed(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with (
        _refusing() as url,
        start_runner(
            tmp_path / "j.db", "--address", address, "--url", url,
            command="start", env=LIVEKIT_ENV, wait_ready=False,
        ) as runner,
    ):  # fmt: skip
        await _health(address)
        hook = f"http://{address}/v1/livekit/webhook"
        left = json.dumps(
            {
                "event": "participant_left",
                "room": {"name": "r1"},
                "participant": {"identity": "agent-AJ_1", "kind": "AGENT"},
            }
        )
        started = json.dumps({"event": "room_started", "room": {"name": "r1"}})
        async with httpx.AsyncClient(timeout=10) as client:
            # Unsigned, signed with another secret, or signed for another body: refused.
            for body, auth in (
                (left, ""),
                (left, _signed(left, secret="another-secret-0123456789abcdef01234567")),
                (left, _signed(started)),
            ):
                answer = await client.post(hook, content=body, headers={"Authorization": auth})
                assert (answer.status_code, answer.json()["error"]) == (401, "unauthorized")
            # Signed: taken when an agent left a room, and nothing else.
            answer = await client.post(hook, content=started, headers={"Authorization": _signed(started)})
            assert (answer.status_code, answer.json()) == (200, {"taken": False})
            answer = await client.post(hook, content=left, headers={"Authorization": _signed(left)})
            assert (answer.status_code, answer.json()) == (200, {"taken": True})
            # The server cannot be reached to read the room: said in the log, and the worker goes on.
            await runner.wait_for(
                lambda: any("could not be sent back" in line for line in runner.stderr), timeout=60
            )
            assert (await _health(address)).status_code == 200
        runner.signal(signal.SIGTERM)
        assert await runner.wait_exit(timeout=30) == 0
    assert not any("Traceback" in line for line in runner.stderr), runner.stderr
