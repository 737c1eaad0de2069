"""An agent in a call: its context, its turns and its live settings.

:class:`AgentRuntime` is the call's :class:`~runner.calls.Conversation`. It reads the
caller's events (typed text, keys, who joined) and hands their audio to the call's
:class:`~runner.voice.pipeline.VoicePipeline`, which reports the caller's turns back through
:class:`~runner.voice.pipeline.PipelineHooks`; it runs one turn at a time through the turn
engine and hands what the turn says to the pipeline. Its parts live beside it: the call's
messages (``_messages``), records (``_records``), tools and confirmations (``_tools``),
providers (``_build``) and the queue of turns asked for (``_turn_queue``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any

import attrs
import trio

from ..calls import CallContext, CallRecord, keep_json
from ..errors import InvalidRequest, RunnerError
from ..providers import (
    ChatMessage,
    ChatModel,
    Recognizer,
    ToolCall,
)
from ..sessions import (
    AudioFrame,
    DtmfReceived,
    ParticipantJoined,
    ParticipantLeft,
    TransportEvent,
    TransportSession,
    UserText,
)
from ..telemetry import current_metrics, current_span, enter_span, exit_span, stage, start_span
from ..voice.engine import Hear, Turn, TurnPlan
from ..voice.events import SpeechFailed, TurnEvent, TurnFinished, TurnResult
from ..voice.listener import Utterance
from ..voice.pipeline import VoicePipeline
from ..voice.preempt import Preempted, PrefetchedReply, PreSpoken, early_messages
from ..wire import EffectiveSettings, encode
from ._authoring import Agent, Offer, call_maybe_async, log_tool_failure
from ._build import CallProviders, Unbuildable
from ._build import WarmUpFailed as WarmUpFailed
from ._build import build_stt as build_stt
from ._build import build_tts as build_tts
from ._build import warm_up as warm_up
from ._build import without_voice as without_voice
from ._context import Context
from ._experiments import choose_experiments as choose_experiments
from ._messages import CallMessages, refusal_details
from ._records import CallRecords
from ._settings import LLM, STT, TTS, Origin
from ._settings_live import Overrides, check_update, effective, merge
from ._tools import AppToolHandler as AppToolHandler
from ._tools import CallTools
from ._tools import ConfirmationNotWaiting as ConfirmationNotWaiting
from ._tools import PendingConfirmation as PendingConfirmation
from ._tools import PlatformSupport as PlatformSupport
from ._tools import PlatformTool as PlatformTool
from ._turn_queue import TurnQueue

log = logging.getLogger("runner.agent")

_STAGE_NAMES = {"stt": "speech recognition (stt)", "model": "model (llm)", "tts": "voice (tts)"}


class TurnBusy(Exception):
    """A turn was asked for with ``exclusive=True`` while another one is running."""


class AgentRuntime:
    """One agent in one call.

    Args:
        agent: What the agent is.
        call: What the call was started with.
        record: Where the call's records go (``None``: a call that keeps no record).
        host_connected: A host reads this call's record (managed, direct-join, dev).
        model: A chat model every turn uses instead of the one the settings name
            (``runner.testing`` runs an agent against a scripted model); None: the settings'.
    """

    def __init__(
        self,
        agent: Agent,
        call: CallContext,
        record: CallRecord | None,
        *,
        host_connected: bool,
        model: ChatModel | None = None,
    ) -> None:
        self.agent = agent
        self.call = call
        self.record = record
        self.host_connected = host_connected and record is not None
        self.records = CallRecords(record, call.session_id)
        self.ready = trio.Event()
        self.messages = CallMessages(
            agent,
            self.records,
            session_id=call.session_id,
            host_connected=self.host_connected,
            adjust=self.adjust,
            ready=self.ready,
        )
        self.ctx = Context(
            session_id=call.session_id,
            direction=call.direction,
            client=call.client,
            experiments=call.experiments,
            state=agent.state_factory(),
            link=self.messages,
            settings=self.settings,
            resume=call.resume,
        )
        self.messages.ctx = self.ctx
        self.tools = CallTools(self.offer, self.ctx, self._emit)
        # A resumed call goes on from the conversation its first runner held.
        self.history: list[Any] = [ChatMessage(role=t.role, content=t.text) for t in self.ctx.call.history]
        self.session: TransportSession | None = None
        self.providers = CallProviders()
        self._overrides = Overrides()
        self._turn: Turn | None = None
        self._turn_done = trio.Event()
        self._turn_done.set()
        self._accepting = True
        self._listening = True
        self._listeners: list[Callable[[TurnEvent], Awaitable[None]]] = []
        # The call's spoken path (its audio in and out), while the call runs.
        self._pipeline: VoicePipeline | None = None
        self._queue = TurnQueue()
        self._keys_send, self._keys = trio.open_memory_channel[DtmfReceived](math.inf)
        # Made inside the call's task, whose span (if tracing) is the call's: each turn's parent.
        self._call_span = current_span()
        # What the agent platform adds to the turns, once a conversation of its holds the call.
        self._platform: PlatformSupport | None = None
        self._model = model

    # -- What the agent offers, with live settings on top -----------------------------------

    def offer(self) -> Offer:
        return self.agent.offer(self.ctx)

    def current(self) -> tuple[LLM, TTS | None, STT | None]:
        return self._overrides.apply(self.offer())

    def settings(self) -> EffectiveSettings:
        return effective(*self.current())

    async def adjust(self, origin: Origin, update: object) -> EffectiveSettings:
        """Apply a SessionUpdate from ``origin``, all or nothing; journal the outcome.

        An update that is not a JSON object is no attempted change: it is refused
        (``invalid_request``) and not journaled, as a malformed request is anywhere.
        """
        try:
            changes = check_update(
                update,
                origin=origin,
                adjustable=self.agent.adjustable[origin],
                current=self.current(),
                author_llm=self.offer().llm,
            )
        except InvalidRequest:
            raise
        except RunnerError as refusal:
            await self.records.event(
                "curb.settings",
                {
                    "origin": origin,
                    "update": keep_json(update)[0],
                    "outcome": refusal.code,
                    **refusal_details(refusal),
                },
            )
            raise
        settings = effective(*merge(self._overrides, changes).apply(self.offer()))
        await self.records.event(
            "curb.settings",
            {
                "origin": origin,
                "update": keep_json(update)[0],
                "outcome": "accepted",
                "settings": encode(settings),
            },
        )
        # Applied once its record is written: an update the journal refused changes nothing.
        self._overrides = merge(self._overrides, changes)
        return settings

    # -- Turns ------------------------------------------------------------------------------

    def attach_platform(self, platform: PlatformSupport) -> None:
        """Take what the agent platform adds to the turns: app tools, confirmations, instructions, its tools.

        Called once, when a conversation of the platform takes the call.
        """
        self._platform = platform
        self.tools.attach_platform(platform)

    def add_listener(self, listener: Callable[[TurnEvent], Awaitable[None]]) -> None:
        """Also tell ``listener`` everything a turn does (a console, a test)."""
        self._listeners.append(listener)

    async def _emit(self, event: TurnEvent) -> None:
        if self._pipeline is not None:
            await self._pipeline.play(event)
        match event:
            case TurnFinished(result=result):
                self.tools.turn_finished(result.turn)
                if result.error_code is not None:
                    log.warning(
                        "call %s: turn %s failed at the %s: %s",
                        self.call.session_id,
                        result.turn,
                        _STAGE_NAMES.get(result.stage or "", result.stage),
                        result.reason,
                    )
                await self.records.turn(result)
            case SpeechFailed():
                log.warning(
                    "call %s: turn %s could not speak sentence %d (tts): %s: %s",
                    self.call.session_id,
                    event.turn,
                    event.chunk,
                    event.code,
                    event.message,
                )
        for listener in self._listeners:
            await listener(event)

    @property
    def busy(self) -> bool:
        """A turn is running, or one is queued to run (or being heard)."""
        hearing = self._pipeline is not None and self._pipeline.hearing
        return self._turn is not None or self._queue.queued > 0 or hearing

    @property
    def pipeline(self) -> VoicePipeline | None:
        """The call's spoken path, while the call runs."""
        return self._pipeline

    @property
    def current_turn(self) -> Turn | None:
        """The running turn, if any."""
        return self._turn

    def mute(self) -> bool:
        """Stop the running turn's voice but let it finish; False when no turn runs."""
        if self._turn is None:
            return False
        self._turn.mute()
        return True

    def load_history(self, messages: Iterable[ChatMessage]) -> None:
        """Continue a stored conversation: its messages come before this call's."""
        self.history[:0] = list(messages)

    def greeting_options(self) -> dict[str, Any] | None:
        """How this call opens: ``take_turn(None, **options)``, or ``None`` when the agent waits."""
        greeting = self.agent.resume_line if self.ctx.call.resumed else self.agent.greeting
        if greeting is True:
            return {}
        if greeting:
            line = greeting(self.ctx) if callable(greeting) else greeting
            if line:
                return {"scripted": line}
        return None

    def voice_sample_rate_hz(self) -> int | None:
        """The rate the agent's voice speaks at now; ``None`` for an agent that only writes."""
        _, tts, _ = self.current()
        provider = self.providers.tts(tts)
        return int(provider.sample_rate_hz) if provider is not None else None

    def recognizer(self, language: str | None = None) -> Recognizer | None:
        """The agent's speech recognizer now (``language`` overriding its own); ``None`` if it has none.

        Raises:
            ValueError: The recognizer cannot take ``language``.
        """
        _, _, stt = self.current()
        if stt is None:
            return None
        if language is not None and language != stt.language:
            stt = attrs.evolve(stt, language=language)
        return self.providers.stt(stt)

    def _plan(self, *, speech: bool | None = None) -> TurnPlan:
        llm_spec, tts_spec, _ = self.current()
        # A provider this runner cannot build fails the turn (or its speech), never the call.
        try:
            llm = self._model if self._model is not None else self.providers.llm(llm_spec)
        except Exception as exc:  # noqa: BLE001 - any failure to build a model fails the turn, never the call
            log.error("call %s: cannot build its model: %s", self.call.session_id, exc)
            llm = Unbuildable(str(exc))
        tts = None
        if speech is not False:
            try:
                tts = self.providers.tts(tts_spec)
            except Exception as exc:  # noqa: BLE001 - any failure to build a voice leaves the turn unspoken, never fails the call
                log.error("call %s: cannot build its voice: %s", self.call.session_id, exc)
        return TurnPlan(
            llm=llm,
            tts=tts,
            instructions=lambda: _instructions(self.offer(), self._platform),
            tools=self.tools.specs,
            run_tool=self.tools.run,
            max_tool_rounds=self.agent.max_tool_rounds,
            filler=self.tools.filler,
        )

    async def take_turn(
        self,
        text: str | None,
        *,
        scripted: str | None = None,
        heard_seconds: float | None = None,
        turn_id: str | None = None,
        exclusive: bool = False,
        speech: bool | None = None,
        app_tools: Collection[str] = (),
        hear: Hear | None = None,
        confirmed: PendingConfirmation | None = None,
        thoughts: bool = False,
        span: Any = None,
        speech_ended_at: float | None = None,
        prefetched: PrefetchedReply | None = None,
    ) -> TurnResult | None:
        """Run one turn (waiting for the one before it); ``None`` once the call stopped taking turns.

        Args:
            text: The person's words (``None`` for an opening line, or with ``hear``).
            scripted: Speak this text as written instead of asking the model.
            heard_seconds: For a spoken turn whose words are ``text``: how much audio it was.
            turn_id: The turn's id (a new one by default).
            exclusive: Raise :class:`TurnBusy` instead of waiting for a running turn.
            speech: ``False``: no voice this turn; ``None`` or ``True``: the agent's own.
            app_tools: The app tools the caller's app runs, by name (the others are not offered).
            hear: Transcribe a spoken turn inside it (see :meth:`Turn.run`).
            confirmed: A call the person said yes to: it runs before the model is asked.
            thoughts: Ask the model for its thinking summaries (reported as ``Thought``
                events, never part of the reply or the transcript). The caller decides
                whether the agent allows them (``Agent(thinking_summaries=...)``).
            span: The turn's trace span, when it was started before (a spoken turn's transcription).
            speech_ended_at: ``time.monotonic()`` when the person stopped speaking, for the
                first-audio latency (default: now, when the turn is asked for).
            prefetched: The model's reply, asked for before the turn ended (a spoken
                turn's preemptive generation); used if the turn asks the same.
        """
        asked_at = speech_ended_at if speech_ended_at is not None else time.monotonic()
        if span is None:
            span = start_span("turn", {"curb.session_id": self.call.session_id}, parent=self._call_span)
        try:
            return await self._take_turn(
                text,
                scripted=scripted,
                heard_seconds=heard_seconds,
                turn_id=turn_id,
                exclusive=exclusive,
                speech=speech,
                app_tools=app_tools,
                hear=hear,
                confirmed=confirmed,
                thoughts=thoughts,
                span=span,
                asked_at=asked_at,
                prefetched=prefetched,
            )
        finally:
            if span is not None:
                span.end()

    async def _take_turn(
        self,
        text: str | None,
        *,
        scripted: str | None,
        heard_seconds: float | None,
        turn_id: str | None,
        exclusive: bool,
        speech: bool | None,
        app_tools: Collection[str],
        hear: Hear | None,
        confirmed: PendingConfirmation | None,
        thoughts: bool,
        span: Any,
        asked_at: float,
        prefetched: PrefetchedReply | None,
    ) -> TurnResult | None:
        if not self._accepting:
            return None
        if exclusive and self.busy:
            raise TurnBusy("a turn is already running")
        while self._turn is not None:
            await self._turn_done.wait()
        if not self._accepting:
            return None
        offered = {t.name: t for t in self.offer().app_tools}
        self.tools.turn_app_tools = tuple(offered[name] for name in app_tools if name in offered)
        plan = self._plan(speech=speech)
        if prefetched is not None:
            plan = attrs.evolve(
                plan,
                llm=Preempted(plan.llm, prefetched),
                tts=PreSpoken(plan.tts, prefetched) if plan.tts is not None else None,
            )
        turn = Turn(plan, self.history, self._emit, turn_id=turn_id)
        self._turn = turn
        self.tools.turn_id = turn.id
        self._turn_done = trio.Event()
        run_first: Sequence[ToolCall] = ()
        if confirmed is not None:
            self.tools.confirm(confirmed.call_id)
            run_first = (confirmed.call(),)
        heard_and_kept: Hear | None = None
        if hear is not None:
            spoken = hear

            async def heard_and_kept() -> tuple[str, float]:
                with stage("stt", self.providers.stt(self.current()[2])):
                    words, seconds = await spoken()
                await self.records.write(
                    "conversation",
                    {"type": "turn", "turn": turn.id, "role": "user", "text": words, "spoken": True},
                )
                return words, seconds

        if span is not None:
            span.set_attribute("curb.turn_id", turn.id)
        entered = enter_span(span)
        try:
            if text is not None:
                # Not waited for: the model starts while the journal commits (a commit is
                # an fsync); every later write of this call waits for it, so order holds.
                await self.records.write_soon(
                    "conversation",
                    {
                        "type": "turn",
                        "turn": turn.id,
                        "role": "user",
                        "text": text,
                        "spoken": heard_seconds is not None,
                    },
                )
            started = time.monotonic()
            result = await turn.run(
                text,
                scripted=scripted,
                heard=text if heard_seconds is not None else None,
                heard_seconds=heard_seconds,
                hear=heard_and_kept,
                run_first=run_first,
                thoughts=thoughts,
            )
            _observe_turn(result, span, started - asked_at)
            return result
        finally:
            exit_span(entered)
            self._turn = None
            self.tools.turn_id, self.tools.turn_app_tools = None, ()
            if confirmed is not None:
                self.tools.confirm(confirmed.call_id, yes=False)
            self._turn_done.set()

    def interrupt(self, reason: str = "barge_in") -> None:
        """Cancel the running turn, if any (a barge-in, a transfer)."""
        if self._turn is not None:
            self._turn.cancel(reason)

    # -- The call ---------------------------------------------------------------------------

    async def run(self, session: TransportSession, events: trio.MemoryReceiveChannel[TransportEvent]) -> None:
        """Converse over ``session`` until cancelled."""
        self.session = session
        self.messages.session = session
        session.set_request_handler(self.messages.handle_client_request)
        _, _, stt = self.current()
        pipeline = VoicePipeline(
            session,
            _Hooks(self),
            # Where the caller's side delimits its turns, the pipeline detects none of its own.
            stt=None if session.delimits_turns else self.providers.stt(stt),
            vad=self.agent.vad,
            turn=self.agent.turn_taking,
            session_id=self.call.session_id,
            call_span=self._call_span,
        )
        try:
            async with trio.open_nursery() as nursery:
                self.records.nursery = nursery
                nursery.start_soon(self.messages.serve_outbox)
                nursery.start_soon(self._queue.serve, self.take_turn)
                nursery.start_soon(self._serve_keys)
                await nursery.start(pipeline.serve)
                self._pipeline = pipeline
                # A session that delimits its own turns (the agent WebSocket) opens the call itself.
                greeting = None if session.delimits_turns else self.greeting_options()
                if greeting is not None:
                    ringing = session.ringing()
                    if ringing is None:
                        self._queue.put(None, **greeting)
                    else:
                        nursery.start_soon(
                            self._queue.put_once_answered, ringing, lambda: self._accepting, greeting
                        )
                self.ready.set()
                async for event in events:
                    await self._on_event(event)
        finally:
            self._pipeline = None
            self.records.nursery = None
            self._accepting = False
            self.messages.release_asks()

    async def _serve_keys(self) -> None:
        # The caller's keys, one at a time: each is recorded, then its handlers run.
        async for key in self._keys:
            handlers = self.agent.dtmf_handlers_for(self.ctx) if self._listening else []
            await self.records.event(
                "curb.dtmf", {"from": "caller", "digit": key.digit, "handled": bool(handlers)}
            )
            for fn in handlers:
                try:
                    said = await call_maybe_async(fn, self.ctx, key.digit)
                except Exception as exc:  # noqa: BLE001 - an author's handler may raise anything; the call goes on
                    log_tool_failure(f"on_dtmf handler {getattr(fn, '__name__', fn)!r}", exc)
                    continue
                if isinstance(said, str) and said.strip():
                    self._queue.put(None, scripted=said)
            # Counted like a turn asked for (from its arrival): wait_idle waits for its handlers.
            self._queue.done()

    async def wait_idle(self) -> None:
        """Wait until every turn asked for so far (or heard, or made by a key) has ended."""
        while True:
            if self._pipeline is not None:
                await self._pipeline.wait_heard()
            await self._queue.idle.wait()
            if self._pipeline is None or not self._pipeline.hearing:
                return

    async def _on_event(self, event: TransportEvent) -> None:
        match event:
            case UserText(text=text):
                if not self._listening:
                    # While the transfer target is in the call the agent takes no turns.
                    log.info("call %s: typed text ignored during a transfer", self.call.session_id)
                    return
                # Typed turns queue behind the running one; only speech barges in.
                self._queue.put(text)
            case AudioFrame(pcm=pcm, sample_rate_hz=rate_hz):
                if self._pipeline is not None and self._listening:
                    await self._pipeline.hear(pcm, rate_hz)
            case DtmfReceived():
                # Kept in order by their own task: a slow handler never holds the caller's audio.
                self._queue.asked()
                self._keys_send.send_nowait(event)
            case ParticipantJoined(kind="transfer_target", identity=identity):
                # While the transfer target is in the call the agent neither listens nor speaks.
                self._listening = False
                self.interrupt("transferred")
                if self._pipeline is not None:
                    await self._pipeline.clear()
                await self.records.event("curb.transfer", {"state": "target_joined", "identity": identity})
            case ParticipantLeft(kind="transfer_target", identity=identity):
                self._listening = True
                await self.records.event("curb.transfer", {"state": "agent_resumed", "identity": identity})

    async def finish_utterance(self) -> None:
        """Take no new turns; return once the running one (if any) ended.

        An ``ask_host`` still waiting fails at once with HostUnavailableError: the call ends.
        """
        self._accepting = False
        self.messages.release_asks()
        await self._turn_done.wait()


