"""One conversation: its people, its turns, its stored history, memory, knowledge and relations."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import trio

from journal import AgentStore, KnowledgeHit, RelationRow, Spent, StoredMessage, StoredToolCall

from ..agent._runtime import (
    AgentRuntime,
    ConfirmationNotWaiting,
    PendingConfirmation,
    PlatformTool,
    TurnBusy,
)
from ..providers import ChatMessage, ProviderError, ToolCall, ToolSpec
from ..voice.audio import pcm_seconds, rms_dbfs
from ..voice.engine import (
    AudioData,
    AudioEnd,
    AudioStart,
    Heard,
    Muted,
    ReplyDelta,
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
from ._events import (
    AppToolCalled,
    BargedIn,
    Charged,
    Compacted,
    ConversationEvent,
    Joined,
    KnowledgeSearched,
    MoodJudged,
    NoVoice,
    Refused,
    Stage,
    ToolClosed,
    ToolKind,
    ToolOpened,
    TurnClosed,
    TurnFailed,
    TurnOpened,
)
from ._rules import (
    KNOWLEDGE_HITS,
    KNOWLEDGE_TOOL,
    MAX_NOTE_CHARS,
    RELATION_TOOL,
    SILENCE_DBFS,
    mood_of,
    summarise,
    usage_rows,
    with_stop,
    words,
)

if TYPE_CHECKING:
    from ..agent import Agent, AppTool

log = logging.getLogger("runner.platform")

# Bounds on cleanup: a participant that leaves lets its turn unwind for this long.
UNWIND_S = 10.0
READY_S = 5.0


class Participant(Protocol):
    """Someone in a conversation (a socket of the agent WebSocket): who, and where its events go."""

    end_user_id: str
    token_id: str
    app_tools: tuple[str, ...]

    def deliver(self, event: ConversationEvent) -> None:
        """Take an event of the conversation, in order, without waiting."""
        ...

    def turn_over(self) -> None:
        """A turn this participant asked for is over (it may close now)."""
        ...


class ConversationHost(Protocol):
    """What a conversation needs from the platform that holds it (:class:`~._service.Platform`)."""

    store: AgentStore
    agent: Agent
    agent_id: str

    def start_turn_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...

    def check_turn_rate(self, token_id: str) -> None: ...


class ConversationClosed(Exception):
    """The conversation's call is ending, or its agent did not start: ``reason`` says which."""


class StreamedWords:
    """What a recording's recognizer stream heard in all of it, once the stream is finished.

    A recognizer that streams (``open_stream``) has heard the recording as it arrived; its
    ``finish`` is the recording's transcript, so the recording is not decoded a second time.
    """

    def __init__(self) -> None:
        self._done = trio.Event()
        self._text = ""
        self._error: ProviderError | None = None

    def set(self, text: str) -> None:
        if not self._done.is_set():
            self._text = text
            self._done.set()

    def fail(self, error: ProviderError) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> str:
        """The words, once the stream finished.

        Raises:
            ProviderError: the stream failed or stopped before it finished.
        """
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._text


