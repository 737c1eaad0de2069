"""A runner served in the test's own process, so the test can also be each call's caller.

The runner is the real one (``serve_runner``: journal, calls, Hypercorn on 127.0.0.1 at a
free port, the events stream); only its transport is the in-process loopback, whose caller
side (:class:`~runner.transports.loopback.LoopbackCaller`) the test drives. The host side
goes over HTTP as it would from another process.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import trio
from jsonschema import Draft202012Validator

from runner.agent import Agent, choose_experiments, conversation_factory
from runner.calls import Runner
from runner.config import Config
from runner.runtime import serve_runner
from runner.transports import CallTarget
from runner.transports.loopback import LoopbackCaller, LoopbackSession, LoopbackTransport

from .runner_process import TOKEN, open_events
from .test_protocol_schema import _validator

STOP_TIMEOUT_S = 15


class InProcessRunner:
    """A runner in this process: its address, its :class:`Runner` and its loopback transport."""

    def __init__(self, address: str, runner: Runner, transport: LoopbackTransport) -> None:
        self.address = address
        self.runner = runner
        self.transport = transport

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    def client(self, *, timeout: float = 15) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout
        )

    async def wait_caller(self, session_id: str, timeout: float = 10) -> LoopbackCaller:
        """The caller side of a call, once it joined."""
        with trio.fail_after(timeout):
            return await self.transport.wait_caller(session_id)


class HeldLoopback(LoopbackTransport):
    """The loopback transport, whose calls stay in their join until the test lets them connect.

    A call is ``starting`` for exactly as long as the test needs it to be, whatever the
    machine's load; ``joining`` is set once a call is in its join.
    """

    def __init__(self) -> None:
        super().__init__()
        self.joining = trio.Event()
        self.release = trio.Event()

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[LoopbackSession]:
        self.joining.set()
        await self.release.wait()
        async with super().open_session(target) as session:
            yield session


@asynccontextmanager
async def open_runner(
    agent: Agent,
    directory: Path,
    *,
    max_sessions: int = 4,
    heartbeat_ms: int = 15_000,
    transport: LoopbackTransport | None = None,
) -> AsyncIterator[InProcessRunner]:
    """Serve ``agent`` in this process; on exit drain it (calls stopped at once) and wait for its end."""
    transport = transport or LoopbackTransport()
    config = Config(
        address="127.0.0.1:0",
        journal_path=directory / "journal.db",
        max_sessions=max_sessions,
        heartbeat_ms=heartbeat_ms,
        drain_grace_ms=0,
    )
    returned = trio.Event()

    async def serve(*, task_status: trio.TaskStatus[tuple[str, Runner]]) -> None:
        try:
            await serve_runner(
                config,
                token=TOKEN,
                transports=[transport],
                conversation_factory=conversation_factory(agent, host_connected=True),
                experiment_chooser=lambda start: choose_experiments(
                    agent, start.session_id, start.client_context or {}, start.experiments
                ),
                handle_signals=False,
                task_status=task_status,
            )
        finally:
            returned.set()

    async with trio.open_nursery() as nursery:
        address, runner = await nursery.start(serve)
        try:
            yield InProcessRunner(address, runner, transport)
        finally:
            # Drain and let serve_runner return by itself, even when the test failed or was
            # cancelled: a runner cancelled mid-shutdown can wait forever on its journal.
            runner.drain_nowait("test_done")
            with trio.CancelScope(shield=True), trio.fail_after(STOP_TIMEOUT_S):
                await returned.wait()


# -- the host's view: answers and stream lines, checked against the protocol schema -------------


@cache
def _cached_validator(type_name: str) -> Draft202012Validator:
    return _validator(type_name)


def conforms(type_name: str, value: Any) -> Any:
    """Assert ``value`` is a valid ``type_name`` of ``runner/protocol.schema.json``; return it."""
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in _cached_validator(type_name).iter_errors(value)
    ]
    assert not errors, f"not a valid {type_name}: {errors}\n{json.dumps(value)}"
    return value


def answer(response: httpx.Response, status: int, type_name: str) -> Any:
    """Assert the status and the body's type (ErrorBody off 2xx); return the body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return conforms(type_name, response.json())


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """An ErrorBody answer with ``status`` and ``code``."""
    body = answer(response, status, "ErrorBody")
    assert body["error"] == code, body
    return body


def body_type(line: dict[str, Any]) -> str | None:
    """The schema type of a record's body, for the classes and events a call writes."""
    cls, body = line["class"], line["body"]
    if cls == "lifecycle":
        return "Lifecycle"
    if cls == "host":
        return "HostRecordBody"
    if cls == "conversation" and body.get("type") == "event":
        return {
            "curb.started": "CallStartedEvent",
            "curb.ended": "CallEndedEvent",
            "curb.messages": "CallMessagesEvent",
        }.get(body["name"], "ConversationEventBody")
    return None


def conforming(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check every stream line (its envelope, then its body by class); return the records."""
    for line in lines:
        conforms("StreamLine", line)
        if "envelope" in line:
            conforms("JournalRecord", line)
            kind = body_type(line)
            if kind is not None:
                conforms(kind, line["body"])
    return [line for line in lines if "envelope" in line]


class Follower:
    """A host following the events stream: keeps every record it read, waits for more."""

    def __init__(self, events: Any) -> None:
        self._events = events
        self.records: list[dict[str, Any]] = []
        self.raw: list[bytes] = []

    async def wait_for(self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float = 15) -> Any:
        """Read until ``predicate(records)`` is truthy; return its value."""
        with trio.fail_after(timeout):
            while not (found := predicate(self.records)):
                lines = await self._events.lines(1)
                if not lines:
                    raise AssertionError("the events stream ended")
                self.records.extend(conforming(lines))
        return found


@asynccontextmanager
async def follow(runner: Any, query: str = "from=0") -> AsyncIterator[Follower]:
    """Follow ``GET /v1/runner/events?QUERY`` of a runner (in this process or not) over a raw socket."""
    async with open_events(runner, query) as events:
        assert events.status == 200, events.body
        yield Follower(events)


# -- reading a call's records ---------------------------------------------------------------------


def of(records: Sequence[dict[str, Any]], producer: str) -> list[dict[str, Any]]:
    return [r for r in records if r["producer"] == producer]


def events_named(records: Sequence[dict[str, Any]], producer: str, name: str) -> list[dict[str, Any]]:
    """The payloads of a call's conversation events called ``name``."""
    return [
        r["body"]["payload"]
        for r in of(records, producer)
        if r["class"] == "conversation" and r["body"].get("type") == "event" and r["body"]["name"] == name
    ]


def host_records(
    records: Sequence[dict[str, Any]], producer: str, name: str | None = None
) -> list[dict[str, Any]]:
    """A call's ``host`` record bodies (the agent's messages to its host)."""
    return [
        r["body"]
        for r in of(records, producer)
        if r["class"] == "host" and (name is None or r["body"]["name"] == name)
    ]


def turns(records: Sequence[dict[str, Any]], producer: str, role: str | None = None) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in of(records, producer)
        if r["class"] == "conversation"
        and r["body"].get("type") == "turn"
        and (role is None or r["body"]["role"] == role)
    ]


def ended(records: Sequence[dict[str, Any]], producer: str) -> bool:
    return bool(events_named(records, producer, "curb.ended"))


def call_start(session_id: str, url: str = "loopback://x", **extra: Any) -> dict[str, Any]:
    return {"sessionId": session_id, "realtimeUrl": url, "realtimeToken": "room-token", **extra}
