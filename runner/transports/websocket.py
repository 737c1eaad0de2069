"""The agent WebSocket (subprotocol ``ino.v2``): one socket per connection, one call per conversation.

A socket authenticates with an ephemeral token, then joins the conversation its URL names.
That conversation is a call of the runner: the first socket starts it through
:meth:`Runner.start_call` with an ``ino://<conversation id>`` URL, which
:class:`WebSocketTransport` joins by handing out the conversation's :class:`InoCall` (the
call's transport session); more sockets on the same conversation attach to the same call,
and the call ends when its last socket closes. So a socket counts against the runner's
capacity, shows in ``GET /v1/runner``, has its turns journaled under the conversation id,
takes host messages and live settings, and is drained like any call.

:class:`Connection` is the protocol driver of one socket: auth, the nine verbs, recordings,
seq numbering and the close codes. :class:`InoCall` runs the conversation's turns through
the call's :class:`~runner.agent._runtime.AgentRuntime` and turns what they report into
frames for the socket that asked. :class:`AgentSocketService` ties both to the runner, the
store of tokens and conversations, and the public REST routes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import collections
import logging
import math
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import attrs
import trio

from journal import AgentStore, ConversationRow, KnowledgeHit, RelationRow, Spent, StoredMessage, StoredToolCall, TokenRow, UsageRow, now_ms

from .. import ino_wire as w
from ..agent._runtime import AgentRuntime, ConfirmationNotWaiting, PendingConfirmation, PlatformTool, TurnBusy
from ..calls import keep_json
from ..errors import GenerationMismatch, NotFound, RunnerAtCapacity, RunnerDraining, RunnerError, StartFailed, Unauthorized
from ..providers import ChatMessage, ProviderError, ToolCall, ToolSpec
from ..voice.engine import (
    AudioData,
    AudioEnd,
    AudioStart,
    Heard,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    Thought,
    ToolConfirmRequested,
    ToolEnded,
    ToolOutcome,
    ToolStarted,
    TurnEvent,
    TurnFinished,
    TurnResult,
    TurnStarted,
    UsageReported,
    new_turn_id,
)
from ..voice.audio import pcm_seconds, rms_dbfs
from ..wire import StartCallRequest
from ._base import CallTarget, Disconnected, RequestHandler, TransportError, TransportEvent

if TYPE_CHECKING:
    from ..agent import Agent, AppTool
    from ..calls import Runner

log = logging.getLogger("runner.websocket")

SCHEME = "ino"
AUTH_TIMEOUT_S = 10.0
DEFAULT_IDLE_SECONDS = 300
MAX_RECORDING_BYTES = 10_000_000
MAX_TRANSCRIBING = 3
MAX_CONNECTIONS_PER_END_USER = 3
HEARING_RATE_HZ = 16_000
# A recording quieter than this holds no speech (digital silence, a muted microphone).
SILENCE_DBFS = -70.0
DEFAULT_TTL_SECONDS = 600
MAX_TTL_SECONDS = 86_400
# Bounds on cleanup: a socket that leaves lets its turn unwind for this long.
_UNWIND_S = 10.0
_CLOSE_S = 5.0
# The platform's own tools, offered by the agent's options.
KNOWLEDGE_TOOL = "search_knowledge"
RELATION_TOOL = "record_relationship"
KNOWLEDGE_HITS = 3
MAX_NOTE_CHARS = 500
# What a turn costs, in credits: per 1,000 model tokens (input and output), and per minute
# of transcription and of speech.
CREDITS_PER_1K_TOKENS = 1.0
CREDITS_PER_TRANSCRIPTION_MINUTE = 1.0
CREDITS_PER_SPEECH_MINUTE = 1.0
_AGENT_NAMESPACE = uuid.UUID("5b0c7c3e-0e51-4c57-9f57-8f1f3c1a6e21")
_WORD = re.compile(r"[a-z0-9']+")

CLOSE_REASONS = {
    4001: "No credentials were sent. Send auth as the first frame, within 10 seconds.",
    4002: "Invalid, revoked or expired credentials, or an API key instead of a token.",
    4003: "This token has expired. Mint another and reconnect.",
    4004: "This token was revoked, or has spent its credit limit.",
    4005: "Your organisation has no credits left.",
    4006: "Too many turns, or too many connections on one token. Slow down and reconnect.",
    4007: "Closed after a period with no activity. ping does not count as activity.",
    4008: "That conversation is not available: unknown, deleted, or its agent or person was deleted.",
    4009: "The frame could not be understood, or the session in the URL and the auth frame differ.",
    4010: "This capability is not available.",
    4011: "Unaccountable audio: too much for one turn, or no user_audio.start before it.",
    4013: "The connection failed on our side. Reconnect.",
    4014: "This end user already has 3 open connections.",
}


def edge_version() -> str:
    try:
        return metadata.version("curb-runner")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def agent_id_of(agent: Agent) -> str:
    """A stable id for the agent this runner serves, the same across restarts."""
    return str(uuid.uuid5(_AGENT_NAMESPACE, agent.name))


def new_session_id() -> str:
    """A time-ordered id (UUIDv7 layout), so conversations sort by creation."""
    value = (now_ms() & ((1 << 48) - 1)) << 80 | 0x7 << 76 | secrets.randbits(12) << 64 | 0b10 << 62 | secrets.randbits(62)
    return str(uuid.UUID(int=value))


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _with_stop(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def _wire_call_id(kind: w.ToolKind, call_id: str) -> str | None:
    """The platform's own calls carry no call_id on the wire."""
    return None if kind == "platform" else call_id


def relation_body(row: RelationRow) -> w.RelationBody:
    return w.RelationBody(
        agent_id=row.agent_id,
        end_user_id=row.end_user_id,
        conversations=row.conversations,
        first_at=w.rfc3339(row.first_at),
        last_at=w.rfc3339(row.last_at),
        notes=[w.RelationNoteBody(note=n.note, recorded_at=w.rfc3339(n.recorded_at)) for n in row.notes],
    )


# A small lexicon: the mood of a reply is the one whose words it uses most (ties: the
# earlier mood here); each word found adds 0.2 to its intensity, from 0.4, up to 1.
MOODS: tuple[tuple[str, frozenset[str]], ...] = (
    ("apologetic", frozenset({"sorry", "unfortunately", "afraid", "apologies", "cannot", "can't", "unable"})),
    ("cheerful", frozenset({"welcome", "hello", "glad", "happy", "lovely", "great", "wonderful", "enjoy", "delighted", "sunny"})),
    ("concerned", frozenset({"careful", "warning", "danger", "snowing", "storm", "late", "problem", "costs"})),
)
NEUTRAL_MOOD = ("calm", 0.2)


def mood_of(text: str) -> tuple[str, float]:
    """The mood a reply reports, and its intensity: deterministic, from :data:`MOODS`."""
    words = _WORD.findall(text.lower())
    best, count = NEUTRAL_MOOD[0], 0
    for mood, lexicon in MOODS:
        found = sum(1 for word in words if word in lexicon)
        if found > count:
            best, count = mood, found
    if count == 0:
        return NEUTRAL_MOOD
    return best, round(min(1.0, 0.2 + 0.2 * count), 2)


def summarise(previous: str | None, messages: list[ChatMessage]) -> str:
    """A conversation's summary: the one before it, then what each side said, one sentence each."""
    lines = [previous] if previous else ["Summary of the conversation so far."]
    for message in messages:
        text = " ".join(message.content.split())
        if not text or message.role not in ("user", "assistant"):
            continue
        who = "The person said:" if message.role == "user" else "You answered:"
        lines.append(f"{who} {_with_stop(text)}")
    return "\n".join(lines)


def usage_rows(result: TurnResult, speech_seconds: float) -> list[UsageRow]:
    """A turn's usage rows: model tokens, transcription seconds, speech seconds (each when used)."""
    rows = []
    if result.usage:
        tokens_in = sum(u.input_tokens for u in result.usage)
        tokens_out = sum(u.output_tokens for u in result.usage)
        rows.append(
            UsageRow(
                kind="model",
                model=result.usage[-1].model,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                credits=(tokens_in + tokens_out) / 1000 * CREDITS_PER_1K_TOKENS,
            )
        )
    if result.heard_seconds:
        rows.append(transcription_row(result.heard_seconds))
    if speech_seconds > 0:
        rows.append(UsageRow(kind="speech", seconds=round(speech_seconds, 3), credits=speech_seconds / 60 * CREDITS_PER_SPEECH_MINUTE))
    return rows