@attrs.define(eq=False, kw_only=True)
class Recording:
    """An open recording: its audio so far and its partial recognition."""

    recording_id: str | None
    rate_hz: int
    stt: Any
    barge_in: bool = False
    speech: bool | None = None
    thoughts: bool = False
    audio: bytearray = attrs.Factory(bytearray)
    feed: trio.MemorySendChannel[bytes] | None = None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    barged: bool = False
    #: Set when a recognizer stream hears the recording as it arrives.
    streamed: StreamedWords | None = None

    def pcm(self) -> bytes:
        return bytes(self.audio[: len(self.audio) // 2 * 2])


async def transcribe(recording: Recording) -> tuple[str, float]:
    """A whole recording's words and length; digital silence is no words, whatever a model makes of it.

    A recording its recognizer streamed is not decoded again: its words are the stream's.

    Raises:
        ProviderError: The recognizer failed (any failure of it is ``provider_failed``).
    """
    pcm = recording.pcm()
    seconds = pcm_seconds(len(pcm), recording.rate_hz)
    if rms_dbfs(pcm) < SILENCE_DBFS:
        await trio.lowlevel.checkpoint()
        return "", seconds
    try:
        if recording.streamed is not None:
            return (await recording.streamed.wait()).strip(), seconds
        transcript = await recording.stt.transcribe(pcm, recording.rate_hz)
    except ProviderError:
        raise
    except Exception as exc:
        raise ProviderError("provider_failed", f"transcription failed: {exc}") from exc
    return str(transcript.text).strip(), seconds


@attrs.frozen(kw_only=True)
class TurnRequest:
    """What a participant asked for: typed words, a recording, a confirmation, or the opening."""

    text: str | None = None
    scripted: str | None = None
    recording: Recording | None = None
    confirm_call_id: str | None = None
    yes: bool = False
    speech: bool | None = None
    thoughts: bool = False


@attrs.define(eq=False, kw_only=True)
class RunningTurn:
    id: str
    owner: Participant
    request: TurnRequest
    app_tools: frozenset[str]
    stage: Stage = "model"
    cancel_reason: str | None = None
    mute_requested: bool = False
    muted_sent: bool = False
    started: bool = False
    finished: bool = False
    text: str = ""
    open_tools: dict[str, tuple[str, ToolKind, float]] = attrs.Factory(dict)
    knowledge: str | None = None
    relation: RelationRow | None = None
    speech_seconds: float = 0.0
    # The reply's text the last mood was judged on.
    mood_text: str | None = None
    # The open audio window: its rate, and the bytes of it handed to the owner so far.
    window_rate_hz: int = 0
    window_bytes: int = 0
    done: trio.Event = attrs.Factory(trio.Event)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)


Outcome = Literal["started", "held", "conflict"]


class Conversation:
    """One conversation while its call runs: its participants, its turns, its messages."""

    def __init__(self, conversation_id: str, platform: ConversationHost) -> None:
        self.conversation_id = conversation_id
        self.platform = platform
        self.participants: list[Participant] = []
        self.runtime: AgentRuntime | None = None
        self.turn: RunningTurn | None = None
        self.held: tuple[Participant, TurnRequest] | None = None
        self.closed = False
        self.recent_text = ""
        self._app_calls: dict[str, trio.MemorySendChannel[ToolOutcome]] = {}
        self._join_lock = trio.Lock()
        self._persisted = 0
        # The stored position of runtime.history[0]: messages a summary covers leave the history.
        self._first_position = 1
        self.summary: str | None = None
        self.pending_compacted: Compacted | None = None

    # -- Participants ----------------------------------------------------------------------

    async def join(self, participant: Participant, runtime: AgentRuntime) -> None:
        """Add a participant: it is told :class:`Joined`, and a new conversation's opening turn starts.

        Raises:
            ConversationClosed: The call is ending, or its agent did not start.
        """
        async with self._join_lock:
            greet: dict[str, Any] | None = None
            if self.runtime is None:
                with trio.move_on_after(READY_S):
                    await runtime.ready.wait()
                if not runtime.ready.is_set():
                    raise ConversationClosed("the agent did not start")
                store = self.platform.store
                stored = await store.load_messages(self.conversation_id)
                summary = await store.latest_summary(self.conversation_id)
                after = 0
                if summary is not None:
                    self.summary, after = summary.summary, summary.after_position
                runtime.load_history(chat_message(m) for m in stored if m.position > after)
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
                raise ConversationClosed("the call ended; reconnect")
            self.participants.append(participant)
            agent = self.platform.agent
            relation = None
            if agent.relations:
                relation = await self.platform.store.relation(self.platform.agent_id, participant.end_user_id)
            greeting = greet is not None and self.turn is None
            participant.deliver(
                Joined(
                    conversation_id=self.conversation_id,
                    agent_id=self.platform.agent_id,
                    end_user_id=participant.end_user_id,
                    voice_rate_hz=runtime.voice_sample_rate_hz(),
                    moods=agent.moods,
                    relation=relation,
                    greeting=greeting,
                )
            )
            if greet is not None and greeting:
                # The turn starts the moment the participant was told.
                self._start_turn(participant, TurnRequest(scripted=greet.get("scripted")))

    async def leave(self, participant: Participant) -> bool:
        """Remove a participant; its turn is cancelled. Returns whether it was the last one."""
        if participant in self.participants:
            self.participants.remove(participant)
        if self.held is not None and self.held[0] is participant:
            self.held = None
        state = self.turn
        if state is not None and state.owner is participant:
            self.cancel_turn(state, "disconnected")
            with trio.move_on_after(UNWIND_S):
                await state.done.wait()
        if not self.participants and not self.closed:
            self.closed = True
            return True
        return False

    async def wind_down(self) -> None:
        """The call is ending: let a running turn unwind (bounded)."""
        self.closed = True
        state = self.turn
        if state is not None:
            self.cancel_turn(state, "call_ended")
            with trio.move_on_after(UNWIND_S):
                await state.done.wait()
            state.scope.cancel()

    def _tell_all(self, event: ConversationEvent) -> None:
        for participant in list(self.participants):
            participant.deliver(event)

    # -- Turns -----------------------------------------------------------------------------

    def request_turn(self, participant: Participant, request: TurnRequest) -> Outcome:
        """Take a turn now, hold it behind a cancelled turn that unwinds, or refuse it.

        Raises:
            TurnRateExceeded: Past the token's turns a minute.
        """
        runtime = self.runtime
        assert runtime is not None
        state = self.turn
        if state is None and not runtime.busy and self.held is None:
            self.platform.check_turn_rate(participant.token_id)
            self._start_turn(participant, request)
            return "started"
        if state is not None and state.cancel_reason is not None and self.held is None:
            self.platform.check_turn_rate(participant.token_id)
            self.held = (participant, request)
            return "held"
        return "conflict"

    def drop_held(self, participant: Participant) -> None:
        if self.held is not None and self.held[0] is participant:
            self.held = None

    def holds_turn_of(self, participant: Participant) -> bool:
        """Whether a turn of the participant runs or waits to run."""
        held = self.held is not None and self.held[0] is participant
        return held or self.owned_turn(participant) is not None

    def owned_turn(self, participant: Participant) -> RunningTurn | None:
        state = self.turn
        return state if state is not None and state.owner is participant and not state.finished else None

    def cancel_turn(self, state: RunningTurn, reason: str) -> None:
        if state.cancel_reason is None:
            state.cancel_reason = reason
        runtime = self.runtime
        current = runtime.current_turn if runtime is not None else None
        if runtime is not None and current is not None and current.id == state.id:
            runtime.interrupt(state.cancel_reason)

    def mute_turn(self, state: RunningTurn) -> None:
        state.mute_requested = True
        runtime = self.runtime
        current = runtime.current_turn if runtime is not None else None
        if current is not None and current.id == state.id:
            current.mute()

    def check_confirmation(self, call_id: str) -> bool:
        """Whether a call of a tool that asks first waits under ``call_id``."""
        assert self.runtime is not None
        try:
            self.runtime.pending_confirmation(call_id)
        except ConfirmationNotWaiting:
            return False
        return True

    def barge_in(self, participant: Participant, text: str, recording_id: str | None) -> None:
        """A barge-in recording heard the person: say so, and stop their running turn."""
        state = self.owned_turn(participant)
        participant.deliver(BargedIn(text=text, recording_id=recording_id, turn=state.id if state else None))
        if state is not None:
            self.cancel_turn(state, "barge_in")

    def is_person(self, heard: str) -> bool:
        """Whether words heard are the person's: some of them are not what the agent just said."""
        heard_words = words(heard)
        said = words(self.recent_text) | (words(self.turn.text) if self.turn is not None else set())
        return bool(heard_words - said)

    def _start_turn(self, participant: Participant, request: TurnRequest) -> None:
        assert self.runtime is not None
        offered = {t.name for t in self.runtime.offer().app_tools}
        state = RunningTurn(
            id=new_turn_id(),
            owner=participant,
            request=request,
            app_tools=frozenset(participant.app_tools) & offered,
        )
        self.turn = state
        self.platform.start_turn_soon(self._run_turn, state)

    async def _run_turn(self, state: RunningTurn) -> None:
        owner = state.owner
        try:
            with state.scope:
                await self._take_turn(state)
        except TurnBusy:
            owner.deliver(Refused(reason="busy"))
        except Exception:
            log.exception("a turn of conversation %s failed", self.conversation_id)
            if state.started and not state.finished:
                state.finished = True
                owner.deliver(TurnFailed(turn=state.id, text=state.text))
        finally:
            if self.turn is state:
                self.turn = None
            state.finished = True
            state.done.set()
            self._after_turn(owner)

    async def _take_turn(self, state: RunningTurn) -> None:
        runtime = self.runtime
        assert runtime is not None
        request = state.request
        confirmed: PendingConfirmation | None = None
        if request.confirm_call_id is not None:
            try:
                pending = runtime.take_confirmation(request.confirm_call_id)
            except ConfirmationNotWaiting:
                state.owner.deliver(Refused(reason="not_waiting"))
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
            # Thinking summaries only for a request that asked and an agent that allows them.
            thoughts=request.thoughts and self.platform.agent.thinking_summaries == "auto",
        )
        if result is None:
            state.owner.deliver(Refused(reason="ending"))

    def _after_turn(self, participant: Participant) -> None:
        held, self.held = self.held, None
        if held is not None and not self.closed:
            holder, request = held
            if holder in self.participants:
                self._start_turn(holder, request)
        participant.turn_over()

    def _hearing(self, state: RunningTurn, recording: Recording) -> Callable[[], Any]:
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
        state.owner.deliver(
            AppToolCalled(
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

    def app_result(self, call_id: str, result: Any, error: str | None) -> None:
        """The app's answer to an :class:`AppToolCalled`; one for a call that is over is ignored."""
        waiter = self._app_calls.pop(call_id, None)
        if waiter is None:
            return
        if error is not None:
            waiter.send_nowait(ToolOutcome(ok=False, error=error))
        else:
            waiter.send_nowait(ToolOutcome(ok=True, result=result))

    # -- What a turn reports -----------------------------------------------------------------

    async def _on_turn_event(self, event: TurnEvent) -> None:
        state = self.turn
        turn_id = event.result.turn if isinstance(event, TurnFinished) else event.turn
        if state is None or state.id != turn_id or state.finished:
            return
        owner = state.owner
        tid = state.id
        if isinstance(event, TurnStarted):
            state.started = True
            owner.deliver(TurnOpened(turn=tid, conversation_id=self.conversation_id))
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
                owner.deliver(NoVoice(turn=tid))
            request = state.request
            if request.text is not None and request.confirm_call_id is None:
                await self._search_first(state, request.text)
        elif isinstance(event, ToolStarted):
            kind = self._kind(state, event.name)
            state.open_tools[event.call_id] = (event.name, kind, time.monotonic())
            owner.deliver(ToolOpened(turn=tid, call_id=event.call_id, name=event.name, kind=kind))
        elif isinstance(event, ToolEnded):
            name, kind, _ = state.open_tools.pop(
                event.call_id, (event.name, self._kind(state, event.name), 0.0)
            )
            owner.deliver(
                ToolClosed(turn=tid, call_id=event.call_id, name=name, kind=kind, ok=event.ok, ms=event.ms)
            )
        elif isinstance(event, TurnFinished):
            await self._finish(state, event)
        elif isinstance(event, Heard):
            owner.deliver(event)
            await self._search_first(state, event.text)
        elif isinstance(event, Muted):
            if not state.muted_sent:
                state.muted_sent = True
                owner.deliver(event)
        elif isinstance(event, AudioStart):
            state.window_rate_hz, state.window_bytes = event.sample_rate_hz, 0
            owner.deliver(event)
        elif isinstance(event, AudioData):
            owner.deliver(event)
            state.window_bytes += len(event.pcm)
        elif isinstance(event, AudioEnd):
            # A cancel can stop the engine between counting a piece of audio and handing it
            # over: the window's end reports what the owner was given, which it was charged.
            seconds = state.window_bytes / 2 / state.window_rate_hz if state.window_rate_hz else 0.0
            state.speech_seconds += seconds
            owner.deliver(attrs.evolve(event, bytes=state.window_bytes, audio_seconds=seconds))
        elif isinstance(event, UsageReported):
            # The mood belongs with the text it judges, before the usage (seed 002's order).
            self._judge_mood(state, state.text)
            owner.deliver(event)
        else:
            if isinstance(event, ReplyDelta):
                # Thoughts are never part of the text: not in the message nor the transcript.
                state.text += event.text
            owner.deliver(event)

    def _judge_mood(self, state: RunningTurn, text: str) -> tuple[str, float] | None:
        """Report the reply's mood, if the agent reports moods and the text changed since the last."""
        if not self.platform.agent.moods or not text.strip():
            return None
        mood = mood_of(text)
        if state.mood_text != text:
            state.mood_text = text
            state.owner.deliver(MoodJudged(turn=state.id, mood=mood[0], intensity=mood[1]))
        return mood

    def _kind(self, state: RunningTurn, name: str) -> ToolKind:
        runtime = self.runtime
        if runtime is not None and name in runtime.platform_tools:
            return "platform"
        return "app" if name in state.app_tools else "webhook"

    # -- What lives behind the conversation: knowledge, relations, summaries ------------------

    def _extra_instructions(self) -> str | None:
        parts = []
        if self.summary:
            parts.append(self.summary)
        state = self.turn
        if state is not None and state.knowledge:
            parts.append(state.knowledge)
        return "\n\n".join(parts) or None

    def _platform_tools(self) -> dict[str, PlatformTool]:
        agent = self.platform.agent
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
        self, state: RunningTurn, via: Literal["first", "tool"], query: str
    ) -> list[KnowledgeHit] | None:
        try:
            hits = await self.platform.store.search_knowledge(
                self.platform.agent_id, query, limit=KNOWLEDGE_HITS
            )
        except Exception:
            log.exception("a knowledge search of conversation %s failed", self.conversation_id)
            state.owner.deliver(KnowledgeSearched(turn=state.id, via=via, outcome="failed", hits=()))
            return None
        state.owner.deliver(
            KnowledgeSearched(turn=state.id, via=via, outcome="found" if hits else "none", hits=tuple(hits))
        )
        return hits

    async def _search_first(self, state: RunningTurn, text: str) -> None:
        if self.platform.agent.knowledge != "first" or state.finished:
            return
        hits = await self._search(state, "first", text)
        if hits:
            state.knowledge = "\n".join(with_stop(h.text) for h in hits)

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
        return ToolOutcome(ok=True, result=" ".join(with_stop(h.text) for h in hits))

    async def _relation_tool(self, turn_id: str, call: ToolCall) -> ToolOutcome:
        state = self.turn
        if state is None or state.id != turn_id:
            return ToolOutcome(ok=False, error="the turn is over")
        note = str(call.arguments.get("note") or "").strip()[:MAX_NOTE_CHARS]
        if not note:
            return ToolOutcome(ok=False, error="a note is needed")
        row = await self.platform.store.record_relation(
            self.platform.agent_id, state.owner.end_user_id, note, turn_id=turn_id
        )
        state.relation = row
        return ToolOutcome(ok=True, result=f"Noted: {note}")

    async def _compact_if_due(self) -> Compacted | None:
        """After a reply: fold the messages before the last exchange into the summary, if over budget."""
        budget = self.platform.agent.compact_after_words
        runtime = self.runtime
        if budget is None or runtime is None:
            return None
        history = runtime.history
        if sum(len(m.content.split()) for m in history) <= budget:
            return None
        return await self.compact("automatic")

    async def compact(self, trigger: Literal["automatic", "manual"]) -> Compacted | None:
        """Summarise every stored message before the last person's turn; the transcript is kept."""
        runtime = self.runtime
        assert runtime is not None
        history = runtime.history
        cut = max((i for i, m in enumerate(history[: self._persisted]) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        after_position = self._first_position + cut - 1
        summary = summarise(self.summary, history[:cut])
        await self.platform.store.add_summary(
            self.conversation_id, after_position=after_position, summary=summary, trigger=trigger
        )
        del history[:cut]
        self._persisted -= cut
        self._first_position += cut
        self.summary = summary
        return Compacted(conversation_id=self.conversation_id, after_position=after_position, trigger=trigger)

    def announce_compacted(self, compacted: Compacted) -> None:
        """Tell everyone of a compaction asked for between turns (after the turn, if one began)."""
        if self.turn is not None:
            self.pending_compacted = compacted
        else:
            self._tell_all(compacted)

    async def _finish(self, state: RunningTurn, event: TurnFinished) -> None:
        result = event.result
        owner = state.owner
        tid = state.id
        try:
            await self._persist(result.turn)
        except Exception:
            log.exception("the messages of conversation %s were not stored", self.conversation_id)
        now = time.monotonic()
        for call_id, (name, kind, began) in list(state.open_tools.items()):
            # A cancelled tool still ends its pair.
            owner.deliver(
                ToolClosed(
                    turn=tid, call_id=call_id, name=name, kind=kind, ok=False, ms=int((now - began) * 1000)
                )
            )
        state.open_tools.clear()
        # A reply with no usage after its last words (scripted, or cut short) is judged now.
        mood = self._judge_mood(state, result.text)
        if state.mute_requested and not state.muted_sent:
            state.muted_sent = True
            owner.deliver(Muted(turn=tid))
        self.recent_text = result.text
        spent = await self._charge(state, result)
        # Compacted now, announced after the turn's last event: nothing below waits, so the
        # turn is over (and the next may start) the moment it is closed.
        try:
            compacted = await self._compact_if_due()
        except Exception:
            log.exception("conversation %s could not be compacted", self.conversation_id)
            compacted = None
        compacted, self.pending_compacted = compacted or self.pending_compacted, None
        state.finished = True
        reason = state.cancel_reason or "internal"
        if result.error_code is not None:
            reason = "provider_failed"  # the code of the error that names the failure
        owner.deliver(
            TurnClosed(
                turn=tid,
                conversation_id=self.conversation_id,
                result=result,
                mood=mood,
                relation=state.relation,
                reason=reason,
                stage=state.stage,
                tool_kinds={c.call_id: self._kind(state, c.name) for c in result.tool_calls},
            )
        )
        if compacted is not None:
            self._tell_all(compacted)
        if spent is not None:
            owner.deliver(Charged(token_id=owner.token_id, spent=spent))

    async def _charge(self, state: RunningTurn, result: TurnResult) -> Spent | None:
        rows = usage_rows(result, state.speech_seconds)
        if not rows:
            return None
        owner = state.owner
        try:
            return await self.platform.store.charge(
                conversation_id=self.conversation_id,
                turn_id=state.id,
                token_id=owner.token_id,
                end_user_id=owner.end_user_id,
                rows=rows,
            )
        except Exception:
            log.exception("the usage of a turn of conversation %s was not stored", self.conversation_id)
            return None

    async def _persist(self, turn_id: str) -> None:
        runtime = self.runtime
        assert runtime is not None
        _close_dangling_tool_calls(runtime.history)
        new = runtime.history[self._persisted :]
        self._persisted = len(runtime.history)
        await self.platform.store.append_messages(
            self.conversation_id, [_stored_message(m, turn_id) for m in new]
        )


def chat_message(message: StoredMessage) -> ChatMessage:
    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]  # stored roles are written only from ChatMessage roles; the column is a plain str
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