class _Hooks:
    """What the call's voice pipeline reports to the runtime (its :class:`PipelineHooks`)."""

    def __init__(self, runtime: AgentRuntime) -> None:
        self._runtime = runtime

    def recognizer(self) -> Recognizer:
        recognizer = self._runtime.recognizer()
        assert recognizer is not None, "a call listens only with a recognizer"
        return recognizer

    def on_start_of_speech(self) -> bool:
        """The caller started to speak: if the agent was speaking, stop its voice and its reply."""
        if self._runtime.current_turn is None:
            return False
        self._runtime.interrupt("barge_in")
        return True

    def prefetch(self, text: str) -> PrefetchedReply | None:
        """The reply to ``text``, asked for before the caller's turn is sure to be over.

        Only a turn that would start at once is asked for early: not behind another turn.
        """
        runtime = self._runtime
        if runtime.busy or not runtime._accepting:
            return None
        plan = runtime._plan()
        if isinstance(plan.llm, Unbuildable):
            return None
        tools = plan.tools() if plan.max_tool_rounds > 0 else ()
        return PrefetchedReply(
            plan.llm, early_messages(plan.instructions(), runtime.history, text), tools, tts=plan.tts
        )

    def on_user_turn(
        self, heard: Utterance, *, span: Any, ended_at: float, prefetched: PrefetchedReply | None
    ) -> None:
        """The caller's spoken turn, recognized: it queues behind the running one."""
        self._runtime._queue.put(
            heard.text,
            heard_seconds=heard.audio_seconds,
            span=span,
            speech_ended_at=ended_at,
            prefetched=prefetched,
        )


