"""One conversation's call: the transport that hands it out, and the turns it runs."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import attrs
import trio

from journal import KnowledgeHit, RelationRow, Spent, StoredMessage, StoredToolCall

from ... import ino_wire as w
from ...agent._runtime import (
    AgentRuntime,
    ConfirmationNotWaiting,
    PendingConfirmation,
    PlatformTool,
    TurnBusy,
)
from ...calls import keep_json
from ...providers import ChatMessage, ProviderError, ToolCall, ToolSpec
from ...voice.audio import pcm_seconds, rms_dbfs
from ...voice.engine import (
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
from .._base import CallTarget, Disconnected, RequestHandler, TransportError, TransportEvent
from ._common import (
    _CLOSE_S,
    _UNWIND_S,
    HEARING_RATE_HZ,
    KNOWLEDGE_HITS,
    KNOWLEDGE_TOOL,
    MAX_NOTE_CHARS,
    RELATION_TOOL,
    SCHEME,
    SILENCE_DBFS,
    CloseSocket,
    _wire_call_id,
    _with_stop,
    _words,
    edge_version,
    log,
    mood_of,
    relation_body,
    summarise,
    usage_rows,
)

if TYPE_CHECKING:
    from ...agent import AppTool
    from ._connection import Connection
    from ._service import AgentSocketService


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
                conn.send(
                    w.Interrupted(
                        turn=state.id, message=state.text, mood=None, mood_intensity=None, reason="internal"
                    )
                )
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
            state.owner.send(
                w.Error(code="unavailable", message="the call is ending and takes no more turns")
            )

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
            if (
                state.request.speech is True
                and runtime is not None
                and runtime.voice_sample_rate_hz() is None
            ):
                conn.send(
                    w.Error(
                        code="unavailable",
                        message="this agent has no voice: the reply is text only",
                        turn=tid,
                        stage="speech",
                    )
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
            conn.send(
                w.AudioEnd(
                    turn=tid,
                    chunk=event.chunk,
                    bytes=event.bytes,
                    audio_seconds=round(event.audio_seconds, 3),
                )
            )
        elif isinstance(event, ToolStarted):
            kind = self._kind(state, event.name)
            state.open_tools[event.call_id] = (event.name, kind, time.monotonic())
            conn.send(
                w.ToolStart(turn=tid, name=event.name, kind=kind, call_id=_wire_call_id(kind, event.call_id))
            )
        elif isinstance(event, ToolEnded):
            name, kind, _ = state.open_tools.pop(
                event.call_id, (event.name, self._kind(state, event.name), 0.0)
            )
            conn.send(
                w.ToolEnd(
                    turn=tid,
                    name=name,
                    kind=kind,
                    call_id=_wire_call_id(kind, event.call_id),
                    ok=event.ok,
                    ms=event.ms,
                )
            )
        elif isinstance(event, ToolConfirmRequested):
            conn.send(
                w.ToolConfirm(
                    turn=tid, call_id=event.call_id, name=event.name, arguments=dict(event.arguments)
                )
            )
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
                w.Error(
                    code="provider_failed",
                    message=f"speech failed: {event.message}",
                    turn=tid,
                    stage="speech",
                    chunk=event.chunk,
                )
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
                    parameters={
                        "type": "object",
                        "properties": {"query": {"type": "string"}},
                        "required": ["query"],
                    },
                ),
                run=self._knowledge_tool,
            )
        if agent.relations:
            tools[RELATION_TOOL] = PlatformTool(
                spec=ToolSpec(
                    name=RELATION_TOOL,
                    description="Record a change in the relationship with this person: a note to keep about them.",
                    parameters={
                        "type": "object",
                        "properties": {"note": {"type": "string"}},
                        "required": ["note"],
                    },
                ),
                run=self._relation_tool,
            )
        return tools

    async def _search(
        self, state: _RunningTurn, via: Literal["first", "tool"], query: str
    ) -> list[KnowledgeHit] | None:
        try:
            hits = await self.service.store.search_knowledge(
                self.service.agent_id, query, limit=KNOWLEDGE_HITS
            )
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
        row = await self.service.store.record_relation(
            self.service.agent_id, state.owner.end_user_id, note, turn_id=turn_id
        )
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
        await self.service.store.add_summary(
            self.conversation_id, after_position=after_position, summary=summary, trigger=trigger
        )
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
                    turn=tid,
                    name=name,
                    kind=kind,
                    call_id=_wire_call_id(kind, call_id),
                    ok=False,
                    ms=int((now - began) * 1000),
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
                conn.send(
                    w.Error(
                        code="provider_failed",
                        message=(result.reason or result.error_code)[:500],
                        turn=tid,
                        stage=stage,
                    )
                )
            conn.send(
                w.Interrupted(
                    turn=tid, message=result.text, mood=mood_name, mood_intensity=intensity, reason=reason
                )
            )
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
                conversation_id=self.conversation_id,
                turn_id=state.id,
                token_id=conn.token_id,
                end_user_id=conn.end_user_id,
                rows=rows,
            )
        except Exception:
            log.exception("the usage of a turn of conversation %s was not stored", self.conversation_id)
            return None

    def _send_done(
        self, state: _RunningTurn, event: TurnFinished, mood: str | None, intensity: float | None
    ) -> None:
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
        await self.service.store.append_messages(
            self.conversation_id, [_stored_message(m, turn_id) for m in new]
        )


_CONFLICT = "A turn is already running on this connection. Wait for turn.done, or send cancel."
_NOT_WAITING = (
    "That tool call is no longer waiting: it was answered already, expired, or dropped by a later turn."
)


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
        tool_calls=tuple(
            StoredToolCall(id=c.id, name=c.name, arguments=dict(c.arguments)) for c in message.tool_calls
        ),
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
                history.insert(
                    index, ChatMessage(role="tool", content='{"error": "cancelled"}', tool_call_id=call.id)
                )
                index += 1
