"""Slow and hostile clients: every connection has a deadline, and none outlives shutdown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import trio

from ..runner_process import TOKEN, open_events, start_runner
from ._raw import closed_by_peer, read_answer
from ._runner import one_line_naming, refused_start, start

pytestmark = pytest.mark.slow


async def _connect(address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


def _sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


async def test_connections_close_when_asked_and_bodies_have_a_deadline(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--http-body-timeout-s", "1") as runner:
        # Connection: close and HTTP/1.0: closed once answered.
        for request in (
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /health HTTP/1.0\r\n\r\n",
        ):
            stream = await _connect(runner.address)
            async with stream:
                await stream.send_all(request)
                status, _, _ = await read_answer(stream)
                assert status == 200
                assert await closed_by_peer(stream, timeout=3), request
        # A body announced but never sent: 400 invalid_request once the deadline passed, then closed.
        stream = await _connect(runner.address)
        async with stream:
            await stream.send_all(
                b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
                + b'{"sessionId":'
            )
            with trio.fail_after(10):
                status, headers, body = await read_answer(stream)
            assert (status, json.loads(body)["error"]) == (400, "invalid_request")
            assert headers.get("connection") == "close"
            assert await closed_by_peer(stream, timeout=3)
        async with runner.client() as client:
            assert (await client.get("/v1/runner")).json()["sessions"] == []


async def test_connections_are_capped(tmp_path: Path) -> None:
    cap = 4
    async with start_runner(
        tmp_path / "j.db", "--http-max-connections", str(cap), "--http-keep-alive-s", "30"
    ) as runner:
        before = _sockets(runner.process.pid)
        streams = [await _connect(runner.address) for _ in range(30)]
        try:
            await trio.sleep(1)
            # Each listener holds at most `cap` connections; the rest wait in the kernel's backlog.
            assert _sockets(runner.process.pid) - before <= cap
        finally:
            for stream in streams:
                await stream.aclose()
        async with runner.client() as client:
            assert (await client.get("/health")).status_code == 200


async def test_a_follower_that_never_reads_does_not_outlive_shutdown(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "200", "--drain-grace-ms", "100") as runner,
        runner.client() as client,
        open_events(runner, "from=0", receive_buffer=4096) as events,
    ):
        # Enough records that the stream's writes block on a reader that reads nothing.
        for i in range(120):
            context = {"pad": "x" * 8000, "i": str(i)}
            answer = await client.post("/v1/sessions", json=start(f"c{i}", clientContext=context))
            assert answer.status_code == 202
        runner.signal(signal.SIGTERM)
        # 100 ms of drain grace, 5 s for the calls, 5 s for the connections: well under 30 s.
        assert await runner.wait_exit(timeout=30) == 0
        del events
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)


async def test_a_token_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    target = tmp_path / "elsewhere"
    target.write_text("secret-of-someone-else\n")
    target.chmod(0o644)
    Path(f"{journal}.token").symlink_to(target)
    code, stderr = await refused_start(journal, env={"CURB_MANAGEMENT_TOKEN": ""})  # the file is used
    assert code == 1
    one_line_naming(stderr, Path(f"{journal}.token"), "symbolic link")
    assert target.stat().st_mode & 0o777 == 0o644
    assert not journal.exists()
