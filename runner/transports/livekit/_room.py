"""The session's room as its asyncio loop sees it: joining and leaving, who is in it, the
caller's texts and phone keys, and losing it. Everything here runs on the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any

from livekit import rtc

from ...sessions import (
    DTMF_DIGITS,
    CallTarget,
    Disconnected,
    DtmfReceived,
    ParticipantJoined,
    ParticipantLeft,
    TransportError,
    TransportEvent,
    UserText,
)
from ._hearing import CallerAudio
from ._loop import LoopThread
from ._requests import RPC_METHODS, Requests
from ._roster import APP_KINDS, CALLER_KINDS, SIP_STATUS_ATTRIBUTE, Kind, classify, kind_name
from ._server_api import hang_up
from ._voice import AgentVoice

log = logging.getLogger("runner.transports.livekit")

MESSAGE_TOPIC = "curb.message"
CHAT_TOPIC = "lk.chat"
JOIN_TIMEOUT_S = 10.0  # the join itself; calls.py gives the whole start 15 s
LEAVE_TIMEOUT_S = 5.0
HANG_UP_TIMEOUT_S = 2.0  # removing the phone callers from the room, as the agent leaves
RECONNECT_LIMIT_S = 20.0  # a reconnect taking longer than this is a lost room


class Room:
    """One session's LiveKit room, on the session's loop.

    What Trio must learn goes through ``emit`` (an event of the session) and ``ring`` (a
    phone caller that rings, or no longer), both run in the Trio thread.

    Args:
        target: The call's room and token.
        thread: The session's loop thread.
        requests: Answers the app's RPCs.
        admin: A room's ``roomAdmin`` token, when the runner has the API key.
        emit: The session's events, in Trio.
        ring: Whether a phone caller rings, in Trio.
    """

    def __init__(
        self,
        target: CallTarget,
        thread: LoopThread,
        requests: Requests,
        *,
        admin: Callable[[str], str] | None,
        emit: Callable[[TransportEvent], None],
        ring: Callable[[str, bool], None],
    ) -> None:
        self._target = target
        self._thread = thread
        self._requests = requests
        self._admin = admin
        self._t_emit = emit
        self._t_ring = ring
        self._room: rtc.Room | None = None
        self._kinds: dict[str, Kind] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._leaving = False
        self._reconnect_timer: asyncio.TimerHandle | None = None
        self._reconnecting = False
        self.voice = AgentVoice(thread, self.spawn)
        """The agent's voice track."""
        self.hearing = CallerAudio(self.spawn, self.emit)
        """The caller's audio."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` on the loop; it is cancelled when the room is left."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def emit(self, event: TransportEvent) -> None:
        """Report ``event`` to the session (in Trio)."""
        self._thread.to_trio(self._t_emit, event)

    async def join(self, url: str, token: str) -> tuple[str, str]:
        """Join the room, publish the agent's voice, and report who is there.

        Returns:
            The agent's identity and the room's name.

        Raises:
            TransportError: The room could not be joined in time.
        """
        loop = asyncio.get_running_loop()
        room = rtc.Room(loop=loop)
        self._room = room
        room.on("participant_connected", self._on_joined)
        room.on("participant_disconnected", self._on_left)
        room.on("track_subscribed", self._on_track_subscribed)
        room.on("track_unsubscribed", self._on_track_unsubscribed)
        room.on("disconnected", self._on_disconnected)
        room.on("sip_dtmf_received", self._on_dtmf)
        room.on("participant_attributes_changed", self._on_attributes)
        room.on("reconnecting", self._on_reconnecting)
        room.on("reconnected", self._on_reconnected)
        room.register_text_stream_handler(CHAT_TOPIC, self._on_chat)
        try:
            await asyncio.wait_for(
                room.connect(url, token, rtc.RoomOptions(auto_subscribe=True)), JOIN_TIMEOUT_S
            )
        except TimeoutError:
            raise TransportError(
                f"could not join the LiveKit room at {url} within {JOIN_TIMEOUT_S:g} s"
            ) from None
        except rtc.ConnectError as exc:
            raise TransportError(f"could not join the LiveKit room at {url}: {exc.message}") from None
        local = room.local_participant
        for method in RPC_METHODS:
            local.register_rpc_method(method, self._requests.a_on_rpc)
        if local.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            log.warning(
                "call %s joined as %s, not as an agent: mint the realtimeToken with kind agent so apps find it",
                self._target.session_id,
                kind_name(local),
            )
        # The voice is published before the call counts as connected: the first words are not
        # lost to a late subscription, and a publisher's join reaches the others at once
        # (LiveKit batches the joins of participants that publish nothing, up to 3 s).
        try:
            await self.voice.a_open(local)
        except BaseException:
            await self._disconnect()
            raise
        for participant in list(room.remote_participants.values()):
            self._on_joined(participant)
        return local.identity, room.name

    async def leave(self) -> None:
        """Let the last words out, hang up a phone still on the line, and leave."""
        self._leaving = True
        room = self._room
        if self._reconnect_timer is not None:
            self._reconnect_timer.cancel()
        await self.voice.a_drain(connected=room is not None and room.isconnected())
        phones = sorted(identity for identity, kind in self._kinds.items() if kind == "sip")
        if phones and room is not None and room.isconnected():
            # The call ends on the agent's side with the phone still on the line: hang it up.
            with suppress(TimeoutError):
                await asyncio.wait_for(
                    hang_up(self._target, room.name, phones, self._admin), HANG_UP_TIMEOUT_S
                )
        await self._disconnect()
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await self.voice.a_close()

    async def send_text(self, text: str, destinations: list[str]) -> None:
        """Send ``text`` on topic ``curb.message`` to ``destinations``."""
        assert self._room is not None
        await self._room.local_participant.send_text(
            text, topic=MESSAGE_TOPIC, destination_identities=destinations
        )

    async def send_dtmf(self, digits: str) -> None:
        """Press ``digits`` on the phone line."""
        assert self._room is not None
        for digit in digits:
            await self._room.local_participant.publish_dtmf(code=DTMF_DIGITS.index(digit), digit=digit)

    async def _disconnect(self) -> None:
        room = self._room
        if room is None:
            return
        local = room.local_participant if room.isconnected() else None
        if local is not None:
            for method in RPC_METHODS:
                local.unregister_rpc_method(method)
        room.unregister_text_stream_handler(CHAT_TOPIC)
        try:
            await asyncio.wait_for(room.disconnect(), LEAVE_TIMEOUT_S - 1)
        except TimeoutError:
            log.warning("call %s: LiveKit did not confirm leaving the room", self._target.session_id)

    # -- Who is in the room -------------------------------------------------------------------

    def _on_joined(self, participant: rtc.RemoteParticipant) -> None:
        identity = participant.identity
        if identity in self._kinds:
            return
        has_caller = any(kind in CALLER_KINDS for kind in self._kinds.values())
        kind = classify(participant, has_caller=has_caller)
        log.info(
            "call %s: %s joined as %s (%s)", self._target.session_id, identity, kind, kind_name(participant)
        )
        if kind is None:
            return
        self._kinds[identity] = kind
        self.emit(ParticipantJoined(identity=identity, kind=kind))
        if kind == "sip" and participant.attributes.get(SIP_STATUS_ATTRIBUTE) == "ringing":
            self._thread.to_trio(self._t_ring, identity, True)
        if kind in CALLER_KINDS:
            for publication in participant.track_publications.values():
                track = publication.track
                if track is not None and publication.kind == rtc.TrackKind.KIND_AUDIO:
                    self.hearing.listen(track, identity)

    def _on_left(self, participant: rtc.RemoteParticipant) -> None:
        if self._reconnecting:
            return  # a restarting connection forgets everyone; _on_reconnected settles it
        self._gone(participant.identity)

    def _on_attributes(self, changed: dict[str, str], participant: rtc.Participant) -> None:
        status = changed.get(SIP_STATUS_ATTRIBUTE)
        if status is not None and self._kinds.get(participant.identity) == "sip":
            self._thread.to_trio(self._t_ring, participant.identity, status == "ringing")

    def _gone(self, identity: str) -> None:
        kind = self._kinds.pop(identity, None)
        if kind is None:
            return
        self._thread.to_trio(self._t_ring, identity, False)
        if self.hearing.listening_to == identity:
            self.hearing.stop()
        self.emit(ParticipantLeft(identity=identity, kind=kind))

    def _on_track_subscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if track.kind != rtc.TrackKind.KIND_AUDIO:
            return
        if self._kinds.get(participant.identity) in CALLER_KINDS:
            self.hearing.listen(track, participant.identity)

    def _on_track_unsubscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if self.hearing.listening_to == participant.identity and track.kind == rtc.TrackKind.KIND_AUDIO:
            self.hearing.stop()

    # -- Texts and phone keys -----------------------------------------------------------------

    def _on_dtmf(self, dtmf: rtc.SipDTMF) -> None:
        sender = dtmf.participant.identity if dtmf.participant is not None else ""
        if self._kinds.get(sender) not in ("sip", "caller"):
            return  # keys of a transfer target, or of nobody in the call, are not the caller's
        digit = dtmf.digit.upper() if len(dtmf.digit) == 1 and dtmf.digit.upper() in DTMF_DIGITS else None
        if digit is None and 0 <= dtmf.code < len(DTMF_DIGITS):
            digit = DTMF_DIGITS[dtmf.code]
        if digit is not None:
            self.emit(DtmfReceived(identity=sender, digit=digit))

    def _on_chat(self, reader: rtc.TextStreamReader, sender: str) -> None:
        if self._kinds.get(sender) not in APP_KINDS:
            return

        async def read() -> None:
            text = await reader.read_all()
            if text.strip():
                self.emit(UserText(text=text))

        self.spawn(read())

    # -- Losing the room ----------------------------------------------------------------------

    def _on_disconnected(self, reason: object) -> None:
        if self._reconnect_timer is not None:
            self._reconnect_timer.cancel()
        if not self._leaving:
            self._lost(_reason_name(reason))

    def _lost(self, reason: str) -> None:
        log.warning("call %s: lost the LiveKit room: %s", self._target.session_id, reason)
        self.emit(Disconnected(reason=reason))

    def _on_reconnecting(self) -> None:
        log.warning("call %s: the LiveKit connection dropped; reconnecting", self._target.session_id)
        self._reconnecting = True
        if self._reconnect_timer is None:
            loop = asyncio.get_running_loop()
            self._reconnect_timer = loop.call_later(RECONNECT_LIMIT_S, self._lost, "reconnect_timeout")

    def _on_reconnected(self) -> None:
        log.info("call %s: reconnected to the LiveKit room", self._target.session_id)
        self._reconnecting = False
        if self._reconnect_timer is not None:
            self._reconnect_timer.cancel()
            self._reconnect_timer = None
        # Who left or came while the connection was down.
        assert self._room is not None
        present = self._room.remote_participants
        for identity in [i for i in self._kinds if i not in present]:
            self._gone(identity)
        for participant in list(present.values()):
            self._on_joined(participant)


def _reason_name(reason: object) -> str:
    try:
        return rtc.DisconnectReason.Name(reason)  # type: ignore[arg-type]  # any value may come from the SDK; Name() raising is handled below
    except (ValueError, TypeError):
        return str(reason)
