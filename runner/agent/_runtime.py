"""An agent in a call: its context, its turns, its messages and its live settings.

:class:`AgentRuntime` is the call's :class:`~runner.calls.Conversation`. It reads the
caller's events (typed text, audio, who joined), runs one turn at a time through the turn
engine, delivers keyed messages to the agent's handlers, and sends what the agent says
back through the call's transport session.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from ..calls import CallContext, CallRecord, keep_json
from ..errors import HandlerFailed, InvalidPayload, InvalidRequest, NoHandler, NotAdjustable, RunnerError
from ..providers import ChatMessage, ProviderError, ToolCall, ToolSpec, make_llm, make_stt, make_tts
from ..sessions import (
    AudioFrame,
    ClientRefusal,
    ParticipantJoined,
    ParticipantLeft,
    TransportEvent,
    TransportSession,
    UserText,
)
from ..telemetry import current_metrics, current_span, enter_span, exit_span, mark, stage, start_span
from ..voice.engine import (
    AudioData,
    AudioStart,
    Hear,
    SpeechFailed,
    ToolConfirmRequested,
    ToolOutcome,
    Turn,
    TurnEvent,
    TurnFinished,
    TurnPlan,
    TurnResult,
)
from ..voice.listener import Listener, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted
from ..voice.preempt import Preempted, PrefetchedReply, PreSpoken, Speculation, early_messages
from ..voice.vad import silero_models
from ..wire import EffectiveSettings, HostMessage, Issue, WireError, decode, encode, parse_json
from ._authoring import Agent, AppTool, Offer, Sender, call_maybe_async, check_key
from ._context import Context, HostTimeoutError, HostUnavailableError
from ._experiments import assign_variant
from ._schema import ArgumentsRefused
from ._settings import LLM, STT, TTS, Origin
from ._settings_live import Overrides, check_update, effective, merge

log = logging.getLogger("runner.agent")

CLIENT_WAIT_S = 10.0
MAX_CLIENT_REQUEST_BYTES = 15 * 1024
# How long a tool that asks first waits for the person's answer (and at most one more turn).
CONFIRM_FOR_S = 10 * 60.0

# Runs an app tool's call on the caller's app: (turn id, the tool, the call) -> its outcome.
AppToolHandler = Callable[[str, AppTool, ToolCall], Awaitable[ToolOutcome]]


class TurnBusy(Exception):
    """A turn was asked for with ``exclusive=True`` while another one is running."""


@attrs.frozen(kw_only=True)
class PlatformTool:
    """A tool of the platform itself (not the agent's, not the app's): ``run(turn_id, call)``."""

    spec: ToolSpec
    run: Callable[[str, ToolCall], Awaitable[ToolOutcome]]


class ConfirmationNotWaiting(LookupError):
    """No call of a tool that asks first waits under that id (answered, expired or dropped)."""


@attrs.frozen(kw_only=True)
class PendingConfirmation:
    """A call of a tool marked ``ask_first`` that has not run: it waits for the person."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    turn: str
    expires_at: float

    def call(self) -> ToolCall:
        return ToolCall(id=self.call_id, name=self.name, arguments=self.arguments)


def choose_experiments(
    agent: Agent, session_id: str, client: Mapping[str, str], sent: Mapping[str, str] | None
) -> dict[str, str]:
    """The call's variants: each one the host sent, as sent; the others by the seed's rule."""
    chosen = {
        name: assign_variant(session_id, name, weights, client, agent.from_client.get(name))
        for name, weights in agent.experiments.items()
        if name not in (sent or {})
    }
    return {**chosen, **dict(sent or {})}


@attrs.define
class _Providers:
    """Built providers, rebuilt only when their settings change."""

    built: dict[Any, Any] = attrs.Factory(dict)

    def llm(self, spec: LLM) -> Any:
        if spec not in self.built:
            self.built[spec] = make_llm(
                spec.provider, spec.model, base_url=spec.base_url, api_key_env=spec.api_key_env
            )
        return self.built[spec]

    def tts(self, spec: TTS | None) -> Any:
        if spec is None:
            return None
        if spec not in self.built:
            self.built[spec] = build_tts(spec)
        return self.built[spec]

    def stt(self, spec: STT | None) -> Any:
        if spec is None:
            return None
        if spec not in self.built:
            self.built[spec] = build_stt(spec)
        return self.built[spec]


class _Unbuildable:
    """Stands in for a model that could not be built: its turn fails with a code."""

    provider = "unavailable"
    model = "unavailable"

    def __init__(self, why: str) -> None:
        self._why = why

    async def stream(self, messages: Any, tools: Any = ()) -> Any:
        raise ProviderError("unavailable", f"the model cannot be used: {self._why}")
        yield  # pragma: no cover - makes this an async generator


def build_tts(spec: TTS) -> Any:
    """A speech provider for a voice choice."""
    return make_tts(spec.provider, voice=spec.voice, model=spec.model)


