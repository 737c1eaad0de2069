"""The agent's side of one call in a LiveKit room, as Trio sees it, and the transport that opens it."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal
from urllib.parse import urlsplit

import trio

from ...sessions import (
    AudioFrame,
    CallTarget,
    Disconnected,
    ParticipantJoined,
    ParticipantLeft,
    RequestHandler,
    TransportError,
    TransportEvent,
)
from ._hearing import AUDIO_IN_FRAME_MS
from ._loop import CALL_TIMEOUT_S, LoopThread
from ._requests import Requests
from ._room import JOIN_TIMEOUT_S, LEAVE_TIMEOUT_S, Room
from ._roster import APP_KINDS, Kind
from ._server_api import admin_token

log = logging.getLogger("runner.transports.livekit")

SCHEMES = ("ws", "wss")
# 10 s of caller audio not yet taken: drop, do not hoard.
MAX_AUDIO_BACKLOG_FRAMES = 10_000 // AUDIO_IN_FRAME_MS


class LiveKitSession:
    """The agent's side of one call in a LiveKit room (a :class:`TransportSession`)."""

    kind = "livekit"
    delimits_turns = False

    def __init__(
        self, target: CallTarget, thread: LoopThread, admin: Callable[[str], str] | None = None
    ) -> None:
        self._target = target
        self._thread = thread
        self.identity = ""
        self.room_name = ""
        self._events_send, self._events = trio.open_memory_channel[TransportEvent](math.inf)
        self._present: dict[str, Kind] = {}
        self._closing = False
        self._disconnected = False
        self._dropped_frames = 0
        self._ringing: set[str] = set()  # phone callers LiveKit's SIP service has not answered
        self._answered: trio.Event | None = None
        self._requests = Requests(thread, target.session_id)
        # Loop side: touched only on the session's loop.
        self._room = Room(target, thread, self._requests, admin=admin, emit=self._t_emit, ring=self._t_ring)

    # -- The TransportSession interface (Trio) ------------------------------------------------

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]:
        return self._events

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._requests.set_handler(handler)

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        kinds = set(self._present.values())
        if kinds & set(APP_KINDS):
            return "ok"
        if "sip" in kinds:
            return "phone"
        return "no_app"

    async def send_to_client(self, key: str, payload: Any) -> None:
        """Send ``{key, payload}`` on text stream topic ``curb.message`` to the app(s).

        Raises:
            TransportError: No app is in the room, or LiveKit did not take the message.
        """
        apps = sorted(identity for identity, kind in self._present.items() if kind in APP_KINDS)
        if not apps:
            raise TransportError("no app is in the room")
        text = json.dumps({"key": key, "payload": payload}, separators=(",", ":"), ensure_ascii=False)
        await self._thread.run(
            lambda: self._room.send_text(text, apps), timeout_s=CALL_TIMEOUT_S, what="send a message"
        )

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        """Play agent speech; returns once it is queued no more than ~200 ms ahead of playout."""
        await self._room.voice.publish(pcm, sample_rate_hz)

    async def clear_audio(self) -> None:
        """Drop the agent's speech still queued (a barge-in)."""
        await self._room.voice.clear()

    def ringing(self) -> trio.Event | None:
        """While a phone caller rings (its ``sip.callStatus`` is ``ringing``: LiveKit's SIP
        service answers once the agent subscribed to it and its audio flows), an event set
        once it is answered or gone; else ``None``."""
        if not self._ringing:
            return None
        if self._answered is None:
            self._answered = trio.Event()
        return self._answered

    async def send_dtmf(self, digits: str) -> None:
        """Press ``digits`` on the phone line: LiveKit's SIP service plays them to the SIP leg
        as RFC 4733 events.

        Raises:
            TransportError: No SIP participant is in the room, or LiveKit did not take the keys.
        """
        if not any(kind in ("sip", "transfer_target") for kind in self._present.values()):
            raise TransportError("the call has no phone line: no SIP participant is in the room")
        await self._thread.run(
            lambda: self._room.send_dtmf(digits), timeout_s=CALL_TIMEOUT_S, what="press phone keys"
        )

    # -- What the room reports (Trio) ---------------------------------------------------------

    def _t_emit(self, event: TransportEvent) -> None:
        if self._closing or self._disconnected:
            return
        if isinstance(event, AudioFrame):
            if self._events_send.statistics().current_buffer_used >= MAX_AUDIO_BACKLOG_FRAMES:
                self._dropped_frames += 1
                if self._dropped_frames == 1:
                    log.warning(
                        "call %s: the agent is not taking the caller's audio; dropping frames",
                        self._target.session_id,
                    )
                return
        elif isinstance(event, ParticipantJoined):
            self._present[event.identity] = event.kind
        elif isinstance(event, ParticipantLeft):
            self._present.pop(event.identity, None)
        elif isinstance(event, Disconnected):
            self._disconnected = True
        with suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self._events_send.send_nowait(event)

    def _t_ring(self, identity: str, ringing: bool) -> None:
        if ringing:
            self._ringing.add(identity)
            return
        self._ringing.discard(identity)
        if not self._ringing and self._answered is not None:
            self._answered.set()
            self._answered = None

    # -- Joining and leaving (Trio) ---------------------------------------------------------

    async def _join(self) -> None:
        target = self._target
        self.identity, self.room_name = await self._thread.run(
            lambda: self._room.join(target.url, target.token),
            timeout_s=JOIN_TIMEOUT_S + 1,
            what=f"join the LiveKit room at {target.url}",
        )

    async def _leave(self) -> None:
        self._closing = True
        await self._requests.aclose()
        try:
            await self._thread.run(self._room.leave, timeout_s=LEAVE_TIMEOUT_S, what="leave the room")
        except Exception as exc:  # noqa: BLE001 - leaving a room that is already gone may fail in any way
            log.warning("call %s: leaving the room: %s", self._target.session_id, exc)
        self._events_send.close()


class LiveKitTransport:
    """Joins ``ws://`` and ``wss://`` calls: the call's LiveKit room, as its agent."""

    name = "livekit"

    def __init__(self, *, api_key: str | None = None, api_secret: str | None = None) -> None:
        """``api_key`` and ``api_secret`` (a worker's, or ``LIVEKIT_API_*`` when set) let the
        agent hang up a phone caller when the call ends on its side; without them it can
        only with a call token that grants ``roomAdmin``."""
        self._admin: Callable[[str], str] | None = None
        if api_key and api_secret:
            self._admin = lambda room: admin_token(api_key, api_secret, room)

    def handles(self, url: str) -> bool:
        return urlsplit(url).scheme in SCHEMES

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[LiveKitSession]:
        """Join the room; leave it (and stop the session's thread) on exit.

        Raises:
            TransportError: The room could not be joined (the message says why).
        """
        thread = LoopThread(f"livekit-{target.session_id}", trio.lowlevel.current_trio_token())
        thread.start()
        session = LiveKitSession(target, thread, self._admin)
        try:
            await session._join()
            yield session
        finally:
            with trio.CancelScope(shield=True):
                await session._leave()
                await thread.aclose()
