"""A real client of the agent WebSocket, for tests: REST for keys and conversations, and a
trio-websocket connection whose every frame goes through :class:`FrameChecker`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from ..runner_process import READY_PREFIX, TOKEN, RunnerProcess, start_runner
from .ino_checker import FrameChecker

API_KEY = "ino-test-api-key-5b1e"
PUBLIC_LINE = "runner: public listener on "
RUNNER_ENV = {"CURB_API_KEY": API_KEY, "OPENAI_API_KEY": "", "CURB_MANAGEMENT_TOKEN": TOKEN}
FRAME_TIMEOUT_S = 20.0


def agent_ref(name: str) -> str:
    """One of ``ino_agents`` by name, or any agent by its full ``module:name``."""
    return name if ":" in name else f"tests.websocket.ino_agents:{name}"


# -- Runners ---------------------------------------------------------------------------------


@attrs.define
class Addresses:
    """Where a runner listens: ``management`` (host API) and ``public`` (apps, sockets)."""

    management: str
    public: str

    def api(self) -> Api:
        return Api(self)

    def management_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://{self.management}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15
        )


def public_address(stderr: list[str]) -> str | None:
    return next(
        (line.removeprefix(PUBLIC_LINE).strip() for line in stderr if line.startswith(PUBLIC_LINE)), None
    )


@asynccontextmanager
async def start_ino_runner(
    journal: Path, *extra: str, agent: str = "speaking", env: dict[str, str] | None = None
) -> AsyncIterator[tuple[RunnerProcess, Addresses]]:
    """A ``runner serve`` process of one of ``ino_agents``; its two addresses once ready."""
    async with start_runner(
        journal, *extra, agent=agent_ref(agent), env={**RUNNER_ENV, **(env or {})}
    ) as runner:
        address = public_address(runner.stderr)
        assert address, "no public listener line on stderr:\n" + "\n".join(runner.stderr[-20:])
        yield runner, Addresses(management=runner.address, public=address)


class BackgroundRunner:
    """A runner process shared by many tests (a sync fixture starts it; no Trio needed)."""

    def __init__(self, journal: Path, *extra: str, agent: str = "speaking") -> None:
        self.journal = journal
        argv = [
            sys.executable,
            "-m",
            "runner",
            "serve",
            agent_ref(agent),
            "--address",
            "127.0.0.1:0",
            "--public-address",
            "127.0.0.1:0",
            "--journal",
            str(journal),
            *extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **RUNNER_ENV}
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._pumps = [
            threading.Thread(target=self._pump, args=(stream, into), daemon=True)
            for stream, into in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr))
        ]
        for pump in self._pumps:
            pump.start()
        deadline = time.monotonic() + 60
        while not any(line.startswith(READY_PREFIX) for line in self.stdout):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the runner did not get ready:\n" + "\n".join(self.stderr[-30:]))
            time.sleep(0.05)
        ready = json.loads(
            next(line for line in self.stdout if line.startswith(READY_PREFIX)).removeprefix("curb-hosted ")
        )
        public = public_address(self.stderr)
        assert public is not None
        self.addresses = Addresses(management=ready["address"], public=public)

    @staticmethod
    def _pump(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def stop(self) -> None:
        """SIGTERM (by pid), then SIGKILL if it has not drained in 20 s; close its pipes."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pump in self._pumps:
            pump.join(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


# -- REST ------------------------------------------------------------------------------------


class Api:
    """The public REST an app's server and client use."""

    def __init__(self, addresses: Addresses) -> None:
        self.addresses = addresses
        self.base_url = f"http://{addresses.public}"

    def _client(self, bearer: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=15)

    async def request(
        self,
        method: str,
        path: str,
        *,
        bearer: str | None,
        json_body: Any = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """``content``, if given, is sent as is (as JSON by its content type) instead of ``json_body``."""
        async with self._client(bearer) as client:
            if content is not None:
                headers = {"Content-Type": "application/json"}
                return await client.request(method, path, content=content, headers=headers)
            return await client.request(method, path, json=json_body)

    async def mint(self, end_user_id: str | None = None, **options: Any) -> dict[str, Any]:
        body = {"end_user_id": end_user_id, **options} if end_user_id else dict(options)
        answer = await self.request("POST", "/v1/ephemeral-keys", bearer=API_KEY, json_body=body)
        assert answer.status_code == 201, answer.text
        return answer.json()

    async def session(self, token: str) -> dict[str, Any]:
        answer = await self.request("POST", "/v1/agent/sessions", bearer=token, json_body={})
        assert answer.status_code == 201, answer.text
        return answer.json()

    async def person(self, end_user_id: str | None = None, **options: Any) -> tuple[str, str]:
        """A new token and a new conversation for it: ``(token, session_id)``."""
        token = (await self.mint(end_user_id, **options))["token"]
        return token, (await self.session(token))["session_id"]

    async def revoke(self, token: str) -> httpx.Response:
        token_id = token.split("_")[1]
        return await self.request("POST", f"/v1/ephemeral-keys/{token_id}/revoke", bearer=API_KEY)

    async def delete(self, session_id: str, bearer: str) -> httpx.Response:
        return await self.request("DELETE", f"/v1/agent/sessions/{session_id}", bearer=bearer)

    async def messages(self, session_id: str, bearer: str) -> list[dict[str, Any]]:
        answer = await self.request("GET", f"/v1/agent/sessions/{session_id}/messages", bearer=bearer)
        assert answer.status_code == 200, answer.text
        return answer.json()["messages"]


# -- The socket ------------------------------------------------------------------------------


class Closed(Exception):
    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"closed {code}: {reason}")
        self.code = code
        self.reason = reason


class InoSocket:
    """One connection: what it sends, and every frame it gets, checked as it arrives."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.checker = FrameChecker()
        self.ready: dict[str, Any] = {}

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_message(json.dumps({"type": kind, **fields}))

    async def send_raw(self, text_or_bytes: str | bytes) -> None:
        await self.ws.send_message(text_or_bytes)

    async def receive(self, timeout: float = FRAME_TIMEOUT_S) -> dict[str, Any] | bytes:
        with trio.fail_after(timeout):
            try:
                message = await self.ws.get_message()
            except ConnectionClosed as exc:
                raise Closed(exc.reason.code, exc.reason.reason) from None
        return self.checker.feed(message)

    async def until(
        self, stop: Callable[[dict[str, Any]], bool], timeout: float = FRAME_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """JSON frames up to and including the first for which ``stop`` holds."""
        got: list[dict[str, Any]] = []
        with trio.fail_after(timeout):
            while True:
                frame = await self.receive(timeout)
                if isinstance(frame, bytes):
                    continue
                got.append(frame)
                if stop(frame):
                    return got

    async def until_type(self, *kinds: str, timeout: float = FRAME_TIMEOUT_S) -> list[dict[str, Any]]:
        return await self.until(lambda f: f["type"] in kinds, timeout)

    async def turn_end(self, timeout: float = FRAME_TIMEOUT_S) -> list[dict[str, Any]]:
        """Frames up to the end of the running (or next) turn: turn.done or interrupted."""
        return await self.until_type("turn.done", "interrupted", timeout=timeout)

    async def closed(self, timeout: float = FRAME_TIMEOUT_S) -> tuple[int | None, str | None]:
        """Read to the close; return its code and reason."""
        with trio.fail_after(timeout):
            while True:
                try:
                    await self.receive(timeout)
                except Closed as closed:
                    return closed.code, closed.reason

    async def say(self, text: str, **options: Any) -> list[dict[str, Any]]:
        """A typed turn, to its end."""
        await self.send("user_message", text=text, **options)
        return await self.turn_end()


def socket_url(addresses: Addresses, session_id: str | None) -> str:
    query = f"?session_id={session_id}" if session_id is not None else ""
    return f"ws://{addresses.public}/v1/agent/stream{query}"


@asynccontextmanager
async def open_socket(
    addresses: Addresses, session_id: str | None, *, subprotocols: list[str] | None = None
) -> AsyncIterator[InoSocket]:
    """A raw connection: nothing sent yet."""
    stream = None
    try:
        async with open_websocket_url(
            socket_url(addresses, session_id),
            subprotocols=["ino.v2"] if subprotocols is None else subprotocols,
            disconnect_timeout=5,
            connect_timeout=10,
        ) as ws:
            stream = ws._stream
            yield InoSocket(ws)
    finally:
        # trio-websocket 0.12 never closes its TCP stream when the server closed the
        # WebSocket first (its reader stops at EOF without closing): close it here.
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


@asynccontextmanager
async def connect(
    addresses: Addresses, token: str, session_id: str, *, tools: list[str] | None = None, idle: bool = True
) -> AsyncIterator[InoSocket]:
    """Authenticated and ``ready``; with ``idle``, past the greeting turn when there is one."""
    async with open_socket(addresses, session_id) as sock:
        auth: dict[str, Any] = {"key": token, "session_id": session_id}
        if tools is not None:
            auth["tools"] = tools
        await sock.send("auth", **auth)
        frame = await sock.receive()
        assert isinstance(frame, dict) and frame["type"] == "ready", frame
        sock.ready = frame
        if idle and frame["greeting"]:
            await sock.turn_end()
        yield sock
