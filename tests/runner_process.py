"""A real ``runner`` process for tests: started, read, signalled, killed, by pid only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

TOKEN = "test-token-7f3a"
READY_PREFIX = 'curb-hosted {"event":"ready",'


class RunnerProcess:
    """One runner process and what it printed."""

    def __init__(self, process: trio.Process, journal: Path) -> None:
        self.process = process
        self.journal = journal
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.address = ""
        self._changed = trio.Event()

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    @property
    def lifecycle(self) -> list[dict[str, Any]]:
        return [
            json.loads(line.removeprefix("curb-hosted "))
            for line in self.stdout
            if line.startswith("curb-hosted ")
        ]

    def client(self, *, token: str | None = TOKEN, timeout: float = 10) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    async def _pump(self, stream: trio.abc.ReceiveStream, into: list[str]) -> None:
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            into.extend(line.decode() for line in lines)
            self._changed.set()
            self._changed = trio.Event()
        if buffer:
            into.append(buffer.decode())
        self._changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 15) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                if self.process.returncode is not None and not predicate():
                    await trio.sleep(0.05)
                    if not predicate():
                        raise AssertionError(
                            f"runner exited {self.process.returncode}; stderr:\n"
                            + "\n".join(self.stderr[-30:])
                        )
                await self._changed.wait()

    async def wait_exit(self, timeout: float = 20) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()

    async def type(self, line: str) -> None:
        """Write a line to the runner's stdin (started with ``stdin=True``)."""
        assert self.process.stdin is not None, "started without stdin=True"
        await self.process.stdin.send_all(line.encode() + b"\n")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)


QUIET_AGENT = "tests.agents:quiet"


def runner_argv(command: str, journal: Path, *extra: str, agent: str = QUIET_AGENT) -> list[str]:
    return [
        sys.executable,
        "-m",
        "runner",
        command,
        agent,
        "--address",
        "127.0.0.1:0",
        "--public-address",
        "127.0.0.1:0",
        "--journal",
        str(journal),
        *extra,
    ]


@asynccontextmanager
async def start_runner(
    journal: Path,
    *extra: str,
    command: str = "serve",
    agent: str = QUIET_AGENT,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    stdin: bool = False,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
    ready_timeout: float = 30,
) -> AsyncIterator[RunnerProcess]:
    """Start ``runner COMMAND AGENT`` on a free loopback port; stop it (by pid) on exit.

    With ``stdin``, the process reads a pipe the test writes (``runner.type(line)``).

    The default agent writes nothing of its own, so a test can count a call's records.
    ``prefix`` runs the runner through another command (one that ends by exec'ing it).
    """
    environ = {**os.environ, "CURB_MANAGEMENT_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = await trio.lowlevel.open_process(
        [*prefix, *runner_argv(command, journal, *extra, agent=agent)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=cwd,
    )
    runner = RunnerProcess(process, journal)
    async with trio.open_nursery() as nursery:
        assert process.stdout is not None and process.stderr is not None
        nursery.start_soon(runner._pump, process.stdout, runner.stdout)
        nursery.start_soon(runner._pump, process.stderr, runner.stderr)
        try:
            if wait_ready:
                await runner.wait_for(
                    lambda: any(line.startswith(READY_PREFIX) for line in runner.stdout),
                    timeout=ready_timeout,
                )
                runner.address = runner.lifecycle[[e["event"] for e in runner.lifecycle].index("ready")][
                    "address"
                ]
            yield runner
        finally:
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


class EventsStream:
    """A raw HTTP/1.1 reader of the events stream, so a test controls every read."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""

    async def _fill(self) -> bool:
        data = await self._stream.receive_some(65536)
        self._buffer += data
        return bool(data)

    async def _read_head(self) -> None:
        while b"\r\n\r\n" not in self._buffer:
            if not await self._fill():
                raise EOFError("connection closed before the headers")
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode().split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}

    async def _read_chunk(self) -> bytes | None:
        """One chunk of the chunked body; None at its end."""
        while b"\r\n" not in self._buffer:
            if not await self._fill():
                return None
        size_line, rest = self._buffer.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            if not await self._fill():
                return None
            rest = self._buffer.split(b"\r\n", 1)[1]
        self._buffer = rest[size + 2 :]
        return None if size == 0 else rest[:size]

    async def lines(
        self, count: int | None = None, *, until: Callable[[list[dict[str, Any]]], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Read whole lines until ``count`` were read, ``until`` holds, or the stream ends."""
        got: list[dict[str, Any]] = []
        while (count is None or len(got) < count) and not (until and got and until(got)):
            while b"\n" in self.body:
                line, self.body = self.body.split(b"\n", 1)
                got.append(json.loads(line))
                if (count is not None and len(got) >= count) or (until and until(got)):
                    return got
            chunk = await self._read_chunk()
            if chunk is None:
                return got
            self.body += chunk
        return got

    async def aclose(self) -> None:
        await self._stream.aclose()


@asynccontextmanager
async def open_events(
    runner: RunnerProcess, query: str = "", *, receive_buffer: int | None = None
) -> AsyncIterator[EventsStream]:
    """``GET /v1/runner/events?QUERY`` over a raw socket; the answer's head is read."""
    host, port = runner.address.rsplit(":", 1)
    sock = trio.socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    request = (
        f"GET /v1/runner/events{'?' + query if query else ''} HTTP/1.1\r\nHost: {runner.address}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: application/x-ndjson\r\n\r\n"
    )
    await stream.send_all(request.encode())
    reader = EventsStream(stream)
    try:
        await reader._read_head()
        if "content-length" in reader.headers:
            need = int(reader.headers["content-length"])
            while len(reader._buffer) < need and await reader._fill():
                pass
            reader.body = reader._buffer
        yield reader
    finally:
        await stream.aclose()


async def read_stream(
    runner: RunnerProcess, query: str, *, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 10
) -> list[dict[str, Any]]:
    """Read stream lines after ``?QUERY`` until ``until(lines)`` holds."""
    with trio.fail_after(timeout):
        async with open_events(runner, query) as events:
            assert events.status == 200, events.body
            return await events.lines(until=until)


def records(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "envelope" in line]
