"""LiveKit rooms: the runner's main transport.

A call whose ``realtimeUrl`` is ``ws://`` or ``wss://`` joins that LiveKit room with its
``realtimeToken`` (minted by the host with kind ``agent``; this module needs no API
secret). The caller's app talks to the agent with plain LiveKit:

* RPC ``curb.message`` (``{key, id, payload}`` -> ``{reply}``) and ``curb.update``
  (SessionUpdate -> EffectiveSettings); a refusal is an ``RpcError`` (code 1500) whose
  message is the code and whose data, when there is any, is ``{"issues": ...}`` or
  ``{"path": ...}`` as JSON. A request over 15 KiB is refused ``payload_too_large``.
* Text stream topic ``curb.message``: the agent's ``{key, payload}`` to the app.
* Text stream topic ``lk.chat`` (LiveKit's chat convention): a typed turn.
* Audio both ways: the caller's microphone track in, the agent's voice track out.

The ``livekit`` SDK is asyncio and this is the only module of the runner that imports
asyncio. Each session runs one asyncio event loop in a thread of its own, started when the
call joins and stopped (and its thread joined) when it leaves: a call never leaves a thread
behind, and one call's stalled room or slow callback never delays another call's audio.
A plain loop in a thread rather than trio-asyncio: the SDK builds futures and queues on
whatever loop is current and its native library wakes that loop with
``call_soon_threadsafe``, so it gets exactly the world it was written for, and Trio keeps a
single scheduler. Every call from Trio into the loop is bounded by a timeout; everything the
loop learns reaches Trio through ``TrioToken.run_sync_soon``. Methods named ``_a_*`` run on
the session's asyncio loop, ``_t_*`` in the Trio thread.

Who is who in the room (``ParticipantJoined.kind``), in this order:

1. The participant attribute ``curb.role``: ``caller``, ``app`` or ``transfer_target``
   (a host dialing a transfer target sets it, e.g. ``participant_attributes`` of
   ``CreateSIPParticipant``). ``caller`` on a SIP participant is ``sip``.
2. A participant of kind AGENT is ``agent``.
3. A SIP participant is ``sip`` (a phone caller) if no caller is in the room yet, else
   ``transfer_target`` (the host dialed someone into a call already in progress).
4. A STANDARD participant is ``caller`` if no caller is in the room yet, else ``app``.

Ingress, egress and other kinds are not part of the conversation and are not reported.
The agent hears only the caller's (``caller`` or ``sip``) audio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import attrs
import trio
from livekit import rtc

from ..sessions import (
    AudioFrame,
    CallTarget,
    ClientRefusal,
    Disconnected,
    ParticipantJoined,
    ParticipantLeft,
    RequestHandler,
    TransportError,
    TransportEvent,
    UserText,
)

log = logging.getLogger("runner.transports.livekit")

SCHEMES = ("ws", "wss")
MESSAGE_TOPIC = "curb.message"
CHAT_TOPIC = "lk.chat"
RPC_METHODS = ("curb.message", "curb.update")
ROLE_ATTRIBUTE = "curb.role"
MAX_REQUEST_BYTES = 15 * 1024
REFUSAL_RPC_CODE = 1500  # RpcError.ErrorCode.APPLICATION_ERROR

JOIN_TIMEOUT_S = 10.0  # the join itself; calls.py gives the whole start 15 s
CALL_TIMEOUT_S = 5.0  # a cross-thread call that should be quick (a send, a clear)
LEAVE_TIMEOUT_S = 5.0
THREAD_EXIT_TIMEOUT_S = 3.0
REQUEST_WAIT_S = 10.0  # a request that arrives before the agent's runtime took requests
REQUESTS_CANCEL_TIMEOUT_S = 2.0
RECONNECT_LIMIT_S = 20.0  # a reconnect taking longer than this is a lost room

# The caller's audio at the rate the recognizers and Silero work at: WebRTC's sink resamples
# Opus's 48 kHz as it hands each frame over, where a streaming resampler in the runner would
# cost CPU per frame and could hold audio back (soxr's high quality: 20 ms on average).
AUDIO_IN_RATE_HZ = 16_000
# The frames WebRTC's playout clock makes: a longer one would wait for its second half.
AUDIO_IN_FRAME_MS = 10
AUDIO_OUT_RATE_HZ = 48_000
AUDIO_OUT_FRAME_MS = 20
AUDIO_OUT_QUEUE_MS = 200  # how far publish_audio runs ahead of what the caller hears
RESAMPLER_FLUSH_IDLE_S = 0.06  # flush the resampler's tail once no more speech follows
# 10 s of caller audio not yet taken: drop, do not hoard.
MAX_AUDIO_BACKLOG_FRAMES = 10_000 // AUDIO_IN_FRAME_MS

Kind = Literal["caller", "app", "sip", "agent", "transfer_target"]
_CALLER_KINDS = ("caller", "sip")
_APP_KINDS = ("caller", "app")

T = TypeVar("T")


# -- One asyncio loop in one thread, driven from Trio ----------------------------------------


class _LoopThread:
    """An asyncio event loop running in its own thread, for one session."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken) -> None:
        self.loop = asyncio.new_event_loop()
        self._token = token
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._exited = trio.Event()
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            # Whatever is left (an SDK task that outlived its room) gets a bounded goodbye.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:
            log.exception("the LiveKit event loop failed")
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            self.to_trio(self._exited.set)

    def to_trio(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` soon in the Trio thread; False once Trio is gone."""

        def guarded() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("LiveKit callback %r failed", fn)

        try:
            self._token.run_sync_soon(guarded)
        except trio.RunFinishedError:
            return False
        return True

    def call_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` soon on the loop (from any thread); False once it is closed."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]], *, timeout_s: float, what: str) -> T:
        """Run the coroutine ``make()`` on the loop; wait for it, at most ``timeout_s``.

        Raises:
            TransportError: The coroutine failed, the loop is gone, or it did not finish in
                time (it is then cancelled).
        """
        if self._stopping:
            raise TransportError(f"could not {what}: the LiveKit session is closed")
        coro = make()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()
            raise TransportError(f"could not {what}: the LiveKit session is closed") from None
        done = trio.Event()
        future.add_done_callback(lambda _: self.to_trio(done.set))
        try:
            with trio.fail_after(timeout_s):
                await done.wait()
        except trio.TooSlowError:
            future.cancel()
            raise TransportError(f"could not {what} within {timeout_s:g} s") from None
        except BaseException:
            future.cancel()
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise TransportError(f"could not {what}: the LiveKit session is closed") from None
        except TransportError:
            raise
        except Exception as exc:
            raise TransportError(f"could not {what}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        """Stop the loop and wait for its thread to end (bounded)."""
        self._stopping = True
        if not self.call_soon(self.loop.stop):
            return
        with trio.move_on_after(THREAD_EXIT_TIMEOUT_S):
            await self._exited.wait()
        if self._exited.is_set():
            self._thread.join(timeout=1.0)  # it is past its last line
        else:
            log.error(
                "the LiveKit thread %s did not stop within %g s", self._thread.name, THREAD_EXIT_TIMEOUT_S
            )


# -- Requests from the caller's app (RPC) -----------------------------------------------------


@attrs.define(eq=False)
class _Request:
    """One RPC from the caller's app, on its way from the loop to Trio and back."""

    method: str
    payload: str
    caller: str
    answer: asyncio.Future[tuple[str | None, str | None, str | None]]
    loop: asyncio.AbstractEventLoop
    scope: trio.CancelScope | None = None
    cancelled: bool = False

    def resolve(self, reply: str | None, code: str | None = None, data: str | None = None) -> None:
        """Hand the outcome back to the loop (from Trio): a reply, or a refusal code."""

        def settle() -> None:
            if not self.answer.done():
                self.answer.set_result((reply, code, data))

        # The loop may be gone: the caller learns it from LiveKit.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)

    def cancel(self) -> None:
        """The caller stopped waiting (Trio side)."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


_GONE = "\x00gone"  # a request whose answer is LiveKit's own "recipient disconnected"


# -- The session ---------------------------------------------------------------------------


def _kind_name(participant: rtc.Participant) -> str:
    try:
        return rtc.ParticipantKind.Name(participant.kind)
    except ValueError:
        return str(participant.kind)


def _reason_name(reason: object) -> str:
    try:
        return rtc.DisconnectReason.Name(reason)  # type: ignore[arg-type]  # any value may come from the SDK; Name() raising is handled below
    except (ValueError, TypeError):
        return str(reason)


class LiveKitSession:
    """The agent's side of one call in a LiveKit room (a :class:`TransportSession`)."""

    kind = "livekit"

    def __init__(self, target: CallTarget, thread: _LoopThread) -> None:
        self._target = target
        self._thread = thread
        self.identity = ""
        self.room_name = ""
        # Trio side.
        self._events_send, self._events = trio.open_memory_channel[TransportEvent](math.inf)
        self._present: dict[str, Kind] = {}
        self._handler: RequestHandler | None = None
        self._handler_set = trio.Event()
        self._requests: set[_Request] = set()
        self._requests_idle = trio.Event()
        self._requests_idle.set()
        self._closing = False
        self._disconnected = False
        self._audio_lock = trio.Lock()
        self._generation = 0
        self._dropped_frames = 0
        # Loop side: touched only by _a_* methods.
        self._room: rtc.Room | None = None
        self._source: rtc.AudioSource | None = None
        self._a_kinds: dict[str, Kind] = {}
        self._a_listening_to: str | None = None
        self._a_audio_task: asyncio.Task[None] | None = None
        self._a_tasks: set[asyncio.Task[Any]] = set()
        self._a_leaving = False
        self._a_generation = 0
        self._a_resampler: tuple[int, rtc.AudioResampler] | None = None
        self._a_flush_timer: asyncio.TimerHandle | None = None
        self._a_play_lock: asyncio.Lock | None = None
        self._a_reconnect_timer: asyncio.TimerHandle | None = None
        self._a_reconnecting = False

    # -- The TransportSession interface (Trio) ------------------------------------------------

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]:
        return self._events

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._handler = handler
        self._handler_set.set()

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        kinds = set(self._present.values())
        if kinds & set(_APP_KINDS):
            return "ok"
        if "sip" in kinds:
            return "phone"
        return "no_app"

    async def send_to_client(self, key: str, payload: Any) -> None:
        """Send ``{key, payload}`` on text stream topic ``curb.message`` to the app(s).

        Raises:
            TransportError: No app is in the room, or LiveKit did not take the message.
        """
        apps = sorted(identity for identity, kind in self._present.items() if kind in _APP_KINDS)
        if not apps:
            raise TransportError("no app is in the room")
        text = json.dumps({"key": key, "payload": payload}, separators=(",", ":"), ensure_ascii=False)
        await self._thread.run(
            lambda: self._a_send_text(text, apps), timeout_s=CALL_TIMEOUT_S, what="send a message"
        )

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        """Play agent speech; returns once it is queued no more than ~200 ms ahead of playout."""
        if not pcm:
            await trio.lowlevel.checkpoint()
            return
        if sample_rate_hz <= 0 or len(pcm) % 2:
            raise ValueError("publish_audio takes whole 16-bit samples at a positive rate")
        generation = self._generation
        seconds = len(pcm) / 2 / sample_rate_hz
        async with self._audio_lock:
            if generation != self._generation:
                return  # cleared while it waited its turn
            await self._thread.run(
                lambda: self._a_play(pcm, sample_rate_hz, generation),
                timeout_s=seconds + CALL_TIMEOUT_S,
                what="play the agent's speech",
            )

    async def clear_audio(self) -> None:
        """Drop the agent's speech still queued (a barge-in)."""
        self._generation += 1
        generation = self._generation
        await self._thread.run(
            lambda: self._a_clear(generation), timeout_s=CALL_TIMEOUT_S, what="clear the agent's speech"
        )

    # -- Trio side --------------------------------------------------------------------------

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

    def _t_start_request(self, request: _Request) -> None:
        if self._closing:
            request.resolve(None, _GONE)
            return
        request.scope = trio.CancelScope()
        if request.cancelled:
            request.scope.cancel()
        self._requests.add(request)
        self._requests_idle = trio.Event()
        # A system task: the session has no nursery of its own (calls.py enters the session
        # inside its start timeout), so the session keeps the set and cancels it on close.
        trio.lowlevel.spawn_system_task(self._t_serve_request, request, name=f"livekit {request.method}")

    async def _t_serve_request(self, request: _Request) -> None:
        outcome: tuple[str | None, str | None, str | None] = (None, _GONE, None)
        try:
            assert request.scope is not None
            with request.scope:
                outcome = await self._t_answer(request)
        except Exception:
            log.exception("call %s: the %s request failed", self._target.session_id, request.method)
            outcome = (None, "internal", None)
        finally:
            request.resolve(*outcome)
            self._requests.discard(request)
            if not self._requests:
                self._requests_idle.set()

    async def _t_answer(self, request: _Request) -> tuple[str | None, str | None, str | None]:
        if self._handler is None:
            with trio.move_on_after(REQUEST_WAIT_S):
                await self._handler_set.wait()
        if self._handler is None:
            return None, ("not_adjustable" if request.method == "curb.update" else "no_handler"), None
        try:
            reply = await self._handler(request.method, request.payload, request.caller)
        except ClientRefusal as refusal:
            data = json.dumps(refusal.data, separators=(",", ":")) if refusal.data else None
            return None, refusal.code, data
        return reply, None, None

    # -- Joining and leaving (Trio) ---------------------------------------------------------

    async def _join(self) -> None:
        target = self._target
        await self._thread.run(
            lambda: self._a_join(target.url, target.token),
            timeout_s=JOIN_TIMEOUT_S + 1,
            what=f"join the LiveKit room at {target.url}",
        )

    async def _leave(self) -> None:
        self._closing = True
        for request in list(self._requests):
            request.cancel()
        with trio.move_on_after(REQUESTS_CANCEL_TIMEOUT_S):
            await self._requests_idle.wait()
        try:
            await self._thread.run(self._a_leave, timeout_s=LEAVE_TIMEOUT_S, what="leave the room")
        except Exception as exc:  # noqa: BLE001 - leaving a room that is already gone may fail in any way
            log.warning("call %s: leaving the room: %s", self._target.session_id, exc)
        self._events_send.close()

    # -- Loop side: the room ----------------------------------------------------------------

    def _a_spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._a_tasks.add(task)
        task.add_done_callback(self._a_tasks.discard)
        return task

    async def _a_join(self, url: str, token: str) -> None:
        loop = asyncio.get_running_loop()
        self._a_play_lock = asyncio.Lock()
        room = rtc.Room(loop=loop)
        self._room = room
        room.on("participant_connected", self._a_on_joined)
        room.on("participant_disconnected", self._a_on_left)
        room.on("track_subscribed", self._a_on_track_subscribed)
        room.on("track_unsubscribed", self._a_on_track_unsubscribed)
        room.on("disconnected", self._a_on_disconnected)
        room.on("reconnecting", self._a_on_reconnecting)
        room.on("reconnected", self._a_on_reconnected)
        room.register_text_stream_handler(CHAT_TOPIC, self._a_on_chat)
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
        self.identity = local.identity
        self.room_name = room.name
        for method in RPC_METHODS:
            local.register_rpc_method(method, self._a_on_rpc)
        if local.kind != rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            log.warning(
                "call %s joined as %s, not as an agent: mint the realtimeToken with kind agent so apps find it",
                self._target.session_id,
                _kind_name(local),
            )
        # The voice is published before the call counts as connected: the first words are not
        # lost to a late subscription, and a publisher's join reaches the others at once
        # (LiveKit batches the joins of participants that publish nothing, up to 3 s).
        try:
            source = rtc.AudioSource(AUDIO_OUT_RATE_HZ, 1, queue_size_ms=AUDIO_OUT_QUEUE_MS, loop=loop)
            self._source = source
            track = rtc.LocalAudioTrack.create_audio_track("agent-voice", source)
            options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
            await local.publish_track(track, options)
        except BaseException:
            await self._a_disconnect()
            raise
        for participant in list(room.remote_participants.values()):
            self._a_on_joined(participant)

    async def _a_leave(self) -> None:
        self._a_leaving = True
        room = self._room
        if self._a_reconnect_timer is not None:
            self._a_reconnect_timer.cancel()
        if self._source is not None and room is not None and room.isconnected():
            # What is queued is at most AUDIO_OUT_QUEUE_MS: let the last words out.
            with suppress(TimeoutError):
                await asyncio.wait_for(self._a_drain_speech(), AUDIO_OUT_QUEUE_MS / 1000 + 0.3)
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()
        await self._a_disconnect()
        tasks = [t for t in self._a_tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        if self._source is not None:
            await self._source.aclose()

    async def _a_drain_speech(self) -> None:
        assert self._source is not None
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()
            await self._a_flush(self._a_generation)
        await self._source.wait_for_playout()

    async def _a_disconnect(self) -> None:
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

    def _a_emit(self, event: TransportEvent) -> None:
        self._thread.to_trio(self._t_emit, event)

    # -- Loop side: who is in the room ------------------------------------------------------

    def _a_has_caller(self) -> bool:
        return any(kind in _CALLER_KINDS for kind in self._a_kinds.values())

    def _a_classify(self, participant: rtc.RemoteParticipant) -> Kind | None:
        is_sip = participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP
        role = participant.attributes.get(ROLE_ATTRIBUTE)
        if role == "caller":
            return "sip" if is_sip else "caller"
        if role in ("app", "transfer_target"):
            return role  # type: ignore[return-value]  # narrowed to the two literals by the membership test just above
        if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            return "agent"
        if is_sip:
            return "transfer_target" if self._a_has_caller() else "sip"
        if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD:
            return "app" if self._a_has_caller() else "caller"
        return None

    def _a_on_joined(self, participant: rtc.RemoteParticipant) -> None:
        identity = participant.identity
        if identity in self._a_kinds:
            return
        kind = self._a_classify(participant)
        log.info(
            "call %s: %s joined as %s (%s)", self._target.session_id, identity, kind, _kind_name(participant)
        )
        if kind is None:
            return
        self._a_kinds[identity] = kind
        self._a_emit(ParticipantJoined(identity=identity, kind=kind))
        if kind in _CALLER_KINDS:
            for publication in participant.track_publications.values():
                track = publication.track
                if track is not None and publication.kind == rtc.TrackKind.KIND_AUDIO:
                    self._a_listen(track, identity)

    def _a_on_left(self, participant: rtc.RemoteParticipant) -> None:
        if self._a_reconnecting:
            return  # a restarting connection forgets everyone; _a_on_reconnected settles it
        self._a_gone(participant.identity)

    def _a_gone(self, identity: str) -> None:
        kind = self._a_kinds.pop(identity, None)
        if kind is None:
            return
        if self._a_listening_to == identity:
            self._a_stop_listening()
        self._a_emit(ParticipantLeft(identity=identity, kind=kind))

    # -- Loop side: the caller's audio ------------------------------------------------------

    def _a_on_track_subscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if track.kind != rtc.TrackKind.KIND_AUDIO:
            return
        if self._a_kinds.get(participant.identity) in _CALLER_KINDS:
            self._a_listen(track, participant.identity)

    def _a_on_track_unsubscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if self._a_listening_to == participant.identity and track.kind == rtc.TrackKind.KIND_AUDIO:
            self._a_stop_listening()

    def _a_listen(self, track: rtc.Track, identity: str) -> None:
        if self._a_audio_task is not None and not self._a_audio_task.done():
            return  # one caller track at a time
        self._a_listening_to = identity
        self._a_audio_task = self._a_spawn(self._a_read_audio(track))

    def _a_stop_listening(self) -> None:
        if self._a_audio_task is not None:
            self._a_audio_task.cancel()
        self._a_audio_task = None
        self._a_listening_to = None

    async def _a_read_audio(self, track: rtc.Track) -> None:
        stream = rtc.AudioStream(
            track, sample_rate=AUDIO_IN_RATE_HZ, num_channels=1, frame_size_ms=AUDIO_IN_FRAME_MS
        )
        try:
            async for event in stream:
                frame = event.frame
                self._a_emit(AudioFrame(pcm=bytes(frame.data), sample_rate_hz=frame.sample_rate))
        finally:
            await stream.aclose()

    # -- Loop side: the agent's voice -------------------------------------------------------

    def _a_frames(self, pcm: bytes, rate: int) -> list[rtc.AudioFrame]:
        if rate != AUDIO_OUT_RATE_HZ:
            if self._a_resampler is None or self._a_resampler[0] != rate:
                self._a_resampler = (rate, rtc.AudioResampler(rate, AUDIO_OUT_RATE_HZ, num_channels=1))
            data = b"".join(bytes(f.data) for f in self._a_resampler[1].push(bytearray(pcm)))
        else:
            data = pcm
        return _split(data)

    async def _a_capture(self, frames: list[rtc.AudioFrame], generation: int) -> None:
        assert self._source is not None
        for frame in frames:
            if generation != self._a_generation:
                return
            await self._source.capture_frame(frame)

    async def _a_play(self, pcm: bytes, rate: int, generation: int) -> None:
        assert self._a_play_lock is not None
        async with self._a_play_lock:
            if self._a_flush_timer is not None:
                self._a_flush_timer.cancel()
                self._a_flush_timer = None
            if generation != self._a_generation:
                return
            await self._a_capture(self._a_frames(pcm, rate), generation)
            if self._a_resampler is not None:
                # A streaming resampler holds a few ms back; let them out once speech pauses.
                loop = asyncio.get_running_loop()
                self._a_flush_timer = loop.call_later(
                    RESAMPLER_FLUSH_IDLE_S, lambda: self._a_spawn(self._a_flush(generation))
                )

    async def _a_flush(self, generation: int) -> None:
        assert self._a_play_lock is not None
        self._a_flush_timer = None
        async with self._a_play_lock:
            if self._a_resampler is None or generation != self._a_generation:
                return
            data = b"".join(bytes(f.data) for f in self._a_resampler[1].flush())
            await self._a_capture(_split(data), generation)

    async def _a_clear(self, generation: int) -> None:
        self._a_generation = generation
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()
            self._a_flush_timer = None
        self._a_resampler = None
        if self._source is not None:
            self._source.clear_queue()

    # -- Loop side: messages ----------------------------------------------------------------

    async def _a_send_text(self, text: str, destinations: list[str]) -> None:
        assert self._room is not None
        await self._room.local_participant.send_text(
            text, topic=MESSAGE_TOPIC, destination_identities=destinations
        )

    def _a_on_chat(self, reader: rtc.TextStreamReader, sender: str) -> None:
        if self._a_kinds.get(sender) not in _APP_KINDS:
            return

        async def read() -> None:
            text = await reader.read_all()
            if text.strip():
                self._a_emit(UserText(text=text))

        self._a_spawn(read())

    async def _a_on_rpc(self, data: rtc.RpcInvocationData) -> str:
        if len(data.payload.encode()) > MAX_REQUEST_BYTES:
            raise rtc.RpcError(REFUSAL_RPC_CODE, "payload_too_large")
        loop = asyncio.get_running_loop()
        request = _Request(
            method=data.method,
            payload=data.payload,
            caller=data.caller_identity,
            answer=loop.create_future(),
            loop=loop,
        )
        if not self._thread.to_trio(self._t_start_request, request):
            raise _recipient_gone()
        try:
            reply, code, error_data = await request.answer
        except asyncio.CancelledError:
            self._thread.to_trio(request.cancel)
            raise
        if code == _GONE:
            raise _recipient_gone()
        if code is not None:
            raise rtc.RpcError(REFUSAL_RPC_CODE, code, error_data)
        return reply or ""

    # -- Loop side: losing the room ---------------------------------------------------------

    def _a_on_disconnected(self, reason: object) -> None:
        if self._a_reconnect_timer is not None:
            self._a_reconnect_timer.cancel()
        if not self._a_leaving:
            self._a_lost(_reason_name(reason))

    def _a_lost(self, reason: str) -> None:
        log.warning("call %s: lost the LiveKit room: %s", self._target.session_id, reason)
        self._a_emit(Disconnected(reason=reason))

    def _a_on_reconnecting(self) -> None:
        log.warning("call %s: the LiveKit connection dropped; reconnecting", self._target.session_id)
        self._a_reconnecting = True
        if self._a_reconnect_timer is None:
            loop = asyncio.get_running_loop()
            self._a_reconnect_timer = loop.call_later(RECONNECT_LIMIT_S, self._a_lost, "reconnect_timeout")

    def _a_on_reconnected(self) -> None:
        log.info("call %s: reconnected to the LiveKit room", self._target.session_id)
        self._a_reconnecting = False
        if self._a_reconnect_timer is not None:
            self._a_reconnect_timer.cancel()
            self._a_reconnect_timer = None
        # Who left or came while the connection was down.
        assert self._room is not None
        present = self._room.remote_participants
        for identity in [i for i in self._a_kinds if i not in present]:
            self._a_gone(identity)
        for participant in list(present.values()):
            self._a_on_joined(participant)


def _recipient_gone() -> rtc.RpcError:
    code = rtc.RpcError.ErrorCode.RECIPIENT_DISCONNECTED
    return rtc.RpcError(code, rtc.RpcError.ErrorMessage[code])


def _split(data: bytes) -> list[rtc.AudioFrame]:
    step = AUDIO_OUT_RATE_HZ * AUDIO_OUT_FRAME_MS // 1000 * 2
    frames = []
    for start in range(0, len(data), step):
        chunk = data[start : start + step]
        frames.append(rtc.AudioFrame(chunk, AUDIO_OUT_RATE_HZ, 1, len(chunk) // 2))
    return frames


# -- The transport -------------------------------------------------------------------------


class LiveKitTransport:
    """Joins ``ws://`` and ``wss://`` calls: the call's LiveKit room, as its agent."""

    name = "livekit"

    def handles(self, url: str) -> bool:
        return urlsplit(url).scheme in SCHEMES

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[LiveKitSession]:
        """Join the room; leave it (and stop the session's thread) on exit.

        Raises:
            TransportError: The room could not be joined (the message says why).
        """
        thread = _LoopThread(f"livekit-{target.session_id}", trio.lowlevel.current_trio_token())
        thread.start()
        session = LiveKitSession(target, thread)
        try:
            await session._join()
            yield session
        finally:
            with trio.CancelScope(shield=True):
                await session._leave()
                await thread.aclose()


def worker_token(api_key: str, api_secret: str, *, ttl_s: int = 600) -> str:
    """A token for the LiveKit agent-worker socket (``/agent``): the ``agent`` grant."""
    from datetime import timedelta

    from livekit import api

    return (
        api.AccessToken(api_key, api_secret)
        .with_grants(api.VideoGrants(agent=True))
        .with_ttl(timedelta(seconds=ttl_s))
        .to_jwt()
    )