def build_stt(spec: STT) -> Any:
    """A recognizer for a recognition choice."""
    return make_stt(spec.provider, language=spec.language)


_STAGE_NAMES = {"stt": "speech recognition (stt)", "model": "model (llm)", "tts": "voice (tts)"}


class WarmUpFailed(Exception):
    """The agent cannot take calls as it is: a provider it names cannot be built or has no key."""


async def warm_up(agent: Agent) -> None:
    """Build every provider the agent (and its skills) names and look up its key.

    A broken one fails the runner's warm-up (no ready line) rather than its first call,
    and the first call starts warm.

    Raises:
        WarmUpFailed: One line naming the agent, each provider that failed, and why (for a
            missing key, the variable to set).
    """
    problems: list[str] = []

    def build(kind: str, spec: LLM | TTS | STT) -> Any:
        try:
            if isinstance(spec, LLM):
                provider = make_llm(
                    spec.provider, spec.model, base_url=spec.base_url, api_key_env=spec.api_key_env
                )
            else:
                provider = build_tts(spec) if isinstance(spec, TTS) else build_stt(spec)
        except (ProviderError, ValueError) as exc:
            problems.append(f"{kind} provider {spec.provider!r} cannot be built: {exc}")
            return None
        missing = getattr(provider, "missing_key", None)
        if missing:
            problems.append(f"{kind} provider {spec.provider!r} needs {missing}, which is not set")
            return None
        return provider

    for spec in _named(agent.llm, agent, "llm"):
        build("LLM", spec)
    voices = [build("TTS", spec) for spec in _named(agent.tts, agent, "tts")]
    hearing = [build("STT", spec) for spec in _named(agent.stt, agent, "stt")]
    if problems:
        raise WarmUpFailed(f"agent {agent.name!r}: " + "; ".join(problems))
    for kind, provider in [*(("TTS", p) for p in voices), *(("STT", p) for p in hearing)]:
        try:
            if hasattr(provider, "warm_up"):
                # The embedded engines load (and check) their models now, not on the first call.
                await provider.warm_up()
            elif provider is not None and provider.provider == "espeak":
                async for _ in provider.synthesize("ready"):
                    pass
        except ProviderError as exc:
            problems.append(f"{kind} provider {provider.provider!r} cannot warm up: {exc}")
    if problems:
        raise WarmUpFailed(f"agent {agent.name!r}: " + "; ".join(problems))
    if agent.stt is not None and agent.vad == "silero":
        # The first call's detector is loaded now, not on its first audio frame.
        await trio.to_thread.run_sync(silero_models.fill, 1)


def _named(own: Any, agent: Agent, attr: str) -> list[Any]:
    """The agent's own choice and its skills', once each."""
    return [t for t in dict.fromkeys((own, *(getattr(s, attr) for s in agent.skills))) if t is not None]


