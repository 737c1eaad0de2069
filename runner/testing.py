"""Testing an agent: run its turns, then check what it said, which tools it called, what it sent.

In the spirit of livekit-agents' ``AgentSession.run(...).expect``: the agent runs in a real
call of its own (the loopback transport, a journal in a temporary directory, the agent's own
runtime), with its own model or a scripted one, and each turn hands back what it did::

    from runner.testing import ScriptedModel, call, open_agent_test

    async def test_weather() -> None:
        async with open_agent_test(agent) as test:
            turn = await test.say("What is the weather in Lisbon?")
            turn.called("weather", city="Lisbon")
            turn.said("sunny")

    async def test_a_model_that_calls_a_tool() -> None:
        model = ScriptedModel([call("weather", city="Oslo")], "Snow in Oslo.")
        async with open_agent_test(agent, model=model) as test:
            (await test.say("Oslo?")).called("weather", city="Oslo").said("Snow")

    async def test_a_spoken_turn() -> None:  # the agent needs ears: stt=STT(provider="whisper")
        async with open_agent_test(agent) as test:
            turn = await test.speak("What is the weather in Lisbon?")  # or say_audio("ask.wav")
            turn.heard("weather", "Lisbon").called("weather", city="Lisbon")

Tests are Trio tests: install the ``testing`` extra (pytest and pytest-trio); the package's
pytest plugin runs a module's ``async def`` tests on Trio once it uses ``runner.testing``.
Nothing here is mocked but the model you script.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from journal import open_journal

from .agent import TTS, Agent, AgentRuntime, build_tts, choose_experiments, without_voice
from .calls import CallContext, CallRecord
from .providers import ChatMessage, LLMEvent, TextDelta, ToolCall, ToolSpec, Usage
from .pytest_plugin import only_exception
from .transports.loopback import LoopbackCaller, LoopbackSession
from .voice.audio import frames, read_wav
from .voice.events import ToolRecord, TurnResult

__all__ = ["AgentTest", "ScriptedModel", "TurnCheck", "call", "open_agent_test"]

_ids = itertools.count(1)
#: A spoken turn reaches the agent as a microphone's would: 20 ms frames.
_FRAME_MS = 20
#: Quiet before the speech (the detector hears an onset) and after the turn's own end of
#: turn silence (so the turn surely ends within the audio).
_LEAD_MS = 300
_TAIL_MS = 1_000


def call(name: str, /, **arguments: Any) -> ToolCall:
    """A tool call for a :class:`ScriptedModel` to make: ``call("weather", city="Oslo")``."""
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=arguments)


class ScriptedModel:
    """A chat model that plays a script: each model call takes the next reply.

    A reply is text, or a list of text pieces and :func:`call` s (a round that calls tools;
    the tool results go into the next model call, which plays the next reply). When the
    script runs out the model says ``"(the script has no more replies)"``.

    Attributes:
        requests: What each model call was sent: its messages and the tools it was offered.
    """

    provider = "scripted"
    model = "scripted"

    def __init__(self, *replies: str | Sequence[str | ToolCall]) -> None:
        self._replies = [[r] if isinstance(r, str) else list(r) for r in replies]
        self.requests: list[tuple[list[ChatMessage], list[ToolSpec]]] = []

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[LLMEvent, None]:
        self.requests.append((list(messages), list(tools)))
        steps = self._replies.pop(0) if self._replies else ["(the script has no more replies)"]
        for step in steps:
            await trio.lowlevel.checkpoint()
            yield TextDelta(text=step) if isinstance(step, str) else step
        yield Usage(model=self.model, input_tokens=sum(len(m.content) for m in messages), output_tokens=1)


def _matches(expected: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    return all(key in given and given[key] == value for key, value in expected.items())


@attrs.frozen
class TurnCheck:
    """One turn as the agent took it, with checks that raise ``AssertionError`` saying why.

    Each check returns the turn (or the tool call it found), so checks chain.
    """

    result: TurnResult

    @property
    def text(self) -> str:
        """The whole reply, as the caller heard or read it."""
        return self.result.text

    @property
    def transcript(self) -> str | None:
        """What the agent heard in a spoken turn (its recognizer's words); ``None`` when typed."""
        return self.result.heard

    def heard(self, *fragments: str) -> TurnCheck:
        """The turn was spoken and the agent heard each fragment (ignoring case)."""
        if self.result.heard is None:
            raise AssertionError("the turn was typed, not spoken: nothing was heard")
        for fragment in fragments:
            if fragment.lower() not in self.result.heard.lower():
                raise AssertionError(f"the agent did not hear {fragment!r}: it heard {self.result.heard!r}")
        return self

    @property
    def tool_calls(self) -> tuple[ToolRecord, ...]:
        """Every tool call of the turn, in order, with its arguments, result and outcome."""
        return tuple(self.result.tool_calls)

    def said(self, *fragments: str) -> TurnCheck:
        """The reply contains each fragment (ignoring case)."""
        for fragment in fragments:
            if fragment.lower() not in self.text.lower():
                raise AssertionError(f"the reply does not say {fragment!r}: {self.text!r}")
        return self

    def called(self, name: str, /, **arguments: Any) -> ToolRecord:
        """A call of tool ``name`` that ran, with at least these arguments; returns it.

        Arguments are compared as the model sent them (JSON values: an enum as its value, a
        date as its ISO text).
        """
        calls = [c for c in self.tool_calls if c.name == name]
        found = next((c for c in calls if _matches(arguments, c.arguments)), None)
        if found is None:
            made = [f"{c.name}({dict(c.arguments)})" for c in self.tool_calls] or ["none"]
            raise AssertionError(f"no call of {name}({arguments}); the calls were: {', '.join(made)}")
        if not found.ok:
            raise AssertionError(f"{name} was called but failed: {found.error}")
        return found

    def refused(self, name: str, /) -> ToolRecord:
        """A call of tool ``name`` that failed (bad arguments, or the tool raised); returns it."""
        found = next((c for c in self.tool_calls if c.name == name and not c.ok), None)
        if found is None:
            raise AssertionError(f"no failed call of {name}: {[c.name for c in self.tool_calls]}")
        return found

    def called_nothing(self) -> TurnCheck:
        """The turn called no tool."""
        if self.tool_calls:
            raise AssertionError(f"the turn called {[c.name for c in self.tool_calls]}")
        return self


@attrs.define
class AgentTest:
    """An agent in a call of its own; see :func:`open_agent_test`.

    Attributes:
        runtime: The agent's side of the call (``runtime.ctx.state`` is the call's state).
        greeting: The opening turn, when the agent greets; ``None`` when it waits.
        to_client: Every ``ctx.send.to_client`` so far, as ``(key, payload)``.
    """

    runtime: AgentRuntime
    caller: LoopbackCaller
    journal: Any
    session_id: str
    timeout_s: float
    greeting: TurnCheck | None = None
    to_client: list[tuple[str, Any]] = attrs.Factory(list)
    #: Every turn the call finished, in order.
    finished: list[TurnResult] = attrs.Factory(list)

    async def say(self, text: str) -> TurnCheck:
        """Take a turn with the person's words; return it once the reply ended."""
        with trio.fail_after(self.timeout_s):
            result = await self.runtime.take_turn(text)
            # Messages the turn queued leave in order, after it.
            await self.runtime.messages.wait_sent()
        self._collect()
        if result is None:
            raise AssertionError("the call takes no more turns")
        return TurnCheck(result)

    async def say_audio(self, audio: str | os.PathLike[str] | bytes, *, sample_rate_hz: int = 0) -> TurnCheck:
        """Take a turn with the person's voice; return it once the reply ended.

        The audio reaches the call as a caller's microphone would (20 ms frames into the call's
        transport, with a little quiet before it and the end-of-turn quiet after it), and goes
        the way of every call's audio: the agent's voice activity detection, its recognizer,
        then the turn. Check what it heard with :meth:`TurnCheck.heard`.

        Args:
            audio: A 16-bit PCM WAV file (any rate, channels mixed down), or 16-bit mono PCM.
            sample_rate_hz: The rate of ``audio`` given as PCM.

        Raises:
            AssertionError: The audio gave no turn (no speech detected, or no words in it), or
                more than one.
            ValueError: The agent has no recognizer (``stt``), or the audio is not 16-bit PCM.
        """
        if isinstance(audio, bytes):
            if sample_rate_hz <= 0:
                raise ValueError("audio given as PCM needs its sample_rate_hz")
            pcm, rate = audio, sample_rate_hz
        else:
            pcm, rate = read_wav(audio)
        return await self._hear(pcm, rate)

    async def speak(self, text: str, *, voice: TTS | None = None) -> TurnCheck:
        """Take a turn with ``text`` spoken: rendered by a voice (the embedded ``hibari`` by
        default), then heard as :meth:`say_audio` hears a recording."""
        tts = build_tts(voice or TTS(provider="hibari"))
        with trio.fail_after(self.timeout_s):
            pcm = b"".join([piece async for piece in tts.synthesize(text)])
        return await self._hear(pcm, tts.sample_rate_hz)

    async def press(self, digits: str) -> list[TurnCheck]:
        """Press keys on the caller's phone (DTMF), as a phone caller would: each reaches the
        agent's ``@agent.on_dtmf`` handlers in turn. Returns the turns they made it take (what
        the handlers returned, said as written), once they ended; ``[]`` when none spoke."""
        seen = len(self.finished)
        self.caller.press(digits)
        with trio.fail_after(self.timeout_s):
            while self.caller.unread:  # noqa: ASYNC110 - nothing to wait on; bounded by fail_after
                await trio.sleep(0.005)
            await self.runtime.wait_idle()
            await self.runtime.messages.wait_sent()
        self._collect()
        return [TurnCheck(turn) for turn in self.finished[seen:]]

    async def _hear(self, pcm: bytes, rate: int) -> TurnCheck:
        if self.runtime.current()[2] is None:
            raise ValueError(
                f'agent {self.runtime.agent.name!r} has no ears: give it a recognizer (stt=STT(provider="whisper")) '
                "to test a spoken turn"
            )
        turn = self.runtime.agent.turn_taking
        longest = turn.max_silence_ms if turn.detection == "smart_turn" else turn.silence_ms
        quiet_ms = _LEAD_MS, longest + _TAIL_MS
        lead, tail = (bytes(int(rate * ms / 1000) * 2) for ms in quiet_ms)
        seen = len(self.finished)
        with trio.fail_after(self.timeout_s):
            for frame in frames(lead + pcm + tail, rate, _FRAME_MS):
                self.caller.send_audio(frame, rate)
                await trio.lowlevel.checkpoint()
            # Every frame taken (the turn, if any, has ended within them and is queued), then
            # the turn and what it sends. A channel tells nobody when it drains: polled.
            while self.caller.unread:  # noqa: ASYNC110 - nothing to wait on; bounded by fail_after
                await trio.sleep(0.005)
            await self.runtime.wait_idle()
            await self.runtime.messages.wait_sent()
        self._collect()
        turns = self.finished[seen:]
        if len(turns) != 1:
            heard = [t.heard for t in turns]
            raise AssertionError(
                "the audio gave no turn: no speech was detected in it, or no words were heard"
                if not turns
                else f"the audio gave {len(turns)} turns, not one: {heard}"
            )
        return TurnCheck(turns[0])

    async def message(
        self, key: str, payload: Any = None, *, sender: Literal["client", "host"] = "client"
    ) -> Any:
        """Send a keyed message as the caller's app (or the host); return the handlers' reply.

        Raises:
            RunnerError: The refusal a real sender would get (``NoHandler``, ``InvalidPayload``,
                ``HandlerFailed``).
        """
        with trio.fail_after(self.timeout_s):
            reply = await self.runtime.messages.deliver(sender, key, payload)
            await self.runtime.messages.wait_sent()
        self._collect()
        return reply

    async def to_host(self) -> list[tuple[str, Any]]:
        """Every ``ctx.send.to_host`` and ``ctx.ask_host`` so far, as ``(key, payload)``."""
        records = await self.journal.read(0, producer=self.session_id)
        return [(r.body["name"], r.body.get("payload")) for r in records if r.cls == "host"]

    async def records(self) -> list[dict[str, Any]]:
        """The call's journal records so far, as a host reads them (bodies, in order)."""
        return [dict(r.body) for r in await self.journal.read(0, producer=self.session_id)]

    def _collect(self) -> None:
        while True:
            try:
                sent = self.caller.to_client.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            self.to_client.append((sent["key"], sent["payload"]))


@asynccontextmanager
async def open_agent_test(
    agent: Agent,
    *,
    model: Any = None,
    client: Mapping[str, str] | None = None,
    session_id: str = "test",
    speech: bool = False,
    timeout_s: float = 30.0,
) -> AsyncIterator[AgentTest]:
    """Start ``agent`` in a call of its own; the call ends when the block does.

    Args:
        agent: The agent under test.
        model: A chat model to use instead of the agent's (a :class:`ScriptedModel`);
            ``None``: the agent's own.
        client: The call's client context (``ctx.client``).
        session_id: The call's id (experiment variants follow from it).
        speech: Synthesize the replies' speech too (slower); by default the call is text only.
        timeout_s: How long a turn or a message may take before the test fails.
    """
    try:
        async with _open_call(
            agent, model=model, client=client, session_id=session_id, speech=speech, timeout_s=timeout_s
        ) as test:
            yield test
    except BaseExceptionGroup as group:
        # The call's nurseries wrap what the test's own block raised: a failed check reads
        # as itself, not as a group of one. A group of several stays a group.
        raise only_exception(group) from None


@asynccontextmanager
async def _open_call(
    agent: Agent,
    *,
    model: Any,
    client: Mapping[str, str] | None,
    session_id: str,
    speech: bool,
    timeout_s: float,
) -> AsyncIterator[AgentTest]:
    if not speech:
        agent = without_voice(agent)
    context = dict(client or {})
    call_context = CallContext(
        session_id=session_id,
        direction="inbound",
        client=context,
        experiments=choose_experiments(agent, session_id, context, None),
    )
    with tempfile.TemporaryDirectory(prefix="agent-test-") as directory:
        async with open_journal(Path(directory) / "journal.db") as journal:
            runtime = AgentRuntime(
                agent, call_context, CallRecord(journal, session_id), host_connected=True, model=model
            )
            session = LoopbackSession("app")
            test = AgentTest(
                runtime=runtime,
                caller=LoopbackCaller(session),
                journal=journal,
                session_id=session_id,
                timeout_s=timeout_s,
            )
            finished = test.finished

            async def keep(event: Any) -> None:
                if hasattr(event, "result") and isinstance(event.result, TurnResult):
                    finished.append(event.result)

            runtime.add_listener(keep)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runtime.run, session, session.events)
                nursery.start_soon(_drain_audio, test.caller)
                with trio.fail_after(timeout_s):
                    await runtime.ready.wait()
                    await runtime.wait_idle()  # the greeting, if any
                    await runtime.messages.wait_sent()
                test.greeting = TurnCheck(finished[0]) if finished else None
                test._collect()
                try:
                    yield test
                finally:
                    nursery.cancel_scope.cancel()


async def _drain_audio(caller: LoopbackCaller) -> None:
    async for _ in caller.audio:
        pass
