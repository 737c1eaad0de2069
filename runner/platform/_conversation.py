"""One conversation while its call runs: its people and its turns, and what each turn reports."""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import trio

from ..agent import AgentRuntime, ConfirmationNotWaiting, PendingConfirmation, PlatformSupport, TurnBusy
from ..voice.engine import new_turn_id
from ..voice.events import (
    AudioData,
    AudioEnd,
    AudioStart,
    BargedIn,
    Heard,
    Muted,
    ReplyDelta,
    ToolEnded,
    ToolStarted,
    TurnEvent,
    TurnFinished,
    TurnStarted,
    UsageReported,
)
from ._events import Charged, Compacted, ConversationEvent, Joined, NoVoice, Refused, TurnClosed, TurnFailed
from ._history import StoredHistory
from ._tools import ConversationTools
from ._turn import ConversationClosed, ConversationHost, Outcome, Participant, RunningTurn, TurnRequest

log = logging.getLogger("runner.platform")

# Bounds on cleanup: a participant that leaves lets its turn unwind for this long.
UNWIND_S = 10.0
READY_S = 5.0


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
        self.history = StoredHistory(conversation_id, platform.store)
        self.tools = ConversationTools(conversation_id, platform, self._running)
        self._join_lock = trio.Lock()
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
                stored = await self.history.load(runtime)
                runtime.add_listener(self._on_turn_event)
                runtime.attach_platform(
                    PlatformSupport(
                        run_app_tool=self.tools.call_app_tool,
                        instructions=self._extra_instructions,
                        tools=self.tools.platform_tools(),
                    )
                )
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
            self.runtime.tools.pending_confirmation(call_id)
        except ConfirmationNotWaiting:
            return False
        return True

    def barge_in(self, participant: Participant, text: str, recording_id: str | None) -> None:
        """A barge-in recording heard the person: say so, and stop their running turn."""
        state = self.owned_turn(participant)
        participant.deliver(BargedIn(text=text, recording_id=recording_id, turn=state.id if state else None))
        if state is not None:
            self.cancel_turn(state, "barge_in")

    def play(self, pcm: bytes) -> None:
        """The agent's voice, from the call's pipeline: to the owner of the turn that speaks."""
        state = self.turn
        if state is not None and not state.finished:
            state.owner.deliver(AudioData(turn=state.id, chunk=state.window_chunk, pcm=pcm))
            state.window_bytes += len(pcm)

    def _running(self, turn_id: str) -> RunningTurn | None:
        state = self.turn
        return state if state is not None and state.id == turn_id else None

    def _start_turn(self, participant: Participant, request: TurnRequest) -> None:
        runtime = self.runtime
        assert runtime is not None
        offered = {t.name for t in runtime.offer().app_tools}
        state = RunningTurn(
            id=new_turn_id(),
            owner=participant,
            request=request,
            app_tools=frozenset(participant.app_tools) & offered,
            platform_tools=frozenset(runtime.tools.platform_tools),
            moods=self.platform.agent.moods,
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
            log.exception(
                "turn %s of conversation %s failed: neither kept nor charged", state.id, self.conversation_id
            )
            if not state.finished:
                self.history.forget_unstored()
            if state.started and not state.finished:
                state.finished = True
                owner.deliver(TurnFailed(turn=state.id, text=state.text))
        finally:
            if self.turn is state:
                self.turn = None
            state.finished = True
            state.done.set()
            held, self.held = self.held, None
            if held is not None and not self.closed and held[0] in self.participants:
                self._start_turn(*held)
            owner.turn_over()

    async def _take_turn(self, state: RunningTurn) -> None:
        runtime = self.runtime
        assert runtime is not None
        request = state.request
        confirmed: PendingConfirmation | None = None
        if request.confirm_call_id is not None:
            try:
                pending = runtime.tools.take_confirmation(request.confirm_call_id)
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
            hear=state.hearing(request.recording) if request.recording is not None else None,
            confirmed=confirmed,
            # Thinking summaries only for a request that asked and an agent that allows them.
            thoughts=request.thoughts and self.platform.agent.thinking_summaries == "auto",
        )
        if result is None:
            state.owner.deliver(Refused(reason="ending"))

    def app_result(self, call_id: str, result: Any, error: str | None) -> None:
        """The app's answer to a call of its tool; one for a call that is over is ignored."""
        self.tools.app_result(call_id, result, error)

    # -- What a turn reports -----------------------------------------------------------------

    async def _on_turn_event(self, event: TurnEvent) -> None:
        """Tell the turn's owner what its turn reports, with what only the platform knows."""
        state = self.turn
        turn_id = event.result.turn if isinstance(event, TurnFinished) else event.turn
        if state is None or state.id != turn_id or state.finished:
            return
        owner = state.owner
        match event:
            case TurnStarted():
                state.started = True
                owner.deliver(event)
                await self._opened(state)
            case ToolStarted(call_id=call_id, name=name):
                kind = state.kind(name)
                state.open_tools[call_id] = (name, kind, time.monotonic())
                owner.deliver(attrs.evolve(event, kind=kind))
            case ToolEnded(call_id=call_id, name=name):
                name, kind, _ = state.open_tools.pop(call_id, (name, state.kind(name), 0.0))
                owner.deliver(attrs.evolve(event, name=name, kind=kind))
            case TurnFinished():
                await self._finish(state, event)
            case Heard(text=text):
                owner.deliver(event)
                await self.tools.search_first(state, text)
            case Muted():
                if not state.muted_sent:
                    state.muted_sent = True
                    owner.deliver(event)
            case AudioStart(chunk=chunk, sample_rate_hz=rate_hz):
                state.window_rate_hz, state.window_chunk, state.window_bytes = rate_hz, chunk, 0
                owner.deliver(event)
            case AudioData():
                pass  # the call's voice pipeline plays it (see play)
            case AudioEnd():
                # A cancel can stop the engine between counting a piece of audio and handing it
                # over: the window's end reports what the owner was given, which it was charged.
                seconds = state.window_bytes / 2 / state.window_rate_hz if state.window_rate_hz else 0.0
                state.speech_seconds += seconds
                owner.deliver(attrs.evolve(event, bytes=state.window_bytes, audio_seconds=seconds))
            case UsageReported():
                # The mood belongs with the text it judges, before the usage (seed 002's order).
                state.judge_mood(state.text)
                owner.deliver(event)
            case ReplyDelta(text=text):
                # Thoughts are never part of the text: not in the message nor the transcript.
                state.text += text
                owner.deliver(event)
            case _:
                owner.deliver(event)

    async def _opened(self, state: RunningTurn) -> None:
        """The turn started: what was asked of it before it did applies now."""
        if state.cancel_reason is not None:
            self.cancel_turn(state, state.cancel_reason)
        if state.mute_requested:
            self.mute_turn(state)
        runtime = self.runtime
        request = state.request
        if request.speech is True and runtime is not None and runtime.voice_sample_rate_hz() is None:
            state.owner.deliver(NoVoice(turn=state.id))
        if request.text is not None and request.confirm_call_id is None:
            await self.tools.search_first(state, request.text)

    def _extra_instructions(self) -> str | None:
        """What the model reads after the agent's instructions: the summary, what the turn found."""
        parts = []
        if self.history.summary:
            parts.append(self.history.summary)
        state = self.turn
        if state is not None and state.knowledge:
            parts.append(state.knowledge)
        return "\n\n".join(parts) or None

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
        now = time.monotonic()
        for call_id, (name, kind, began) in list(state.open_tools.items()):
            # A cancelled tool still ends its pair.
            ms = int((now - began) * 1000)
            owner.deliver(
                ToolEnded(
                    turn=tid,
                    call_id=call_id,
                    name=name,
                    ok=False,
                    ms=ms,
                    result=None,
                    error="cancelled",
                    kind=kind,
                )
            )
        state.open_tools.clear()
        # A reply with no usage after its last words (scripted, or cut short) is judged now.
        mood = state.judge_mood(result.text)
        if state.mute_requested and not state.muted_sent:
            state.muted_sent = True
            owner.deliver(Muted(turn=tid))
        spent = await self.history.store_turn(state, result)
        # Compacted now, announced after the turn's last event: nothing below waits, so the
        # turn is over (and the next may start) the moment it is closed.
        try:
            compacted = await self.history.compact_if_due(self.platform.agent.compact_after_words)
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
                tool_kinds={c.call_id: state.kind(c.name) for c in result.tool_calls},
            )
        )
        if compacted is not None:
            self._tell_all(compacted)
        if spent is not None:
            owner.deliver(Charged(token_id=owner.token_id, spent=spent))
