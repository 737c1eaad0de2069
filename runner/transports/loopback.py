"""The in-process transport: the caller lives in the runner's own process.

A call whose ``realtimeUrl`` is ``loopback:`` (optionally ``loopback://NAME?connect_ms=N``
to take N ms to join, or ``loopback://NAME?fail=REASON`` to fail the join) is
joined here. ``runner dev``, ``runner console`` and the tests drive its caller
side through :class:`LoopbackCaller`.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import attrs
import trio

from ..sessions import (
    DTMF_DIGITS,
    AudioFrame,
    CallTarget,
    DtmfReceived,
    ParticipantJoined,
    ParticipantLeft,
    RequestHandler,
    TransportError,
    TransportEvent,
    UserText,
)

SCHEME = "loopback"


@attrs.frozen(kw_only=True)
class _Options:
    connect_ms: int = 0
    fail: str | None = None
    caller: Literal["app", "sip", "none"] = "app"


def _options(url: str) -> _Options:
    query = parse_qs(urlsplit(url).query)
    first = {k: v[0] for k, v in query.items() if v}
    caller = first.get("caller", "app")
    if caller not in ("app", "sip", "none"):
        raise TransportError(f"loopback caller must be app, sip or none, got {caller!r}")
    try:
        connect_ms = int(first.get("connect_ms", "0"))
    except ValueError:
        raise TransportError("loopback connect_ms must be an integer") from None
    return _Options(connect_ms=connect_ms, fail=first.get("fail"), caller=caller)  # type: ignore[arg-type]  # caller was checked against the three literals above


class LoopbackSession:
    """The agent's side of a loopback call."""

    kind = "loopback"
    delimits_turns = False

    def __init__(self, caller_kind: Literal["app", "sip", "none"]) -> None:
        self._events_send, self._events = trio.open_memory_channel[TransportEvent](math.inf)
        self._handler: RequestHandler | None = None
        self._handler_set = trio.Event()
        self._to_client_send, self.to_client = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._audio_send, self.audio_out = trio.open_memory_channel[bytes | None](math.inf)
        self._keys_send, self.keys_out = trio.open_memory_channel[str](math.inf)
        self.caller_kind = caller_kind
        self.audio_rate_hz = 0
        self.closed = False

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]:
        return self._events

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._handler = handler
        self._handler_set.set()

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        if self.caller_kind == "sip":
            return "phone"
        if self.caller_kind == "none":
            return "no_app"
        return "ok"

    async def send_to_client(self, key: str, payload: Any) -> None:
        # The loopback wire is the LiveKit one: a JSON text on topic curb.message.
        self._to_client_send.send_nowait(json.loads(json.dumps({"key": key, "payload": payload})))

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        self.audio_rate_hz = sample_rate_hz
        self._audio_send.send_nowait(pcm)
        await trio.lowlevel.checkpoint()

    async def clear_audio(self) -> None:
        self._audio_send.send_nowait(None)
        await trio.lowlevel.checkpoint()

    def ringing(self) -> trio.Event | None:
        return None

    async def send_dtmf(self, digits: str) -> None:
        if self.caller_kind != "sip":
            raise TransportError("the call has no phone line: its caller is not on a phone")
        for digit in digits:
            self._keys_send.send_nowait(digit)
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        self.closed = True
        self._events_send.close()
        self._to_client_send.close()
        self._audio_send.close()
        self._keys_send.close()


class LoopbackCaller:
    """The caller's side of a loopback call: what a test or the console does."""

    def __init__(self, session: LoopbackSession) -> None:
        self._session = session

    @property
    def to_client(self) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """``{key, payload}`` messages the agent sent to the app."""
        return self._session.to_client

    @property
    def audio(self) -> trio.MemoryReceiveChannel[bytes | None]:
        """Agent speech as PCM; ``None`` marks a cleared queue (barge-in)."""
        return self._session.audio_out

    @property
    def keys(self) -> trio.MemoryReceiveChannel[str]:
        """The keys the agent pressed (``ctx.send.dtmf``), one digit at a time."""
        return self._session.keys_out

    @property
    def left(self) -> bool:
        return self._session.closed

    @property
    def unread(self) -> int:
        """Events sent to the agent that it has not taken yet."""
        return self._session.events.statistics().current_buffer_used

    def say(self, text: str) -> None:
        self._session._events_send.send_nowait(UserText(text=text))

    def send_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        self._session._events_send.send_nowait(AudioFrame(pcm=pcm, sample_rate_hz=sample_rate_hz))

    def press(self, digits: str, identity: str = "caller") -> None:
        """Press keys on the caller's phone: one DTMF event per digit, in order."""
        for digit in digits:
            if digit not in DTMF_DIGITS:
                raise ValueError(f"{digit!r} is not a telephone key (one of {DTMF_DIGITS})")
            self._session._events_send.send_nowait(DtmfReceived(identity=identity, digit=digit))

    def join(self, identity: str, kind: Literal["caller", "app", "sip", "transfer_target"]) -> None:
        self._session._events_send.send_nowait(ParticipantJoined(identity=identity, kind=kind))

    def leave(self, identity: str, kind: Literal["caller", "app", "sip", "transfer_target"]) -> None:
        self._session._events_send.send_nowait(ParticipantLeft(identity=identity, kind=kind))

    async def request(self, method: str, payload: str, *, timeout_s: float = 10) -> str:
        """Call the agent as an RPC would; raises ClientRefusal on a refusal."""
        with trio.fail_after(timeout_s):
            await self._session._handler_set.wait()
            assert self._session._handler is not None
            return await self._session._handler(method, payload, "caller")


class LoopbackTransport:
    """Joins ``loopback:`` calls in this process and hands out their caller sides."""

    name = SCHEME

    def __init__(self) -> None:
        self._sessions: dict[str, LoopbackSession] = {}
        self._changed = trio.Event()

    def handles(self, url: str) -> bool:
        return urlsplit(url).scheme == SCHEME

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[LoopbackSession]:
        options = _options(target.url)
        await trio.sleep(options.connect_ms / 1000)
        if options.fail:
            raise TransportError(f"loopback join refused: {options.fail}")
        session = LoopbackSession(options.caller)
        self._sessions[target.session_id] = session
        self._changed.set()
        self._changed = trio.Event()
        try:
            yield session
        finally:
            session.close()
            del self._sessions[target.session_id]

    async def wait_caller(self, session_id: str) -> LoopbackCaller:
        """The caller side of a call, once it has joined."""
        while session_id not in self._sessions:
            await self._changed.wait()
        return LoopbackCaller(self._sessions[session_id])