def transcription_row(seconds: float) -> UsageRow:
    return UsageRow(kind="transcription", seconds=round(seconds, 3), credits=seconds / 60 * CREDITS_PER_TRANSCRIPTION_MINUTE)


class TurnRunning(RunnerError):
    """A conversation cannot be compacted while a turn of it runs."""

    status = 409
    code = "conflict"


class CloseSocket(Exception):
    """End the socket with ``code``; ``reason`` is the specific cause, else the code's own text."""

    def __init__(self, code: int, reason: str | None = None) -> None:
        self.code = code
        self.reason = (reason or CLOSE_REASONS.get(code, ""))[:120]
        super().__init__(f"{code} {self.reason}")


class SocketIO(Protocol):
    """What the driver needs from the server's WebSocket (Quart's, behind ``runner.api``)."""

    @property
    def requested_subprotocols(self) -> list[str]: ...

    async def accept(self, subprotocol: str | None) -> None: ...

    async def receive(self) -> str | bytes: ...

    async def send(self, data: str | bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@attrs.frozen(kw_only=True)
class AgentSocketSetup:
    """What a runner needs to serve the agent WebSocket on its public listener.

    Attributes:
        agent: The agent every conversation talks to.
        api_key: The key that mints ephemeral tokens (``CURB_API_KEY``); ``None``: none can be minted.
        idle_seconds: A socket with no activity for this long is closed with 4007.
        credit_pool: The runner's own credits (``CURB_CREDIT_POOL``); once every token's
            turns spent them, sockets close with 4005. ``None``: no pool.
        token_turns_per_minute: Turns one token may take a minute (4006 past it); ``None``: no limit.
        token_connections: Open sockets one token may hold (4006 past it); ``None``: no limit.
    """

    agent: Agent
    api_key: str | None
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    credit_pool: float | None = None
    token_turns_per_minute: int | None = None
    token_connections: int | None = None


# -- The transport -------------------------------------------------------------------------


class WebSocketTransport:
    """Joins ``ino://<conversation id>`` calls: their caller is whoever holds a socket on it."""

    name = SCHEME

    def __init__(self) -> None:
        self.calls: dict[str, InoCall] = {}
        self.service: AgentSocketService | None = None

    def handles(self, url: str) -> bool:
        return urlsplit(url).scheme == SCHEME

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[InoCall]:
        if self.service is None:
            raise TransportError("the agent WebSocket is not served on this runner")
        # No nursery or cancel scope may span this yield: the call enters it inside its own
        # start timeout. Turns run in the service's nursery, each under its own cancel scope.
        call = InoCall(target.session_id, self.service)
        self.calls[target.session_id] = call
        try:
            yield call
        finally:
            with trio.CancelScope(shield=True):
                await call.wind_down()
            if self.calls.get(target.session_id) is call:
                del self.calls[target.session_id]


# -- One conversation's call ---------------------------------------------------------------


@attrs.define(eq=False, kw_only=True)
class _Recording:
    """An open recording: its audio so far and its partial recognition."""

    start: w.UserAudioStart
    rate_hz: int
    stt: Any
    audio: bytearray = attrs.Factory(bytearray)
    feed: trio.MemorySendChannel[bytes] | None = None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    barged: bool = False

    def pcm(self) -> bytes:
        return bytes(self.audio[: len(self.audio) // 2 * 2])

    @property
    def recording_id(self) -> str | None:
        return self.start.recording_id


@attrs.frozen(kw_only=True)
class _TurnRequest:
    """What a connection asked for: typed words, a recording, a confirmation, or the opening."""

    text: str | None = None
    scripted: str | None = None
    recording: _Recording | None = None
    confirm_call_id: str | None = None
    yes: bool = False
    speech: bool | None = None
    thoughts: bool = False


@attrs.define(eq=False, kw_only=True)
class _RunningTurn:
    id: str
    owner: Connection
    request: _TurnRequest
    app_tools: frozenset[str]
    stage: w.Stage = "model"
    cancel_reason: str | None = None
    mute_requested: bool = False
    muted_sent: bool = False
    started: bool = False
    finished: bool = False
    text: str = ""
    open_tools: dict[str, tuple[str, w.ToolKind, float]] = attrs.Factory(dict)
    knowledge: str | None = None
    relation: RelationRow | None = None
    speech_seconds: float = 0.0
    done: trio.Event = attrs.Factory(trio.Event)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)


Outcome = Literal["started", "held", "conflict"]


class InoCall:
    """The transport session of one conversation's call: its sockets, its turns, its messages."""

    kind = SCHEME
    # The runtime does not open the call on its own: the first socket's ready comes first.
    drives_turns = True

    def __init__(self, conversation_id: str, service: AgentSocketService) -> None:
        self.conversation_id = conversation_id
        self.service = service
        self.sockets: list[Connection] = []
        self.runtime: AgentRuntime | None = None
        self.turn: _RunningTurn | None = None
        self.held: tuple[Connection, _TurnRequest] | None = None
        self.closed = False
        self.recent_text = ""
        self._events_send, self._events = trio.open_memory_channel[TransportEvent](math.inf)
        self._app_calls: dict[str, trio.MemorySendChannel[ToolOutcome]] = {}
        self._attach_lock = trio.Lock()
        self._persisted = 0
        # The stored position of runtime.history[0]: messages a summary covers leave the history.
        self._first_position = 1
        self.summary: str | None = None
        self.pending_compacted: w.Compacted | None = None

    # -- TransportSession ----------------------------------------------------------------

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]:
        return self._events

    def set_request_handler(self, handler: RequestHandler) -> None:
        pass  # the socket has no client requests of the LiveKit kind

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        # ino.v2 has no frame for the agent's keyed messages to the app.
        return "no_app"

    async def send_to_client(self, key: str, payload: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        await trio.lowlevel.checkpoint()  # audio leaves as frames, from the turn's events

    async def clear_audio(self) -> None:
        await trio.lowlevel.checkpoint()

    # -- Sockets -------------------------------------------------------------------------

    async def attach(self, conn: Connection, runtime: AgentRuntime) -> None:
        """Add a socket: answer ``ready``, and start the opening turn on a new conversation.

        Raises:
            CloseSocket: The call is ending (4013).
        """
        async with self._attach_lock:
            greet: dict[str, Any] | None = None
            if self.runtime is None:
                with trio.move_on_after(_CLOSE_S):
                    await runtime.ready.wait()
                if not runtime.ready.is_set():
                    raise CloseSocket(4013, "the agent did not start")
                stored = await self.service.store.load_messages(self.conversation_id)
                summary = await self.service.store.latest_summary(self.conversation_id)
                after = 0
                if summary is not None:
                    self.summary, after = summary.summary, summary.after_position
                runtime.load_history(_chat_message(m) for m in stored if m.position > after)
                self._first_position = after + 1
                self._persisted = len(runtime.history)
                runtime.add_listener(self._on_turn_event)
                runtime.app_tool_handler = self._call_app_tool
                runtime.confirms_tools = True
                runtime.instruction_extras.append(self._extra_instructions)
                runtime.platform_tools.update(self._platform_tools())
                self.runtime = runtime
                if not stored:
                    greet = runtime.greeting_options()
            if self.closed:
                raise CloseSocket(4013, "the call ended; reconnect")
            self.sockets.append(conn)
            conn.call = self
            rate = runtime.voice_sample_rate_hz()
            relation = None
            if self.service.agent.relations:
                row = await self.service.store.relation(self.service.agent_id, conn.end_user_id)
                relation = relation_body(row) if row is not None else None
            conn.send(
                w.Ready(
                    session_id=self.conversation_id,
                    agent_id=self.service.agent_id,
                    end_user_id=conn.end_user_id,
                    speaks=rate is not None,
                    audio=w.AudioFormat(sample_rate=rate or 24_000),
                    hearing=w.AudioFormat(sample_rate=HEARING_RATE_HZ),
                    emotion=self.service.agent.moods,
                    relation=relation,
                    greeting=greet is not None and self.turn is None,
                    idle_seconds=self.service.idle_seconds,
                    edge_version=edge_version(),
                )
            )
            if greet is not None and self.turn is None:
                # The turn starts the moment ready is written.
                self._start_turn(conn, _TurnRequest(scripted=greet.get("scripted")))

    async def detach(self, conn: Connection) -> None:
        """Remove a socket; its turn is cancelled, and the last one to leave ends the call."""
        if conn in self.sockets:
            self.sockets.remove(conn)
        if self.held is not None and self.held[0] is conn:
            self.held = None
        state = self.turn
        if state is not None and state.owner is conn:
            self.cancel_turn(state, "disconnected")
            with trio.move_on_after(_UNWIND_S):
                await state.done.wait()
        if not self.sockets and not self.closed:
            self.closed = True
            self._events_send.send_nowait(Disconnected(reason="the last socket closed"))

    async def wind_down(self) -> None:
        """The call is ending: close its sockets, and let a running turn unwind (bounded)."""
        self.closed = True
        reason = "runner draining" if self.service.runner.draining else "the call ended; reconnect"
        for conn in list(self.sockets):
            conn.close_nowait(4013, reason)
        state = self.turn
        if state is not None:
            self.cancel_turn(state, "call_ended")
            with trio.move_on_after(_UNWIND_S):
                await state.done.wait()
            state.scope.cancel()

    def close_all(self, code: int, reason: str) -> None:
        for conn in list(self.sockets):
            conn.close_nowait(code, reason)

    # -- Turns -----------------------------------------------------------------------------

    def request_turn(self, conn: Connection, request: _TurnRequest) -> Outcome:
        """Take a turn now, hold it behind a cancelled turn that unwinds, or refuse it.

        Raises:
            CloseSocket: 4006, past the token's turns a minute.
        """
        runtime = self.runtime
        assert runtime is not None
        state = self.turn
        if state is None and not runtime.busy and self.held is None:
            self.service.check_turn_rate(conn.token_id)
            self._start_turn(conn, request)
            return "started"
        if state is not None and state.cancel_reason is not None and self.held is None:
            self.service.check_turn_rate(conn.token_id)
            self.held = (conn, request)
            return "held"
        return "conflict"

    def owned_turn(self, conn: Connection) -> _RunningTurn | None:
        state = self.turn
        return state if state is not None and state.owner is conn and not state.finished else None

    def cancel_turn(self, state: _RunningTurn, reason: str) -> None:
        if state.cancel_reason is None:
            state.cancel_reason = reason
        runtime = self.runtime
        current = runtime.current_turn if runtime is not None else None
        if current is not None and current.id == state.id:
            runtime.interrupt(state.cancel_reason)  # type: ignore[union-attr]

    def mute_turn(self, state: _RunningTurn) -> None:
        state.mute_requested = True
        runtime = self.runtime
        current = runtime.current_turn if runtime is not None else None
        if current is not None and current.id == state.id:
            current.mute()

    def barge_in(self, conn: Connection, text: str, recording_id: str | None) -> None:
        """A barge-in recording heard the person: say so, and stop their running turn."""
        state = self.owned_turn(conn)
        conn.send(w.BargeIn(text=text, recording_id=recording_id, turn=state.id if state else None))
        if state is not None:
            self.cancel_turn(state, "barge_in")

    def is_person(self, heard: str) -> bool:
        """Whether words heard are the person's: some of them are not what the agent just said."""
        words = _words(heard)
        said = _words(self.recent_text) | (_words(self.turn.text) if self.turn is not None else set())
        return bool(words - said)

    def _start_turn(self, conn: Connection, request: _TurnRequest) -> None:
        assert self.runtime is not None
        offered = {t.name for t in self.runtime.offer().app_tools}
        state = _RunningTurn(
            id=new_turn_id(), owner=conn, request=request, app_tools=frozenset(conn.app_tools) & offered
        )
        self.turn = state
        self.service.start_turn_soon(self._run_turn, state)

    async def _run_turn(self, state: _RunningTurn) -> None:
        conn = state.owner
        try:
            with state.scope:
                await self._take_turn(state)
        except TurnBusy:
            conn.send(w.Error(code="conflict", message=_CONFLICT))
        except Exception:
            log.exception("a turn of conversation %s failed", self.conversation_id)
            if state.started and not state.finished:
                state.finished = True
                conn.send(w.Error(code="internal", message="the turn failed on our side", turn=state.id))
                conn.send(w.Interrupted(turn=state.id, message=state.text, mood=None, mood_intensity=None, reason="internal"))
        finally:
            if self.turn is state:
                self.turn = None
            state.finished = True
            state.done.set()
            self._after_turn(conn)

    async def _take_turn(self, state: _RunningTurn) -> None:
        runtime = self.runtime
        assert runtime is not None
        request = state.request
        confirmed: PendingConfirmation | None = None
        if request.confirm_call_id is not None:
            try:
                pending = runtime.take_confirmation(request.confirm_call_id)
            except ConfirmationNotWaiting:
                state.owner.send(w.Error(code="not_found", message=_NOT_WAITING))
                return
            confirmed = pending if request.yes else None
        result = await runtime.take_turn(
            request.text,
            scripted=request.scripted,
            turn_id=state.id,
            exclusive=True,
            speech=request.speech,
            app_tools=sorted(state.app_tools),
            hear=self._hearing(state, request.recording) if request.recording is not None else None,
            confirmed=confirmed,
            # Thinking summaries only for a frame that asked and an agent that allows them.
            thoughts=request.thoughts and self.service.agent.thinking_summaries == "auto",
        )
        if result is None:
            state.owner.send(w.Error(code="unavailable", message="the call is ending and takes no more turns"))

    def _after_turn(self, conn: Connection) -> None:
        held, self.held = self.held, None
        if held is not None and not self.closed:
            holder, request = held
            if holder in self.sockets:
                self._start_turn(holder, request)
        conn.check_close_after_turn()

    def _hearing(self, state: _RunningTurn, recording: _Recording) -> Callable[[], Any]:
        async def hear() -> tuple[str, float]:
            state.stage = "transcription"
            text, seconds = await transcribe(recording)
            state.stage = "model"
            return text, seconds

        return hear

    # -- Tools the app runs ------------------------------------------------------------------

    async def _call_app_tool(self, turn_id: str, tool: AppTool, call: ToolCall) -> ToolOutcome:
        state = self.turn
        if state is None or state.id != turn_id:
            return ToolOutcome(ok=False, error="the turn is over")
        state.owner.send(
            w.ToolCallFrame(
                turn=turn_id,
                call_id=call.id,
                name=call.name,
                arguments=dict(call.arguments),
                action_only=tool.action_only,
                timeout_ms=tool.timeout_ms,
            )
        )
        if tool.action_only:
            return ToolOutcome(ok=True, result="sent to the app")
        send, receive = trio.open_memory_channel[ToolOutcome](1)
        self._app_calls[call.id] = send
        try:
            with trio.move_on_after(tool.timeout_ms / 1000):
                return await receive.receive()
            return ToolOutcome(ok=False, error=f"the app did not answer within {tool.timeout_ms} ms")
        finally:
            self._app_calls.pop(call.id, None)

    def app_result(self, result: w.ToolResult) -> None:
        """The app's answer to a ``tool.call``; one for a call that is over is ignored."""
        waiter = self._app_calls.pop(result.call_id, None)
        if waiter is None:
            return
        if result.error is not None:
            waiter.send_nowait(ToolOutcome(ok=False, error=result.error))
        else:
            waiter.send_nowait(ToolOutcome(ok=True, result=result.result))

    # -- What a turn reports, as frames ------------------------------------------------------

    async def _on_turn_event(self, event: TurnEvent) -> None:
        state = self.turn
        turn_id = event.result.turn if isinstance(event, TurnFinished) else event.turn
        if state is None or state.id != turn_id or state.finished:
            return
        conn = state.owner
        tid = state.id
        if isinstance(event, TurnStarted):
            state.started = True
            conn.send(w.TurnStart(turn=tid, session_id=self.conversation_id))
            if state.cancel_reason is not None:
                self.cancel_turn(state, state.cancel_reason)
            if state.mute_requested:
                self.mute_turn(state)
            runtime = self.runtime
            if state.request.speech is True and runtime is not None and runtime.voice_sample_rate_hz() is None:
                conn.send(
                    w.Error(code="unavailable", message="this agent has no voice: the reply is text only", turn=tid, stage="speech")
                )
            request = state.request
            if request.text is not None and request.confirm_call_id is None:
                await self._search_first(state, request.text)
        elif isinstance(event, Heard):
            conn.send(w.Heard(turn=tid, text=event.text, audio_seconds=round(event.audio_seconds, 3)))
            await self._search_first(state, event.text)
        elif isinstance(event, Thought):
            # Never part of state.text: not in turn.done's message nor the transcript.
            conn.send(w.ThoughtDelta(turn=tid, text=event.text))
        elif isinstance(event, ReplyDelta):
            state.text += event.text
            conn.send(w.TextDelta(turn=tid, text=event.text))
        elif isinstance(event, ReplyChunk):
            conn.send(w.TextChunk(turn=tid, chunk=event.chunk, text=event.text))
        elif isinstance(event, AudioStart):
            conn.send(w.AudioStart(turn=tid, chunk=event.chunk, sample_rate=event.sample_rate_hz))
        elif isinstance(event, AudioData):
            conn.send_binary(event.pcm)
        elif isinstance(event, AudioEnd):
            state.speech_seconds += event.audio_seconds
            conn.send(w.AudioEnd(turn=tid, chunk=event.chunk, bytes=event.bytes, audio_seconds=round(event.audio_seconds, 3)))
        elif isinstance(event, ToolStarted):
            kind = self._kind(state, event.name)
            state.open_tools[event.call_id] = (event.name, kind, time.monotonic())
            conn.send(w.ToolStart(turn=tid, name=event.name, kind=kind, call_id=_wire_call_id(kind, event.call_id)))
        elif isinstance(event, ToolEnded):
            name, kind, _ = state.open_tools.pop(event.call_id, (event.name, self._kind(state, event.name), 0.0))
            conn.send(w.ToolEnd(turn=tid, name=name, kind=kind, call_id=_wire_call_id(kind, event.call_id), ok=event.ok, ms=event.ms))
        elif isinstance(event, ToolConfirmRequested):
            conn.send(w.ToolConfirm(turn=tid, call_id=event.call_id, name=event.name, arguments=dict(event.arguments)))
        elif isinstance(event, UsageReported):
            usage = event.usage
            conn.send(
                w.UsageFrame(
                    turn=tid,
                    model=usage.model,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    thought_tokens=usage.thought_tokens,
                    cached_tokens=usage.cached_tokens,
                    generation_seconds=round(event.generation_seconds, 3),
                )
            )
        elif isinstance(event, SpeechFailed):
            conn.send(
                w.Error(code="provider_failed", message=f"speech failed: {event.message}", turn=tid, stage="speech", chunk=event.chunk)
            )
        elif isinstance(event, Muted):
            if not state.muted_sent:
                state.muted_sent = True
                conn.send(w.Muted(turn=tid))
        elif isinstance(event, TurnFinished):
            await self._finish(state, event)

    def _kind(self, state: _RunningTurn, name: str) -> w.ToolKind:
        runtime = self.runtime
        if runtime is not None and name in runtime.platform_tools:
            return "platform"
        return "app" if name in state.app_tools else "webhook"

    # -- What lives behind the socket: knowledge, relations, summaries ------------------------

    def _extra_instructions(self) -> str | None:
        parts = []
        if self.summary:
            parts.append(self.summary)
        state = self.turn
        if state is not None and state.knowledge:
            parts.append(state.knowledge)
        return "\n\n".join(parts) or None

    def _platform_tools(self) -> dict[str, PlatformTool]:
        agent = self.service.agent
        tools: dict[str, PlatformTool] = {}
        if agent.knowledge == "tool":
            tools[KNOWLEDGE_TOOL] = PlatformTool(
                spec=ToolSpec(
                    name=KNOWLEDGE_TOOL,
                    description="Search the knowledge base for facts on a topic.",
                    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
                ),
                run=self._knowledge_tool,
            )
        if agent.relations:
            tools[RELATION_TOOL] = PlatformTool(
                spec=ToolSpec(
                    name=RELATION_TOOL,
                    description="Record a change in the relationship with this person: a note to keep about them.",
                    parameters={"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
                ),
                run=self._relation_tool,
            )
        return tools

    async def _search(self, state: _RunningTurn, via: Literal["first", "tool"], query: str) -> list[KnowledgeHit] | None:
        try:
            hits = await self.service.store.search_knowledge(self.service.agent_id, query, limit=KNOWLEDGE_HITS)
        except Exception:
            log.exception("a knowledge search of conversation %s failed", self.conversation_id)
            state.owner.send(w.Knowledge(turn=state.id, via=via, outcome="failed", entries=[]))
            return None
        state.owner.send(
            w.Knowledge(
                turn=state.id,
                via=via,
                outcome="found" if hits else "none",
                entries=[w.KnowledgeEntry(entry_id=h.entry_id, title=h.title, score=h.score) for h in hits],
            )
        )
        return hits

    async def _search_first(self, state: _RunningTurn, text: str) -> None:
        if self.service.agent.knowledge != "first" or state.finished:
            return
        hits = await self._search(state, "first", text)
        if hits:
            state.knowledge = "\n".join(_with_stop(h.text) for h in hits)

    async def _knowledge_tool(self, turn_id: str, call: ToolCall) -> ToolOutcome:
        state = self.turn
        if state is None or state.id != turn_id:
            return ToolOutcome(ok=False, error="the turn is over")
        query = str(call.arguments.get("query") or "")
        hits = await self._search(state, "tool", query)
        if hits is None:
            return ToolOutcome(ok=False, error="the knowledge search failed")
        if not hits:
            return ToolOutcome(ok=True, result=f"Nothing in the knowledge base about {query}.")
        return ToolOutcome(ok=True, result=" ".join(_with_stop(h.text) for h in hits))

    async def _relation_tool(self, turn_id: str, call: ToolCall) -> ToolOutcome:
        state = self.turn
        if state is None or state.id != turn_id:
            return ToolOutcome(ok=False, error="the turn is over")
        note = str(call.arguments.get("note") or "").strip()[:MAX_NOTE_CHARS]
        if not note:
            return ToolOutcome(ok=False, error="a note is needed")
        row = await self.service.store.record_relation(self.service.agent_id, state.owner.end_user_id, note, turn_id=turn_id)
        state.relation = row
        return ToolOutcome(ok=True, result=f"Noted: {note}")

    async def _compact_if_due(self) -> w.Compacted | None:
        """After a reply: fold the messages before the last exchange into the summary, if over budget."""
        budget = self.service.agent.compact_after_words
        runtime = self.runtime
        if budget is None or runtime is None:
            return None
        history = runtime.history
        if sum(len(m.content.split()) for m in history) <= budget:
            return None
        return await self.compact("automatic")

    async def compact(self, trigger: Literal["automatic", "manual"]) -> w.Compacted | None:
        """Summarise every stored message before the last person's turn; the transcript is kept."""
        runtime = self.runtime
        assert runtime is not None
        history = runtime.history
        cut = max((i for i, m in enumerate(history[: self._persisted]) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        after_position = self._first_position + cut - 1
        summary = summarise(self.summary, history[:cut])
        await self.service.store.add_summary(self.conversation_id, after_position=after_position, summary=summary, trigger=trigger)
        del history[:cut]
        self._persisted -= cut
        self._first_position += cut
        self.summary = summary
        return w.Compacted(session_id=self.conversation_id, after_seq=after_position, trigger=trigger)

    async def _finish(self, state: _RunningTurn, event: TurnFinished) -> None:
        result = event.result
        conn = state.owner
        tid = state.id
        try:
            await self._persist(result.turn)
        except Exception:
            log.exception("the messages of conversation %s were not stored", self.conversation_id)
        now = time.monotonic()
        for call_id, (name, kind, began) in list(state.open_tools.items()):
            # A cancelled tool still ends its pair.
            conn.send(
                w.ToolEnd(
                    turn=tid, name=name, kind=kind, call_id=_wire_call_id(kind, call_id), ok=False, ms=int((now - began) * 1000)
                )
            )
        state.open_tools.clear()
        if state.mute_requested and not state.muted_sent:
            state.muted_sent = True
            conn.send(w.Muted(turn=tid))
        self.recent_text = result.text
        spent = await self._charge(state, result)
        # Compacted now, announced after the turn's last frame: nothing below waits, so the
        # turn is over (and the next may start) the moment turn.done is written.
        try:
            compacted = await self._compact_if_due()
        except Exception:
            log.exception("conversation %s could not be compacted", self.conversation_id)
            compacted = None
        compacted, self.pending_compacted = compacted or self.pending_compacted, None
        state.finished = True
        mood = mood_of(result.text) if self.service.agent.moods and result.text.strip() else None
        if mood is not None:
            conn.send(w.Mood(turn=tid, mood=mood[0], intensity=mood[1]))
        mood_name, intensity = mood if mood is not None else (None, None)
        if result.interrupted:
            reason = state.cancel_reason or "internal"
            if result.error_code is not None:
                reason = "provider_failed"  # the code of the error frame that names the failure
                stage = state.stage
                conn.send(w.Error(code="provider_failed", message=(result.reason or result.error_code)[:500], turn=tid, stage=stage))
            conn.send(w.Interrupted(turn=tid, message=result.text, mood=mood_name, mood_intensity=intensity, reason=reason))
        else:
            self._send_done(state, event, mood_name, intensity)
            if state.relation is not None:
                conn.send(w.Relation(turn=tid, **attrs.asdict(relation_body(state.relation), recurse=False)))
        if compacted is not None:
            for socket in list(self.sockets):
                socket.send(compacted)
        if spent is not None:
            self.service.after_charge(conn.token_id, spent)

    async def _charge(self, state: _RunningTurn, result: TurnResult) -> Spent | None:
        rows = usage_rows(result, state.speech_seconds)
        if not rows:
            return None
        conn = state.owner
        try:
            return await self.service.store.charge(
                conversation_id=self.conversation_id, turn_id=state.id, token_id=conn.token_id, end_user_id=conn.end_user_id, rows=rows
            )
        except Exception:
            log.exception("the usage of a turn of conversation %s was not stored", self.conversation_id)
            return None

    def _send_done(self, state: _RunningTurn, event: TurnFinished, mood: str | None, intensity: float | None) -> None:
        result = event.result
        conn = state.owner
        tid = state.id
        models = [u.model for u in result.usage]
        conn.send(
            w.TurnDone(
                turn=tid,
                session_id=self.conversation_id,
                message=result.text,
                model=models[-1] if models else None,
                input_tokens=sum(u.input_tokens for u in result.usage) if models else None,
                output_tokens=sum(u.output_tokens for u in result.usage) if models else None,
                mood=mood,
                mood_intensity=intensity,
                truncated=False,
                chunks_spoken=result.chunks_spoken,
                heard=result.heard,
                heard_seconds=round(result.heard_seconds, 3) if result.heard_seconds is not None else None,
                tool_calls=[
                    w.ToolCallRecord(
                        call_id=c.call_id,
                        name=c.name,
                        kind=self._kind(state, c.name),
                        arguments=dict(c.arguments),
                        result=_kept(c.result) if c.ok else None,
                        ok=c.ok,
                        error=c.error,
                        ms=c.ms,
                        round=c.round,
                    )
                    for c in result.tool_calls
                    if self._kind(state, c.name) != "platform"
                ],
                sources=[],
                timings=w.TurnTimings(
                    model_first_text_ms=result.timings.model_first_text_ms,
                    first_audio_sent_ms=result.timings.first_audio_sent_ms,
                    total_ms=result.timings.total_ms,
                ),
            )
        )

    async def _persist(self, turn_id: str) -> None:
        runtime = self.runtime
        assert runtime is not None
        _close_dangling_tool_calls(runtime.history)
        new = runtime.history[self._persisted :]
        self._persisted = len(runtime.history)
        await self.service.store.append_messages(self.conversation_id, [_stored_message(m, turn_id) for m in new])


_CONFLICT = "A turn is already running on this connection. Wait for turn.done, or send cancel."
_NOT_WAITING = "That tool call is no longer waiting: it was answered already, expired, or dropped by a later turn."


def _chat_message(message: StoredMessage) -> ChatMessage:
    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]
        content=message.content,
        tool_calls=tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
    )


def _stored_message(message: ChatMessage, turn_id: str) -> StoredMessage:
    return StoredMessage(
        role=message.role,
        content=message.content,
        tool_calls=tuple(StoredToolCall(id=c.id, name=c.name, arguments=dict(c.arguments)) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
        turn_id=turn_id,
    )


def _kept(value: Any) -> Any:
    """A tool's result as ``turn.done`` lists it: as read, cut at 4 KiB of JSON."""
    try:
        return keep_json(value)[0]
    except (TypeError, ValueError):
        return keep_json(str(value))[0]


def _close_dangling_tool_calls(history: list[ChatMessage]) -> None:
    """A turn cancelled while its tools ran leaves calls with no answer: answer them as cancelled,
    so the next model call reads a well-formed conversation.
    """
    index = 0
    while index < len(history):
        message = history[index]
        index += 1
        if not message.tool_calls:
            continue
        answered = set()
        while index < len(history) and history[index].role == "tool":
            answered.add(history[index].tool_call_id)
            index += 1
        for call in message.tool_calls:
            if call.id not in answered:
                history.insert(index, ChatMessage(role="tool", content='{"error": "cancelled"}', tool_call_id=call.id))
                index += 1


# -- One socket ------------------------------------------------------------------------------


@attrs.frozen
class _Close:
    code: int
    reason: str


class Connection:
    """The protocol driver of one socket: auth, verbs, recordings, frames in seq order."""

    def __init__(self, service: AgentSocketService, io: SocketIO, url_session_id: str | None) -> None:
        self.service = service
        self.io = io
        self.url_session_id = url_session_id
        self.seq = 0
        self.end_user_id = ""
        self.token_id = ""
        self.app_tools: tuple[str, ...] = ()
        self.call: InoCall | None = None
        self.recording: _Recording | None = None
        self.transcribing = 0
        self.closing: _Close | None = None
        self.close_after_turn: _Close | None = None
        self.last_activity = trio.current_time()
        self._out_send, self._out = trio.open_memory_channel[str | bytes | _Close](math.inf)
        self._reading = trio.CancelScope()
        self._counted = False

    # -- Writing -----------------------------------------------------------------------------

    def send(self, frame: Any) -> None:
        """Queue a JSON frame with the next seq; frames leave in the order they were queued."""
        if self.closing is not None:
            return
        self.seq += 1
        self._out_send.send_nowait(w.encode_frame(frame, self.seq))
        self.last_activity = trio.current_time()

    def send_binary(self, pcm: bytes) -> None:
        if self.closing is None and pcm:
            self._out_send.send_nowait(pcm)

    def close_nowait(self, code: int, reason: str | None = None) -> None:
        """Close after what is queued: the writer sends the close frame last."""
        if self.closing is not None:
            return
        close = CloseSocket(code, reason)
        self.closing = _Close(close.code, close.reason)
        self._out_send.send_nowait(self.closing)
        self._reading.cancel()

    def close_when_idle(self, code: int, reason: str) -> None:
        """Close now if no turn of this socket runs, else once it ended (drain, revoke)."""
        if self.busy:
            self.close_after_turn = _Close(code, reason)
        else:
            self.close_nowait(code, reason)

    def check_close_after_turn(self) -> None:
        if self.close_after_turn is not None and not self.busy:
            self.close_nowait(self.close_after_turn.code, self.close_after_turn.reason)

    @property
    def busy(self) -> bool:
        call = self.call
        if call is None:
            return False
        holds = call.held is not None and call.held[0] is self
        return call.owned_turn(self) is not None or holds or self.transcribing > 0

    async def _write(self) -> None:
        async for item in self._out:
            try:
                if isinstance(item, _Close):
                    with trio.move_on_after(_CLOSE_S):
                        await self.io.close(item.code, item.reason)
                    return
                await self.io.send(item)
            except Exception as exc:  # the peer is gone; the reader learns it too
                log.info("socket write failed: %s", exc)
                self._reading.cancel()
                return

    # -- The connection's life -------------------------------------------------------------

    async def serve(self) -> None:
        """Accept, authenticate, join the conversation and take frames until the socket ends.

        The writer lives in the outer nursery so that it outlasts the reader and the socket's
        own tasks (partial recognition, transcriptions, the idle watch): frames already
        queued, then the close frame, still go out.
        """
        offered = w.PROTOCOL in self.io.requested_subprotocols
        await self.io.accept(w.PROTOCOL if offered else None)
        async with trio.open_nursery() as writing:
            writing.start_soon(self._write)
            try:
                async with trio.open_nursery() as tasks:
                    try:
                        with self._reading:
                            if not offered:
                                raise CloseSocket(4009, f"the subprotocol must be {w.PROTOCOL}")
                            await self._run(tasks)
                    except CloseSocket as close:
                        self.close_nowait(close.code, close.reason)
                    except Exception:
                        log.exception("a socket failed")
                        self.close_nowait(4013)
                    finally:
                        tasks.cancel_scope.cancel()
                        with trio.CancelScope(shield=True), trio.move_on_after(_UNWIND_S + _CLOSE_S):
                            await self._leave()
            finally:
                if self.closing is None:
                    writing.cancel_scope.cancel()  # the peer left: nobody to say goodbye to
                else:
                    self._out_send.close()
                    writing.cancel_scope.deadline = trio.current_time() + _CLOSE_S

    async def _run(self, tasks: trio.Nursery) -> None:
        auth = await self._receive_auth()
        conversation = await self.service.authenticate(self, auth)
        self._counted = True
        await self.service.attach(self, conversation)
        tasks.start_soon(self._watch_idle)
        while True:
            message = await self.io.receive()
            if isinstance(message, bytes):
                self.last_activity = trio.current_time()
                self._on_audio(message)
                continue
            try:
                verb = w.decode_verb(message)
            except w.FrameRejected as exc:
                raise CloseSocket(4009, str(exc)) from None
            except w.FrameInvalid as exc:
                self.last_activity = trio.current_time()
                self.send(w.Error(code="validation_failed", message=str(exc)))
                continue
            if isinstance(verb, w.Ping):
                self._out_send.send_nowait(w.PONG)
                continue
            self.last_activity = trio.current_time()
            await self._on_verb(verb, tasks)

    async def _receive_auth(self) -> w.Auth:
        with trio.move_on_after(AUTH_TIMEOUT_S):
            message = await self.io.receive()
            if isinstance(message, bytes):
                raise CloseSocket(4001, "the first frame must be auth, not audio")
            try:
                verb = w.decode_verb(message)
            except w.FrameRejected as exc:
                if _is_auth(message):
                    raise CloseSocket(4009, str(exc)) from None
                raise CloseSocket(4001, "the first frame must be auth") from None
            except w.FrameInvalid as exc:
                raise CloseSocket(4009, str(exc)) from None
            if not isinstance(verb, w.Auth):
                raise CloseSocket(4001, f"the first frame must be auth, not {verb.TYPE}")
            return verb
        raise CloseSocket(4001, "no auth frame within 10 seconds")

    async def _leave(self) -> None:
        if self.recording is not None:
            self._close_recording()
        self.service.connections.discard(self)
        if self._counted:
            self._counted = False
            self.service.uncount(self.end_user_id, self.token_id)
        if self.call is not None:
            with trio.move_on_after(_UNWIND_S):
                await self.call.detach(self)

    async def _watch_idle(self) -> None:
        idle_s = self.service.idle_seconds
        while True:
            deadline = self.last_activity + idle_s
            if trio.current_time() >= deadline:
                if self.busy:
                    self.last_activity = trio.current_time()
                    continue
                self.close_nowait(4007, f"closed after {idle_s} seconds with no activity; ping does not count")
                return
            await trio.sleep_until(deadline)

    # -- Verbs ---------------------------------------------------------------------------------

    async def _on_verb(self, verb: w.Verb, nursery: trio.Nursery) -> None:
        call = self.call
        assert call is not None
        if isinstance(verb, w.Auth):
            raise CloseSocket(4009, "auth was already sent on this connection")
        if isinstance(verb, w.UserMessage):
            outcome = call.request_turn(self, _TurnRequest(text=verb.text, speech=verb.speech, thoughts=verb.thoughts is True))
            if outcome == "conflict":
                self.send(w.Error(code="conflict", message=_CONFLICT))
        elif isinstance(verb, w.UserAudioStart):
            await self._open_recording(verb, nursery)
        elif isinstance(verb, w.UserAudioEnd):
            self._end_recording(verb, nursery)
        elif isinstance(verb, w.Cancel):
            state = call.owned_turn(self)
            if state is not None:
                call.cancel_turn(state, "cancel")
            if self.recording is not None:
                self._close_recording()
            if call.held is not None and call.held[0] is self:
                call.held = None
        elif isinstance(verb, w.Mute):
            state = call.owned_turn(self)
            if state is not None:
                call.mute_turn(state)
        elif isinstance(verb, w.ToolConfirmed):
            self._confirm(verb)
        elif isinstance(verb, w.ToolResult):
            call.app_result(verb)

    def _confirm(self, verb: w.ToolConfirmed) -> None:
        call = self.call
        assert call is not None and call.runtime is not None
        try:
            call.runtime.pending_confirmation(verb.call_id)
        except ConfirmationNotWaiting:
            self.send(w.Error(code="not_found", message=_NOT_WAITING))
            return
        request = _TurnRequest(text="Yes." if verb.yes else "No.", confirm_call_id=verb.call_id, yes=verb.yes, speech=verb.speech, thoughts=verb.thoughts is True)
        if call.request_turn(self, request) == "conflict":
            self.send(w.Error(code="conflict", message=_CONFLICT))

    # -- Recordings ----------------------------------------------------------------------------

    async def _open_recording(self, start: w.UserAudioStart, nursery: trio.Nursery) -> None:
        call = self.call
        assert call is not None and call.runtime is not None
        if self.recording is not None:
            self.send(
                w.Error(
                    code="invalid_request",
                    message="a recording is already open: end it with user_audio.end first",
                    recording_id=start.recording_id,
                )
            )
            return
        try:
            stt = call.runtime.recognizer(start.language)
        except ValueError as exc:
            self.send(w.Error(code="validation_failed", message=f"language: {exc}", recording_id=start.recording_id))
            return
        if stt is None:
            raise CloseSocket(4010, "this agent does not hear speech: it has no recognizer")
        if start.model is not None and start.model != stt.provider:
            self.send(
                w.Error(
                    code="validation_failed",
                    message=f"model {start.model!r} is not available here; this agent transcribes with {stt.provider!r}",
                    recording_id=start.recording_id,
                )
            )
            return
        rate = start.rate or HEARING_RATE_HZ
        recording = _Recording(start=start, rate_hz=rate, stt=stt)
        stream = None
        if hasattr(stt, "open_stream"):
            try:
                stream = stt.open_stream(rate)
            except ValueError as exc:
                self.send(w.Error(code="validation_failed", message=f"rate: {exc}", recording_id=start.recording_id))
                return
        self.recording = recording
        if stream is not None:
            send, receive = trio.open_memory_channel[bytes](math.inf)
            recording.feed = send
            nursery.start_soon(self._recognize_partials, recording, stream, receive)
        await trio.lowlevel.checkpoint()

    def _on_audio(self, data: bytes) -> None:
        recording = self.recording
        if recording is None:
            raise CloseSocket(4011, "binary audio with no user_audio.start before it")
        if len(recording.audio) + len(data) > MAX_RECORDING_BYTES:
            raise CloseSocket(4011, "the recording passed 10 MB: send long audio to POST /v1/transcriptions")
        recording.audio += data
        if recording.feed is not None:
            recording.feed.send_nowait(data)

    def _close_recording(self) -> None:
        recording, self.recording = self.recording, None
        if recording is not None:
            if recording.feed is not None:
                recording.feed.close()
            recording.scope.cancel()

    def _end_recording(self, end: w.UserAudioEnd, nursery: trio.Nursery) -> None:
        call = self.call
        assert call is not None
        recording = self.recording
        if end.discard and end.transcribe_only:
            self.send(
                w.Error(
                    code="validation_failed",
                    message="transcribe_only and discard exclude each other",
                    recording_id=recording.recording_id if recording else None,
                )
            )
            return
        if end.discard:
            self._close_recording()  # thrown away without a word
            return
        if recording is None:
            self.send(w.Error(code="invalid_request", message="no recording is open: send user_audio.start first"))
            return
        if len(recording.audio) < 2:
            self._close_recording()
            self.send(w.Error(code="invalid_request", message="nothing was recorded", recording_id=recording.recording_id))
            return
        if end.transcribe_only:
            if self.transcribing >= MAX_TRANSCRIBING:
                self.send(
                    w.Error(
                        code="rate_limited",
                        message=f"{MAX_TRANSCRIBING} transcribe_only recordings are already in flight; the recording is still open",
                        recording_id=recording.recording_id,
                    )
                )
                return
            self._close_recording()
            self.transcribing += 1
            nursery.start_soon(self._transcribe_only, recording)
            return
        request = _TurnRequest(recording=recording, speech=recording.start.speech, thoughts=recording.start.thoughts is True)
        if call.request_turn(self, request) == "conflict":
            self.send(w.Error(code="conflict", message=_CONFLICT, recording_id=recording.recording_id))
            return
        self._close_recording()

    async def _recognize_partials(
        self, recording: _Recording, stream: Any, chunks: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        carry = b""
        with recording.scope:
            async with stream:
                async for first in chunks:
                    pieces = [carry, first]
                    while True:
                        try:
                            pieces.append(chunks.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    data = b"".join(pieces)
                    cut = len(data) // 2 * 2
                    data, carry = data[:cut], data[cut:]
                    # pocketsphinx holds the GIL while it decodes: feed it at most 100 ms
                    # at a time, so the runner's other tasks run between the pieces.
                    step = recording.rate_hz * 2 // 10
                    text = None
                    for start in range(0, len(data), step):
                        try:
                            text = await stream.feed(data[start : start + step]) or text
                        except (ProviderError, ValueError, trio.ClosedResourceError) as exc:
                            log.warning("partial recognition stopped: %s", exc)
                            return
                    if text and self.recording is recording:
                        self.send(w.HeardPartial(text=text))
                        call = self.call
                        if recording.start.barge_in and not recording.barged and call is not None and call.is_person(text):
                            recording.barged = True
                            call.barge_in(self, text, recording.recording_id)

    async def _transcribe_only(self, recording: _Recording) -> None:
        request_id = "req_" + secrets.token_hex(8)
        try:
            text, seconds = await transcribe(recording)
        except ProviderError as exc:
            self.send(
                w.Error(
                    code="provider_failed",
                    message=str(exc)[:500],
                    stage="transcription",
                    request_id=request_id,
                    recording_id=recording.recording_id,
                )
            )
        else:
            self.send(
                w.Transcript(
                    text=text,
                    audio_seconds=round(seconds, 3),
                    request_id=request_id,
                    recording_id=recording.recording_id,
                )
            )
            if self.call is not None and seconds > 0:
                try:
                    spent = await self.service.store.charge(
                        conversation_id=self.call.conversation_id,
                        turn_id=request_id,
                        token_id=self.token_id,
                        end_user_id=self.end_user_id,
                        rows=[transcription_row(seconds)],
                    )
                except Exception:
                    log.exception("the usage of a transcription was not stored")
                else:
                    self.service.after_charge(self.token_id, spent)
        finally:
            self.transcribing -= 1
            self.check_close_after_turn()


async def transcribe(recording: _Recording) -> tuple[str, float]:
    """A whole recording's words and length; digital silence is no words, whatever a model makes of it.

    Raises:
        ProviderError: The recognizer failed (any failure of it is ``provider_failed``).
    """
    pcm = recording.pcm()
    seconds = pcm_seconds(len(pcm), recording.rate_hz)
    if rms_dbfs(pcm) < SILENCE_DBFS:
        await trio.lowlevel.checkpoint()
        return "", seconds
    try:
        transcript = await recording.stt.transcribe(pcm, recording.rate_hz)
    except ProviderError:
        raise
    except Exception as exc:
        raise ProviderError("provider_failed", f"transcription failed: {exc}") from exc
    return transcript.text.strip(), seconds


def _is_auth(message: str) -> bool:
    try:
        value = json.loads(message)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("type") == "auth"


# -- The service -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class MintedKey:
    token: str
    row: TokenRow


class AgentSocketService:
    """The agent WebSocket of one runner: keys, conversations, sockets, and their drain.

    Args:
        runner: Whose calls the conversations are.
        transport: The transport registered with ``runner`` for ``ino://`` calls.
        store: Tokens, conversations and messages.
        setup: The agent, the API key and the idle limit.
    """

    def __init__(self, runner: Runner, transport: WebSocketTransport, store: AgentStore, setup: AgentSocketSetup) -> None:
        self.runner = runner
        self.transport = transport
        self.store = store
        self.agent = setup.agent
        self.agent_id = agent_id_of(setup.agent)
        self.api_key = setup.api_key
        self.idle_seconds = setup.idle_seconds
        self.credit_pool = setup.credit_pool
        self.token_turns_per_minute = setup.token_turns_per_minute
        self.token_connections = setup.token_connections
        self.connections: set[Connection] = set()
        self._per_end_user: dict[str, int] = {}
        self._per_token: dict[str, int] = {}
        self._turns_at: dict[str, collections.deque[float]] = {}
        self._nursery: trio.Nursery | None = None
        transport.service = self

    # -- REST ------------------------------------------------------------------------------

    def is_api_key(self, given: str) -> bool:
        return self.api_key is not None and hmac.compare_digest(given.encode(), self.api_key.encode())

    async def mint_key(self, request: w.EphemeralKeyRequest) -> MintedKey:
        ttl = request.ttl_seconds if request.ttl_seconds is not None else DEFAULT_TTL_SECONDS
        if not 1 <= ttl <= MAX_TTL_SECONDS:
            raise w.FrameInvalid("body", "ttl_seconds", f"must be 1 to {MAX_TTL_SECONDS}")
        if request.credit_limit is not None and request.credit_limit < 0:
            raise w.FrameInvalid("body", "credit_limit", "must not be negative")
        token_id = secrets.token_hex(8)
        token = f"ek_{token_id}_{secrets.token_urlsafe(32)}"
        row = await self.store.insert_token(
            token_id=token_id,
            token_sha256=_digest(token),
            end_user_id=request.end_user_id or "eu_" + secrets.token_urlsafe(12).replace("-", "x").replace("_", "y"),
            expires_at=now_ms() + ttl * 1000,
            credit_limit=request.credit_limit,
        )
        return MintedKey(token=token, row=row)

    async def find_token(self, token: str) -> TokenRow | None:
        if not token.startswith("ek_"):
            return None
        token_id, _, secret = token[3:].partition("_")
        if not token_id or not secret:
            return None
        return await self.store.find_token(token_id, _digest(token))

    async def valid_token(self, token: str) -> TokenRow:
        """The token a REST call carries, if it is good now.

        Raises:
            Unauthorized: Unknown, expired, revoked or spent.
        """
        row = await self.find_token(token)
        if row is None or _token_problem(row) is not None:
            raise Unauthorized()
        return row

    async def revoke(self, token_id: str) -> bool:
        revoked = await self.store.revoke_token(token_id)
        if revoked:
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token was revoked")
        return revoked

    async def create_conversation(self, token: TokenRow) -> ConversationRow:
        return await self.store.create_conversation(
            conversation_id=new_session_id(), agent_id=self.agent_id, end_user_id=token.end_user_id
        )

    async def conversation_for(self, conversation_id: str, *, end_user_id: str | None) -> ConversationRow:
        """A live conversation the caller may see (any, for the API key: ``end_user_id=None``).

        Raises:
            NotFound: Unknown, deleted, or another person's.
        """
        row = await self.store.get_conversation(conversation_id)
        if row is None or row.deleted_at is not None or (end_user_id is not None and row.end_user_id != end_user_id):
            raise NotFound(f"no conversation {conversation_id!r}")
        return row

    async def compact(self, conversation_id: str) -> w.Compacted | None:
        """Compact a conversation on request: what :meth:`InoCall.compact` does after a reply.

        Returns ``None`` when there is nothing before the person's last message to fold in.

        Raises:
            TurnRunning: A turn of the conversation runs (compaction never happens inside one).
        """
        call = self.transport.calls.get(conversation_id)
        if call is not None and call.runtime is not None and not call.closed:
            if call.turn is not None or call.runtime.busy:
                raise TurnRunning("a turn of this conversation is running; compact it after turn.done")
            compacted = await call.compact("manual")
            if compacted is not None:
                if call.turn is not None:
                    call.pending_compacted = compacted  # a turn began meanwhile: announce it after
                else:
                    for conn in list(call.sockets):
                        conn.send(compacted)
            return compacted
        stored = await self.store.load_messages(conversation_id)
        latest = await self.store.latest_summary(conversation_id)
        after = latest.after_position if latest is not None else 0
        rest = [m for m in stored if m.position > after]
        cut = max((i for i, m in enumerate(rest) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        summary = summarise(latest.summary if latest is not None else None, [_chat_message(m) for m in rest[:cut]])
        position = rest[cut - 1].position
        await self.store.add_summary(conversation_id, after_position=position, summary=summary, trigger="manual")
        return w.Compacted(session_id=conversation_id, after_seq=position, trigger="manual")

    async def relations_for(self, end_user_id: str | None) -> list[w.RelationBody]:
        """The agent's relationships: one person's (a token's), or everyone's (the API key's).
        Empty when the agent keeps none.
        """
        if not self.agent.relations:
            return []
        if end_user_id is None:
            rows = await self.store.relations(self.agent_id)
        else:
            row = await self.store.relation(self.agent_id, end_user_id)
            rows = [row] if row is not None else []
        return [relation_body(r) for r in rows]

    async def delete_conversation(self, conversation_id: str) -> bool:
        deleted = await self.store.delete_conversation(conversation_id)
        call = self.transport.calls.get(conversation_id)
        if call is not None:
            call.close_all(4008, "the conversation was deleted")
        return deleted

    # -- Sockets -----------------------------------------------------------------------------

    async def serve_socket(self, io: SocketIO, url_session_id: str | None) -> None:
        conn = Connection(self, io, url_session_id)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    async def authenticate(self, conn: Connection, auth: w.Auth) -> ConversationRow:
        """Check an auth frame in the order the close codes are documented; count the socket.

        Raises:
            CloseSocket: 4009, 4002, 4003, 4004, 4008, 4013 or 4014.
        """
        if not conn.url_session_id:
            raise CloseSocket(4009, "the URL names no session_id")
        if auth.session_id != conn.url_session_id:
            raise CloseSocket(4009, "the session_id of the URL and of the auth frame differ")
        if self.is_api_key(auth.key):
            raise CloseSocket(4002, "an API key is not accepted on this socket: mint an ephemeral token")
        row = await self.find_token(auth.key)
        if row is None:
            raise CloseSocket(4002, "invalid token")
        problem = _token_problem(row)
        if problem is not None:
            raise CloseSocket(*problem)
        conversation = await self.store.get_conversation(auth.session_id)
        if conversation is None:
            raise CloseSocket(4008, "unknown conversation")
        if conversation.deleted_at is not None:
            raise CloseSocket(4008, "the conversation was deleted")
        if conversation.agent_id != self.agent_id:
            raise CloseSocket(4008, "the conversation's agent is not served here")
        if conversation.end_user_id != row.end_user_id:
            raise CloseSocket(4008, "the conversation belongs to another person")
        if self.runner.draining:
            raise CloseSocket(4013, "runner draining")
        if self.credit_pool is not None and await self.store.runner_spent() >= self.credit_pool:
            raise CloseSocket(4005, "the runner's credit pool is spent")
        count = self._per_end_user.get(row.end_user_id, 0)
        if count >= MAX_CONNECTIONS_PER_END_USER:
            raise CloseSocket(4014, f"this end user already has {MAX_CONNECTIONS_PER_END_USER} open connections")
        held = self._per_token.get(row.token_id, 0)
        if self.token_connections is not None and held >= self.token_connections:
            raise CloseSocket(4006, f"this token already holds {self.token_connections} connections")
        self._per_end_user[row.end_user_id] = count + 1
        self._per_token[row.token_id] = held + 1
        conn.end_user_id = row.end_user_id
        conn.token_id = row.token_id
        conn.app_tools = tuple(auth.tools or ())
        return conversation

    def uncount(self, end_user_id: str, token_id: str) -> None:
        for counts, key in ((self._per_end_user, end_user_id), (self._per_token, token_id)):
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)

    def check_turn_rate(self, token_id: str) -> None:
        """Count a turn the token asks for.

        Raises:
            CloseSocket: 4006, past the token's turns a minute.
        """
        limit = self.token_turns_per_minute
        if limit is None:
            return
        now = trio.current_time()
        recent = self._turns_at.setdefault(token_id, collections.deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= limit:
            raise CloseSocket(4006, f"this token may take {limit} turns a minute")
        recent.append(now)

    def after_charge(self, token_id: str, spent: Spent) -> None:
        """A turn was charged: close the token's sockets when it spent its limit (4004), and every
        socket when the runner's pool is spent (4005), each after its running turn.
        """
        if spent.token_limit is not None and spent.token_spent >= spent.token_limit:
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token has spent its credit limit")
        if self.credit_pool is not None and spent.runner_spent >= self.credit_pool:
            for conn in list(self.connections):
                conn.close_when_idle(4005, "the runner's credit pool is spent")

    async def attach(self, conn: Connection, conversation: ConversationRow) -> None:
        """Join the conversation's call, starting it if no socket holds it.

        Raises:
            CloseSocket: 4013 when the runner is full, draining, or the call cannot start.
        """
        conversation_id = conversation.conversation_id
        for _ in range(3):
            existing = self.runner.calls.get(conversation_id)
            if existing is not None and existing.state in ("ending", "ended"):
                with trio.move_on_after(_UNWIND_S):
                    await existing.wait_ended()
                continue
            start = StartCallRequest(session_id=conversation_id, realtime_url=f"{SCHEME}://{conversation_id}", realtime_token="-")
            try:
                call, _ = await self.runner.start_call(start)
            except RunnerDraining:
                raise CloseSocket(4013, "runner draining") from None
            except RunnerAtCapacity:
                raise CloseSocket(4013, f"runner full: it holds {self.runner.config.max_sessions} calls") from None
            except (StartFailed, GenerationMismatch) as exc:
                raise CloseSocket(4013, f"the call did not start: {exc.detail}") from None
            session = self.transport.calls.get(conversation_id)
            if session is None or session.closed:
                with trio.move_on_after(_UNWIND_S):
                    await call.wait_ended()
                continue
            runtime = call.conversation
            if not isinstance(runtime, AgentRuntime):
                raise CloseSocket(4013, "this runner has no agent to talk to")
            await session.attach(conn, runtime)
            return
        raise CloseSocket(4013, "the conversation's call could not be joined; reconnect")

    def start_turn_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a conversation's turn in the service's nursery (a call cannot hold one)."""
        assert self._nursery is not None, "AgentSocketService.serve is not running"
        self._nursery.start_soon(fn, *args)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the conversations' turns until the runner drained.

        Once the runner drains, idle sockets close with 4013 at once and busy ones after
        their turn; the calls end as their last socket closes.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self.runner.wait_draining()
            for conn in list(self.connections):
                conn.close_when_idle(4013, "runner draining")
            await self.runner.wait_drained()
            nursery.cancel_scope.cancel()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token_problem(row: TokenRow) -> tuple[int, str] | None:
    if row.revoked_at is not None:
        return 4004, "this token was revoked"
    if row.expires_at <= now_ms():
        return 4003, "this token has expired: mint another and reconnect"
    if row.credit_limit is not None and row.credit_spent >= row.credit_limit:
        return 4004, "this token has spent its credit limit"
    return None