def _instructions(offer: Offer, platform: PlatformSupport | None) -> str:
    texts = [offer.instructions]
    if platform is not None and (extra := platform.instructions()):
        texts.append(extra.strip())
    return "\n\n".join(t for t in texts if t)


def _observe_turn(result: TurnResult, span: Any, waited_s: float) -> None:
    """Count a finished turn; ``waited_s`` ran from the end of the person's turn to its start."""
    metrics = current_metrics()
    if metrics is not None:
        first_audio_ms = result.timings.first_audio_sent_ms
        metrics.turn_finished(
            error=result.error_code is not None,
            interrupted=result.interrupted,
            first_audio_s=None if first_audio_ms is None else waited_s + first_audio_ms / 1000,
        )
    if span is not None:
        span.set_attribute("curb.interrupted", result.interrupted)
        if result.error_code is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, result.reason or result.error_code))
            span.set_attribute("curb.failed_stage", result.stage or "")


def conversation_factory(
    agent: Agent, *, host_connected: bool
) -> Callable[[CallContext, CallRecord], AgentRuntime]:
    """The runner's way to make this agent's side of each call.

    Args:
        agent: The agent.
        host_connected: The call's record is read by a host.
    """

    def make(call: CallContext, record: CallRecord) -> AgentRuntime:
        return AgentRuntime(agent, call, record, host_connected=host_connected)

    return make
