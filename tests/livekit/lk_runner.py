"""A ``runner serve`` process inside the LiveKit namespace, and a host that drives it.

The runner listens on 127.0.0.1 inside the namespace; the host (the test process) reaches
it through ``LiveKitEnv.open_tcp_stream`` with plain HTTP/1.1, as any host would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import trio

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lk_harness import LiveKitEnv  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

from tests.runner_process import READY_PREFIX, TOKEN, EventsStream, RunnerProcess  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

AGENTS = Path(__file__).with_name("lk_agents.py")
AGENT_IDENTITY = "agent"
READY_TIMEOUT_S = 60


def agent_spec(name: str = "agent") -> str:
    return f"{AGENTS}:{name}"


@attrs.frozen
class Answer:
    status: int
    body: Any


class Host:
    """The test as the runner's host: the management API over HTTP, inside the namespace."""

    def __init__(self, livekit: LiveKitEnv, runner: RunnerProcess) -> None:
        self.livekit = livekit
        self.runner = runner

    async def _connect(self) -> trio.SocketStream:
        host, port = self.runner.address.rsplit(":", 1)
        return await self.livekit.open_tcp_stream(host, int(port))

    async def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30) -> Answer:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.runner.address}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
            + ("Content-Type: application/json\r\n" if body is not None else "")
            + "\r\n"
        )
        with trio.fail_after(timeout):
            stream = await self._connect()
            async with stream:
                await stream.send_all(head.encode() + data)
                raw = b""
                # Read to the end of the answer, not of the connection: hypercorn (trio)
                # leaves closing to the client.
                while (answer := _parse(raw)) is None:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        raise EOFError(f"the runner closed the connection mid-answer: {raw!r}")
                    raw += chunk
        return answer

    async def start_call(self, session_id: str, room: str, **fields: Any) -> Answer:
        """``POST /v1/sessions`` with a room token minted with kind agent."""
        body = {
            "sessionId": session_id,
            "realtimeUrl": self.livekit.url,
            "realtimeToken": self.livekit.token(AGENT_IDENTITY, room, agent=True),
            **fields,
        }
        return await self.request("POST", "/v1/sessions", body)

    async def stop_call(self, session_id: str, *, reason: str = "done", grace_ms: int = 0) -> Answer:
        return await self.request(
            "DELETE", f"/v1/sessions/{quote(session_id)}?reason={reason}&graceMs={grace_ms}"
        )

    @asynccontextmanager
    async def open_events(self, query: str = "from=0") -> AsyncIterator[EventsStream]:
        stream = await self._connect()
        request = (
            f"GET /v1/runner/events?{query} HTTP/1.1\r\nHost: {self.runner.address}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nAccept: application/x-ndjson\r\n\r\n"
        )
        await stream.send_all(request.encode())
        reader = EventsStream(stream)
        try:
            await reader._read_head()
            yield reader
        finally:
            await stream.aclose()

    async def read_call(self, session_id: str, *, timeout: float = 30) -> list[dict[str, Any]]:
        """The call's records from the events stream, up to and including ``curb.ended``."""
        return await self.read_until(session_id, lambda rec: _name(rec) == "curb.ended", timeout=timeout)

    async def read_until(
        self, session_id: str, done: Callable[[dict[str, Any]], bool], *, timeout: float = 30
    ) -> list[dict[str, Any]]:
        """The call's records from the start until one for which ``done`` holds."""
        with trio.fail_after(timeout):
            async with self.open_events() as events:
                assert events.status == 200, events.body
                lines = await events.lines(
                    until=lambda got: any(r.get("producer") == session_id and done(r) for r in got)
                )
        return [r for r in lines if r.get("producer") == session_id]


# -- reading a call's records ----------------------------------------------------------------


def events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The payloads of the conversation events called ``name``."""
    return [
        r["body"]["payload"]
        for r in records
        if r["body"].get("type") == "event" and r["body"]["name"] == name
    ]


def turns(records: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [r["body"] for r in records if r["body"].get("type") == "turn" and r["body"]["role"] == role]


def words(text: str) -> set[str]:
    return {w.strip(".,!?").lower() for w in text.split()} - {""}


def _name(record: dict[str, Any]) -> str | None:
    body = record.get("body", {})
    return body.get("name") if body.get("type") == "event" else None


def _parse(raw: bytes) -> Answer | None:
    """The answer in ``raw``, or None while it is incomplete."""
    head, found, rest = raw.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    if "chunked" in headers.get("transfer-encoding", ""):
        body = b""
        while True:
            size_line, found, after = rest.partition(b"\r\n")
            if not found:
                return None
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            if len(after) < size + 2:
                return None
            body, rest = body + after[:size], after[size + 2 :]
    else:
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            return None
        body = rest[:length]
    return Answer(status=int(status_line.split()[1]), body=json.loads(body) if body else None)


@asynccontextmanager
async def open_runner(
    livekit: LiveKitEnv,
    journal: Path,
    *extra: str,
    agent: str | None = None,
    command: str = "serve",
    env: dict[str, str] | None = None,
    source: Path = REPO,
    ready_timeout: float = READY_TIMEOUT_S,
) -> AsyncIterator[Host]:
    """``runner COMMAND AGENT`` inside the namespace, ready; killed (by pid) on exit.

    ``source``: the checkout whose ``runner`` runs (a benchmark may time an older one beside).
    """
    argv = [
        sys.executable,
        "-m",
        "runner",
        command,
        agent or agent_spec(),
        "--address",
        "127.0.0.1:0",
        "--journal",
        str(journal),
        *extra,
    ]
    process = await livekit.open_process(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=livekit.env({"CURB_MANAGEMENT_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1", **(env or {})}),
        cwd=str(source),
    )
    runner = RunnerProcess(process, journal)
    log = journal.with_suffix(".stderr")
    try:
        async with trio.open_nursery() as nursery:
            assert process.stdout is not None and process.stderr is not None
            nursery.start_soon(runner._pump, process.stdout, runner.stdout)
            nursery.start_soon(runner._pump, process.stderr, runner.stderr)
            try:
                # Warm-up loads the voice, the recognizer and the VAD: about 5 s of CPU, which a
                # machine shared with other work (a load average of 15 on 2 cores) stretches
                # past 20 s.
                await runner.wait_for(
                    lambda: any(line.startswith(READY_PREFIX) for line in runner.stdout),
                    timeout=ready_timeout,
                )
                runner.address = next(e["address"] for e in runner.lifecycle if e["event"] == "ready")
                yield Host(livekit, runner)
            finally:
                if process.returncode is None:
                    process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
    finally:
        log.write_text("\n".join(runner.stderr))