class AgentRuntime:
    """One agent in one call.

    Args:
        agent: What the agent is.
        call: What the call was started with.
        record: Where the call's records go (``None``: a call that keeps no record).
        host_connected: A host reads this call's record (managed, direct-join, dev).
    """

    def __init__(
        self, agent: Agent, call: CallContext, record: CallRecord | None, *, host_connected: bool
    ) -> None:
        self.agent = agent
        self.call = call
        self.record = record
        self.host_connected = host_connected and record is not None
        self.ctx = Context(
            session_id=call.session_id,
            direction=call.direction,
            client=call.client,
            experiments=call.experiments,
            state=agent.state_factory(),
            link=self,
        )
        self.history: list[Any] = []
        self.ready = trio.Event()
        self.session: TransportSession | None = None
        self._overrides = Overrides()
        self._providers = _Providers()
        self._turn: Turn | None = None
        self._turn_done = trio.Event()
        self._turn_done.set()
        self._accepting = True
        self._listening = True
        self._asks: dict[str, trio.MemorySendChannel[Any]] = {}
        self._ask_count = 0
        self._host_count = 0
        self._warned: set[tuple[str, str]] = set()
        self.undelivered_to_client: dict[str, int] = {}
        self.refused_queued_host_messages = 0
        self._unsent = 0
        self._sent = trio.Event()
        self._sent.set()
        self._outbox_send, self._outbox = trio.open_memory_channel[Callable[[], Awaitable[None]]](math.inf)
        self._listeners: list[Callable[[TurnEvent], Awaitable[None]]] = []
        # The journal write a turn did not wait for (its person's words): later writes follow it.
        self._deferred: _Deferred | None = None
        self._nursery: trio.Nursery | None = None
        self._audio_rate_hz = 0
        self._publishing_first = False  # a turn's first audio is on its way (for its timeline)
        self._listener: Listener | None = None
        self._turns_send, self._turns = trio.open_memory_channel[tuple[str | None, dict[str, Any]]](math.inf)
        # Each utterance with when it ended (time.monotonic()), for the turn's latency.
        self._speech_send, self._speech = trio.open_memory_channel[tuple[SpeechEnded | Speculation, float]](
            math.inf
        )
        # Made inside the call's task, whose span (if tracing) is the call's: each turn's parent.
        self._call_span = current_span()
        # The transcript being decoded at the caller's last pause, while they may go on.
        self._speculation: Speculation | None = None
        self._queued = 0
        self._idle = trio.Event()
        self._idle.set()
        # Set by a transport that runs app tools (the agent WebSocket); None: app tools fail.
        self.app_tool_handler: AppToolHandler | None = None
        # Tools marked ask_first wait for a confirmation only where the caller can give one.
        self.confirms_tools = False
        self._pending: dict[str, PendingConfirmation] = {}
        self._confirmed: set[str] = set()
        self._turn_app_tools: tuple[AppTool, ...] = ()
        # The platform's own tools (knowledge search, relationship notes), set by a transport
        # that provides them: offered beside the agent's tools, run by the transport.
        self.platform_tools: dict[str, PlatformTool] = {}
        # More instructions from the transport (a conversation's summary, knowledge found):
        # each is asked again for every model call; ``None`` or "" adds nothing.
        self.instruction_extras: list[Callable[[], str | None]] = []
        # A chat model object every turn uses instead of the one the settings name
        # (``runner.testing`` runs an agent against a scripted model); None: the settings'.
        self.model: Any = None

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
            await self._event(
                "curb.settings",
                {
                    "origin": origin,
                    "update": keep_json(update)[0],
                    "outcome": refusal.code,
                    **_refusal_details(refusal),
                },
            )
            raise
        self._overrides = merge(self._overrides, changes)
        settings = self.settings()
        await self._event(
            "curb.settings",
            {
                "origin": origin,
                "update": keep_json(update)[0],
                "outcome": "accepted",
                "settings": encode(settings),
            },
        )
        return settings

    # -- Turns ------------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[TurnEvent], Awaitable[None]]) -> None:
        """Also tell ``listener`` everything a turn does (a console, a test)."""
        self._listeners.append(listener)

    async def _emit(self, event: TurnEvent) -> None:
        session = self.session
        if isinstance(event, AudioStart):
            self._audio_rate_hz = event.sample_rate_hz
            self._publishing_first = self._publishing_first or event.chunk == 0
        elif isinstance(event, AudioData) and session is not None:
            await session.publish_audio(event.pcm, self._audio_rate_hz)
            if self._publishing_first:
                self._publishing_first = False
                mark("published_first_audio")
        elif isinstance(event, TurnFinished):
            # A call that asks first waits for the rest of its turn and one more.
            for call_id, pending in list(self._pending.items()):
                if pending.turn != event.result.turn:
                    del self._pending[call_id]
            result = event.result
            if result.error_code is not None:
                log.warning(
                    "call %s: turn %s failed at the %s: %s",
                    self.call.session_id,
                    result.turn,
                    _STAGE_NAMES.get(result.stage or "", result.stage),
                    result.reason,
                )
            await self._record_turn(result)
        elif isinstance(event, SpeechFailed):
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
        """A turn is running, or one is queued to run."""
        return self._turn is not None or self._queued > 0

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
        greeting = self.agent.greeting
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
        provider = self._providers.tts(tts)
        return int(provider.sample_rate_hz) if provider is not None else None

    def recognizer(self, language: str | None = None) -> Any:
        """The agent's speech recognizer now (``language`` overriding its own); ``None`` if it has none.

        Raises:
            ValueError: The recognizer cannot take ``language``.
        """
        _, _, stt = self.current()
        if stt is None:
            return None
        if language is not None and language != stt.language:
            stt = attrs.evolve(stt, language=language)
        return self._providers.stt(stt)

    def pending_confirmation(self, call_id: str) -> PendingConfirmation:
        """The call of a tool that asks first still waiting under ``call_id``.

        Raises:
            ConfirmationNotWaiting: It was answered, expired or dropped by a later turn.
        """
        pending = self._pending.get(call_id)
        if pending is None or trio.current_time() > pending.expires_at:
            self._pending.pop(call_id, None)
            raise ConfirmationNotWaiting(call_id)
        return pending

    def take_confirmation(self, call_id: str) -> PendingConfirmation:
        """Remove and return a waiting call (its answer is being given); see :meth:`pending_confirmation`."""
        pending = self.pending_confirmation(call_id)
        del self._pending[call_id]
        return pending

    def _plan(self, *, speech: bool | None = None) -> TurnPlan:
        llm_spec, tts_spec, _ = self.current()
        # A provider this runner cannot build fails the turn (or its speech), never the call.
        try:
            llm = self.model if self.model is not None else self._providers.llm(llm_spec)
        except Exception as exc:  # noqa: BLE001 - any failure to build a model fails the turn, never the call
            log.error("call %s: cannot build its model: %s", self.call.session_id, exc)
            llm = _Unbuildable(str(exc))
        tts = None
        if speech is not False:
            try:
                tts = self._providers.tts(tts_spec)
            except Exception as exc:  # noqa: BLE001 - any failure to build a voice leaves the turn unspoken, never fails the call
                log.error("call %s: cannot build its voice: %s", self.call.session_id, exc)
        return TurnPlan(
            llm=llm,
            tts=tts,
            instructions=self._instructions,
            tools=lambda: [
                *(t.spec() for t in self.offer().tools),
                *(t.spec() for t in self._turn_app_tools),
                *(p.spec for p in self.platform_tools.values()),
            ],
            run_tool=self._run_tool,
            max_tool_rounds=self.agent.max_tool_rounds,
            filler=self._filler,
        )

    def _filler(self, call: ToolCall) -> str | None:
        """The line the agent says while ``call`` runs: its tool's ``filler``.

        None for a tool that may first wait for the person's confirmation: it is not run yet.
        """
        tool = self.offer().tool(call.name)
        if tool is None or not tool.filler:
            return None
        if tool.ask_first and self.confirms_tools and call.id not in self._confirmed:
            return None
        return tool.filler

    def _instructions(self) -> str:
        texts = [self.offer().instructions]
        texts.extend(text.strip() for extra in self.instruction_extras if (text := extra()))
        return "\n\n".join(t for t in texts if t)

    async def _run_tool(self, call: ToolCall) -> ToolOutcome:
        platform = self.platform_tools.get(call.name)
        if platform is not None and self._turn is not None:
            return await platform.run(self._turn.id, call)
        app_tool = next((t for t in self._turn_app_tools if t.name == call.name), None)
        if app_tool is not None:
            if self.app_tool_handler is None or self._turn is None:
                return ToolOutcome(ok=False, error=f"no app is connected to run {call.name!r}")
            return await self.app_tool_handler(self._turn.id, app_tool, call)
        tool = self.offer().tool(call.name)
        if tool is None:
            return ToolOutcome(ok=False, error=f"no tool {call.name!r} is offered now")
        if tool.ask_first and self.confirms_tools and not self._may_run_unasked(call):
            return await self._ask_first(call)
        try:
            arguments = tool.arguments.check(call.arguments) if tool.arguments else dict(call.arguments)
        except ArgumentsRefused as refused:
            # The model is told what was wrong and may call again; the tool does not run.
            return ToolOutcome(ok=False, error=str(refused))
        try:
            result = await call_maybe_async(tool.fn, self.ctx, **arguments)
        except Exception as exc:  # noqa: BLE001 - an author's tool may raise anything; the model reads it as a tool error
            log.warning("tool %s failed: %s", call.name, exc)
            return ToolOutcome(ok=False, error=f"{type(exc).__name__}: {exc}")
        return ToolOutcome(ok=True, result=result)

    def _may_run_unasked(self, call: ToolCall) -> bool:
        # Confirmed by the person, or called again with the same arguments in their next turn.
        if call.id in self._confirmed:
            return True
        current = self._turn.id if self._turn is not None else None
        for call_id, pending in list(self._pending.items()):
            if (
                pending.turn != current
                and pending.name == call.name
                and pending.arguments == dict(call.arguments)
            ):
                del self._pending[call_id]
                return True
        return False

    async def _ask_first(self, call: ToolCall) -> ToolOutcome:
        assert self._turn is not None
        pending = PendingConfirmation(
            call_id=call.id,
            name=call.name,
            arguments=dict(call.arguments),
            turn=self._turn.id,
            expires_at=trio.current_time() + CONFIRM_FOR_S,
        )
        self._pending[call.id] = pending
        await self._emit(
            ToolConfirmRequested(
                turn=self._turn.id, call_id=call.id, name=call.name, arguments=pending.arguments
            )
        )
        return ToolOutcome(
            ok=False,
            error="not run yet: it waits for the person's confirmation; ask them whether to go ahead",
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
        self._turn_app_tools = tuple(offered[name] for name in app_tools if name in offered)
        plan = self._plan(speech=speech)
        if prefetched is not None:
            plan = attrs.evolve(
                plan,
                llm=Preempted(plan.llm, prefetched),
                tts=PreSpoken(plan.tts, prefetched) if plan.tts is not None else None,
            )
        turn = Turn(plan, self.history, self._emit, turn_id=turn_id)
        self._turn = turn
        self._turn_done = trio.Event()
        run_first: Sequence[ToolCall] = ()
        if confirmed is not None:
            self._confirmed.add(confirmed.call_id)
            run_first = (confirmed.call(),)
        heard_and_kept: Hear | None = None
        if hear is not None:
            spoken = hear

            async def heard_and_kept() -> tuple[str, float]:
                with stage("stt", self._providers.stt(self.current()[2])):
                    words, seconds = await spoken()
                await self._write(
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
                await self._write_soon(
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
            self._turn_app_tools = ()
            if confirmed is not None:
                self._confirmed.discard(confirmed.call_id)
            self._turn_done.set()

    def interrupt(self, reason: str = "barge_in") -> None:
        """Cancel the running turn, if any (a barge-in, a transfer)."""
        if self._turn is not None:
            self._turn.cancel(reason)

    async def _record_turn(self, result: TurnResult) -> None:
        text, truncated = keep_json(result.text)
        body: dict[str, Any] = {
            "type": "turn",
            "turn": result.turn,
            "role": "assistant",
            "text": text,
            "interrupted": result.interrupted,
            "toolCalls": [_tool_call_record(c) for c in result.tool_calls],
            "usage": [
                {
                    "model": u.model,
                    "inputTokens": u.input_tokens,
                    "outputTokens": u.output_tokens,
                    "cachedTokens": u.cached_tokens,
                }
                for u in result.usage
            ],
            "timings": {
                "modelFirstTextMs": result.timings.model_first_text_ms,
                "firstAudioMs": result.timings.first_audio_sent_ms,
                "totalMs": result.timings.total_ms,
            },
            "chunksSpoken": result.chunks_spoken,
        }
        if result.reason is not None:
            body["reason"] = result.reason
        if truncated:
            body["truncated"] = True
        await self._write("conversation", body)

    # -- The call ---------------------------------------------------------------------------

    async def run(self, session: TransportSession, events: trio.MemoryReceiveChannel[TransportEvent]) -> None:
        """Converse over ``session`` until cancelled."""
        self.session = session
        session.set_request_handler(self.handle_client_request)
        _, _, stt = self.current()
        self._listener = (
            Listener(
                self._providers.stt(stt), vad=self.agent.vad, silence_ms=self.agent.end_of_turn_silence_ms
            )
            if stt is not None
            else None
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._serve_outbox)
                nursery.start_soon(self._serve_turns)
                if self._listener is not None:
                    nursery.start_soon(self._serve_hearing)
                # A session that drives its own turns (the agent WebSocket) opens the call itself.
                greeting = None if getattr(session, "drives_turns", False) else self.greeting_options()
                if greeting is not None:
                    self._queue_turn(None, **greeting)
                self.ready.set()
                async for event in events:
                    await self._on_event(event, nursery)
        finally:
            self._nursery = None
            self._accepting = False
            self._release_asks()
            if self._listener is not None:
                self._listener.close()

    def _queue_turn(self, text: str | None, **options: Any) -> None:
        self._queued += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._turns_send.send_nowait((text, options))

    async def _serve_hearing(self) -> None:
        assert self._listener is not None
        async for speech, ended_at in self._speech:
            # The turn starts when the person stopped speaking: its transcription is its first child.
            span = start_span("turn", {"curb.session_id": self.call.session_id}, parent=self._call_span)
            entered = enter_span(span)
            queued = False
            try:
                if isinstance(speech, Speculation):
                    # Decoded at the last pause, and the caller said no more: that is the turn.
                    heard = await speech.wait()
                    prefetched = speech.prefetched
                else:
                    mark("decoding")
                    with stage("stt", self._providers.stt(self.current()[2])):
                        heard = await self._listener.transcribe(speech)
                    mark("decoded")
                    prefetched = None
                if heard.text:
                    self._queue_turn(
                        heard.text,
                        heard_seconds=heard.audio_seconds,
                        span=span,
                        speech_ended_at=ended_at,
                        prefetched=prefetched,
                    )
                    queued = True
                elif prefetched is not None:
                    prefetched.cancel()
            except Exception as exc:  # noqa: BLE001 - any recognizer failure loses that utterance, not the call
                log.warning("call %s: transcription failed: %s", self.call.session_id, exc)
            finally:
                exit_span(entered)
                if span is not None and not queued:
                    span.end()
                self._turn_asked_done()

    def _speculate(self, paused: SpeechPaused, nursery: trio.Nursery) -> None:
        """Decode the utterance so far at a pause; once decoded, ask the model early."""
        if self._speculation is not None:
            self._speculation.cancel()
        listener = self._listener
        assert listener is not None
        speculation = Speculation(len(paused.pcm) / 2 / paused.sample_rate_hz)
        self._speculation = speculation

        def prefetch(text: str) -> PrefetchedReply | None:
            # Only a turn that would start at once is asked for early: not behind another turn.
            if self.busy or not self._accepting or speculation.cancelled:
                return None
            plan = self._plan()
            if isinstance(plan.llm, _Unbuildable):
                return None
            tools = plan.tools() if plan.max_tool_rounds > 0 else ()
            return PrefetchedReply(
                plan.llm, early_messages(plan.instructions(), self.history, text), tools, tts=plan.tts
            )

        recognizer = self._providers.stt(self.current()[2])

        async def transcribe() -> Any:
            # Before any turn exists: this transcription's span is a child of the call.
            mark("decoding")
            with stage("stt", recognizer):
                heard = await listener.transcribe(
                    SpeechEnded(pcm=paused.pcm, sample_rate_hz=paused.sample_rate_hz)
                )
            mark("decoded")
            return heard

        nursery.start_soon(speculation.run, transcribe, prefetch, nursery)

    def _turn_asked_done(self) -> None:
        self._queued -= 1
        if self._queued == 0:
            self._idle.set()

    async def _serve_turns(self) -> None:
        # Turns run one at a time, in the order they were asked for.
        async for text, options in self._turns:
            try:
                await self.take_turn(text, **options)
            finally:
                self._turn_asked_done()

    async def wait_idle(self) -> None:
        """Wait until every turn asked for so far has ended."""
        await self._idle.wait()

    async def _on_event(self, event: TransportEvent, nursery: trio.Nursery) -> None:
        if isinstance(event, UserText):
            if not self._listening:
                # While the transfer target is in the call the agent takes no turns.
                log.info("call %s: typed text ignored during a transfer", self.call.session_id)
                return
            # Typed turns queue behind the running one; only speech barges in.
            self._queue_turn(event.text)
        elif isinstance(event, AudioFrame):
            if self._listener is None or not self._listening:
                return
            # A live stt.language change reaches the recognizer from the next utterance.
            self._listener.use(self._providers.stt(self.current()[2]))
            for heard in self._listener.feed(event.pcm, event.sample_rate_hz):
                if isinstance(heard, SpeechStarted) and self._turn is not None:
                    # The caller talks over the agent: stop its voice and its reply.
                    self.interrupt("barge_in")
                    if self.session is not None:
                        await self.session.clear_audio()
                elif isinstance(heard, SpeechPaused):
                    mark("paused")
                    self._speculate(heard, nursery)
                elif isinstance(heard, SpeechResumed):
                    mark("resumed")
                    if self._speculation is not None:
                        self._speculation.cancel()
                        self._speculation = None
                elif isinstance(heard, SpeechEnded):
                    mark("turn_ended")
                    # Transcribed in order by its own task: the call keeps reading events meanwhile.
                    self._queued += 1
                    self._idle = trio.Event() if self._idle.is_set() else self._idle
                    speculation, self._speculation = self._speculation, None
                    self._speech_send.send_nowait((speculation or heard, time.monotonic()))
        elif isinstance(event, ParticipantJoined) and event.kind == "transfer_target":
            # While the transfer target is in the call the agent neither listens nor speaks.
            self._listening = False
            self.interrupt("transferred")
            if self.session is not None:
                await self.session.clear_audio()
            await self._event("curb.transfer", {"state": "target_joined", "identity": event.identity})
        elif isinstance(event, ParticipantLeft) and event.kind == "transfer_target":
            self._listening = True
            await self._event("curb.transfer", {"state": "agent_resumed", "identity": event.identity})

    async def finish_utterance(self) -> None:
        """Take no new turns; return once the running one (if any) ended.

        An ``ask_host`` still waiting fails at once with HostUnavailableError: the call ends.
        """
        self._accepting = False
        self._release_asks()
        await self._turn_done.wait()

    def _release_asks(self) -> None:
        for waiter in list(self._asks.values()):
            waiter.close()

    # -- Messages ---------------------------------------------------------------------------

    async def deliver(self, sender: Sender, key: str, payload: Any, *, message_id: str | None = None) -> Any:
        """Run the handlers of ``key`` from ``sender``; return the reply (the last handler's).

        Raises:
            NoHandler: Nothing listens for the key from that sender.
            InvalidPayload: A schema refused the payload; no handler ran.
            HandlerFailed: A handler raised; the others still ran.
        """
        handlers = self.agent.handlers_for(key, sender, self.ctx)
        kept, truncated = keep_json(payload)
        event: dict[str, Any] = {"from": sender, "key": key, "id": message_id, "payload": kept}
        if not handlers:
            await self._event("curb.message", {**event, "outcome": "no_handler"})
            raise NoHandler(f"no_handler: nothing handles {key!r} from the {sender}")
        decoded: list[Any] = []
        issues: list[Issue] = []
        for handler in handlers:
            if handler.schema is None:
                decoded.append(payload)
                continue
            try:
                decoded.append(decode(handler.schema, payload))
            except WireError as exc:
                issues.extend(exc.issues)
        if issues:
            await self._event("curb.message", {**event, "outcome": "invalid_payload"})
            summary = "; ".join(f"{'.'.join(map(str, i.path)) or '(payload)'}: {i.message}" for i in issues)
            raise InvalidPayload(
                f"invalid_payload: the payload of {key!r} does not match its schema: {summary}", issues=issues
            )
        reply: Any = None
        failures: list[str] = []
        for handler, value in zip(handlers, decoded, strict=True):
            try:
                reply = await call_maybe_async(handler.fn, self.ctx, value)
            except Exception as exc:  # noqa: BLE001 - an author's handler may raise anything; the sender is told it failed
                log.warning("handler for %r from %s failed: %s", key, sender, exc)
                failures.append(f"{type(exc).__name__}: {exc}")
        if reply is not None:
            try:
                reply = encode(reply)
                # Held to the rules of every body (depth, numbers, Unicode), so a record keeps it.
                parse_json(json.dumps(reply, separators=(",", ":")))
            except (RecursionError, ValueError, TypeError) as exc:
                log.warning(
                    "handler for %r from %s replied with what no record can keep: %s", key, sender, exc
                )
                failures.append(f"its reply is not JSON a record can keep: {type(exc).__name__}: {exc}")
                reply = None
        if failures:
            await self._event("curb.message", {**event, "outcome": "handler_failed", "error": failures[0]})
            raise HandlerFailed(f"handler_failed: a handler of {key!r} raised {failures[0]}")
        kept_reply, reply_truncated = keep_json(reply)
        record = {**event, "outcome": "delivered", "reply": kept_reply}
        if truncated or reply_truncated:
            record["truncated"] = True
        await self._event("curb.message", record)
        return reply

    async def deliver_host(self, message: HostMessage) -> None:
        """A host message: a reply to a waiting ask resolves it; anything else goes to handlers."""
        if message.in_reply_to is not None:
            waiter = self._asks.pop(message.in_reply_to, None)
            if waiter is not None:
                waiter.send_nowait(message.payload)
                await self._event(
                    "curb.message",
                    {
                        "from": "host",
                        "key": message.name,
                        "id": message.id,
                        "inReplyTo": message.in_reply_to,
                        "payload": keep_json(message.payload)[0],
                        "outcome": "reply",
                    },
                )
                return
        await self.deliver("host", message.name, message.payload, message_id=message.id)

    async def handle_client_request(self, method: str, payload: str, caller: str) -> str:
        """The caller's app: ``curb.message`` (``{key, id, payload}`` -> ``{reply}``) and ``curb.update``.

        A refusal raises :class:`ClientRefusal` whose message is the code.
        """
        if len(payload.encode()) > MAX_CLIENT_REQUEST_BYTES:
            raise ClientRefusal("payload_too_large")
        if not self.ready.is_set():
            with trio.move_on_after(CLIENT_WAIT_S):
                await self.ready.wait()
            if not self.ready.is_set():
                raise ClientRefusal("not_adjustable" if method == "curb.update" else "no_handler")
        try:
            body = parse_json(payload)
        except ValueError:
            raise ClientRefusal("invalid_request") from None
        try:
            if method == "curb.update":
                return json.dumps(encode(await self.adjust("client", body)), separators=(",", ":"))
            if method == "curb.message":
                if not isinstance(body, dict) or not isinstance(body.get("key"), str):
                    raise InvalidRequest("curb.message takes {key, id, payload}")
                reply = await self.deliver(
                    "client", body["key"], body.get("payload"), message_id=body.get("id")
                )
                return json.dumps({"reply": reply}, separators=(",", ":"))
        except RunnerError as refusal:
            raise ClientRefusal(refusal.code, _refusal_details(refusal)) from None
        raise ClientRefusal("not_found")

    # -- The link agent code uses (ctx.send, ctx.ask_host, ctx.settings) --------------------

    def _warn_once(self, key: str, reason: str) -> None:
        if (key, reason) not in self._warned:
            self._warned.add((key, reason))
            log.warning("message %r dropped: %s", key, reason)

    def to_client(self, key: str, payload: Mapping[str, Any] | None) -> None:
        check_key(key)
        session = self.session
        reachable = session.client_reachable() if session is not None else "no_app"
        if session is None or reachable != "ok":
            reason = (
                "the call is a phone call (no data channel)"
                if reachable == "phone"
                else "no app is in the room"
            )
            self._warn_once(key, reason)
            self.undelivered_to_client[key] = self.undelivered_to_client.get(key, 0) + 1
            return
        body = dict(payload or {})

        async def send() -> None:
            await session.send_to_client(key, body)
            await self._event("curb.toClient", {"key": key, "payload": keep_json(body)[0]})

        self._queue_send(send)

    def to_host(self, key: str, payload: Mapping[str, Any] | None) -> None:
        check_key(key)
        if not self.host_connected:
            self._warn_once(key, "no host is connected")
            return
        self._host_count += 1
        record = {
            "type": "host",
            "id": f"h-{self._host_count}",
            "name": key,
            **_kept(payload),
            "expectsReply": False,
        }

        async def send() -> None:
            await self._write("host", record)

        self._queue_send(send)

    async def ask_host(self, key: str, payload: Mapping[str, Any] | None, timeout_s: float) -> Any:
        check_key(key)
        if not self.host_connected:
            raise HostUnavailableError("no host is connected to this call")
        self._ask_count += 1
        ask_id = f"a-{self._ask_count}"
        send, receive = trio.open_memory_channel[Any](1)
        self._asks[ask_id] = send
        try:
            await self._write(
                "host", {"type": "host", "id": ask_id, "name": key, **_kept(payload), "expectsReply": True}
            )
            with trio.move_on_after(timeout_s):
                try:
                    return await receive.receive()
                except trio.EndOfChannel:
                    raise HostUnavailableError("the call ended while the agent waited for the host") from None
            raise HostTimeoutError(f"the host did not answer {key!r} within {timeout_s:g} s")
        finally:
            self._asks.pop(ask_id, None)

    def _queue_send(self, send: Callable[[], Awaitable[None]]) -> None:
        self._unsent += 1
        if self._sent.is_set():
            self._sent = trio.Event()
        self._outbox_send.send_nowait(send)

    async def wait_sent(self) -> None:
        """Wait until every message agent code queued so far has been sent (and journaled)."""
        await self._sent.wait()

    async def _serve_outbox(self) -> None:
        # One task sends what agent code queued, so messages leave in the order they were sent.
        async for send in self._outbox:
            try:
                await send()
            except Exception as exc:  # noqa: BLE001 - a message that cannot be sent is logged; the outbox goes on
                log.warning("a message could not be sent: %s", exc)
            finally:
                self._unsent -= 1
                if self._unsent == 0:
                    self._sent.set()

    # -- Records ----------------------------------------------------------------------------

    async def _write(self, cls: str, body: dict[str, Any]) -> None:
        if self.record is not None:
            await self._after_deferred()
            await self.record.write(cls, body)

    async def _event(self, name: str, payload: Mapping[str, Any]) -> None:
        if self.record is not None:
            await self._after_deferred()
            await self.record.event(name, payload)

    async def _write_soon(self, cls: str, body: dict[str, Any]) -> None:
        """Journal a record without waiting for its commit (outside ``run``: waiting).

        The next write waits for it and fails with its error, so the call's records keep
        their order and a failed write is not passed over.
        """
        if self.record is None or self._nursery is None:
            await self._write(cls, body)
            return
        record, before = self.record, self._deferred
        deferred = self._deferred = _Deferred()

        async def write() -> None:
            # Shielded: the person's words are journaled even when the call ends meanwhile
            # (the journal bounds an append: it commits, fails, or is closed).
            with trio.CancelScope(shield=True):
                try:
                    if before is not None:
                        await before.done.wait()
                    await record.write(cls, body)
                except Exception as exc:  # noqa: BLE001 - kept for the next write, which raises it
                    log.error("call %s: a %s record was not journaled: %r", self.call.session_id, cls, exc)
                    deferred.error = exc
                finally:
                    deferred.done.set()

        self._nursery.start_soon(write)
        await trio.lowlevel.checkpoint()

    async def _after_deferred(self) -> None:
        deferred = self._deferred
        if deferred is None:
            return
        await deferred.done.wait()
        if self._deferred is deferred:
            self._deferred = None
        error, deferred.error = deferred.error, None
        if error is not None:
            raise error

    def messages_summary(self) -> dict[str, Any]:
        """The call's ``curb.messages`` payload: what it could not deliver."""
        return {
            "undeliveredToClient": dict(self.undelivered_to_client),
            "refusedQueuedHostMessages": self.refused_queued_host_messages,
        }


@attrs.define(eq=False)
class _Deferred:
    done: trio.Event = attrs.Factory(trio.Event)
    error: Exception | None = None


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


def _tool_call_record(call: Any) -> dict[str, Any]:
    arguments, arguments_cut = keep_json(call.arguments)
    result, result_cut = keep_json(call.result)
    record = {
        "callId": call.call_id,
        "name": call.name,
        "arguments": arguments,
        "result": result,
        "ok": call.ok,
        "error": call.error,
        "ms": call.ms,
        "round": call.round,
    }
    if arguments_cut or result_cut:
        record["truncated"] = True
    return record


def _kept(payload: Mapping[str, Any] | None) -> dict[str, Any]:
    kept, truncated = keep_json(dict(payload or {}))
    return {"payload": kept, "truncated": True} if truncated else {"payload": kept}


def _refusal_details(refusal: RunnerError) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if isinstance(refusal, NotAdjustable):
        details["path"] = refusal.path
    issues = getattr(refusal, "issues", None)
    if issues:
        details["issues"] = [{"path": i.path, "message": i.message} for i in issues]
    return details


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


def without_voice(agent: Agent) -> Agent:
    """A copy of ``agent`` (and its skills) that only writes: nobody hears it, so nothing is synthesized."""
    import copy

    quiet = copy.copy(agent)
    quiet.tts = None
    quiet.skills = [copy.copy(s) for s in agent.skills]
    for skill in quiet.skills:
        skill.tts = None
    return quiet
