"""The turn engine on its own: a :class:`Turn` driven by a scripted model.

The scripted model stands in for a remote chat model (it speaks the ``LLM`` protocol and
nothing else); speech is real espeak-ng, except where a failing remote voice is the point.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import attrs
import pytest
import trio

from runner.providers import ChatMessage, LLMEvent, ProviderError, TextDelta, ToolCall, ToolSpec, Usage
from runner.providers.espeak import EspeakTTS
from runner.voice.engine import ToolOutcome, Turn, TurnPlan
from runner.voice.events import (
    AudioData,
    AudioEnd,
    AudioStart,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    ToolEnded,
    ToolStarted,
    TurnEvent,
    TurnFinished,
    TurnResult,
    TurnStarted,
    UsageReported,
)

FOREVER = object()


class ScriptedLLM:
    """A stand-in for a remote chat model: each ``stream`` call plays the next scripted round.

    A round is a list of steps: ``str`` (a text delta), a ``ToolCall``, a ``trio.Event`` (wait
    for it), ``FOREVER`` (stall), or an exception (raised mid-stream). ``Usage`` ends a round.
    """

    provider = "scripted"
    model = "scripted-1"

    def __init__(self, *rounds: Sequence[Any]) -> None:
        self._rounds = [list(r) for r in rounds]
        self.requests: list[tuple[list[ChatMessage], list[ToolSpec]]] = []
        self.closed = 0
        self.finished = 0

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[LLMEvent, None]:
        self.requests.append((list(messages), list(tools)))
        steps = self._rounds.pop(0) if self._rounds else ["(no more script)"]
        try:
            for step in steps:
                await trio.lowlevel.checkpoint()
                if isinstance(step, trio.Event):
                    await step.wait()
                elif step is FOREVER:
                    await trio.sleep_forever()
                elif isinstance(step, BaseException):
                    raise step
                elif isinstance(step, str):
                    yield TextDelta(text=step)
                else:
                    yield step
            yield Usage(model=self.model, input_tokens=len(messages), output_tokens=len(steps))
            self.finished += 1
        finally:
            self.closed += 1


class FakeRemoteTTS:
    """A stand-in for a remote speech service: fails on texts containing ``fail_on``.

    ``after_bytes`` > 0 makes it fail mid-stream, after that much audio.
    """

    provider = "remote"
    voice = "v1"
    sample_rate_hz = 16_000

    def __init__(self, fail_on: str, *, after_bytes: int = 0) -> None:
        self.fail_on = fail_on
        self.after_bytes = after_bytes
        self.texts: list[str] = []

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        self.texts.append(text)
        sent = 0
        for _ in range(5):
            await trio.lowlevel.checkpoint()
            if self.fail_on in text and sent >= self.after_bytes:
                raise ProviderError("provider_failed", "the speech service answered HTTP 503")
            chunk = b"\x10\x00" * 320
            sent += len(chunk)
            yield chunk


class Recorder:
    """The turn's ``emit``: keeps every event (and yields, as a real transport would)."""

    def __init__(self) -> None:
        self.events: list[TurnEvent] = []
        self.hooks: list[Any] = []

    async def __call__(self, event: TurnEvent) -> None:
        self.events.append(event)
        for hook in self.hooks:
            hook(event)
        await trio.lowlevel.checkpoint()

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def index(self, predicate: Any) -> int:
        return next(i for i, e in enumerate(self.events) if predicate(e))


async def _no_tool(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(ok=False, error="no tools here")


def _plan(
    llm: Any, tts: Any, *, tools: Sequence[ToolSpec] = (), run_tool: Any = _no_tool, max_tool_rounds: int = 4
) -> TurnPlan:
    return TurnPlan(
        llm=llm,
        tts=tts,
        instructions=lambda: "You are a test.",
        tools=lambda: list(tools),
        run_tool=run_tool,
        max_tool_rounds=max_tool_rounds,
    )


async def _run(turn: Turn, user: str | None = "Hi.", *, seconds: float = 10) -> TurnResult:
    with trio.fail_after(seconds):
        return await turn.run(user)


# -- the order of a turn (seed 002): a round's text chunks, then its usage, then its tools ------


async def test_every_text_chunk_of_a_round_is_reported_before_its_usage() -> None:
    # The last piece has no full stop: only the end of the round cuts it. A tool round, then
    # the answer; the voice is real, so a chunk's text cannot wait behind earlier audio.
    llm = ScriptedLLM(
        ["One moment. Let me look", ToolCall(id="c1", name="look", arguments={})],
        ["It is sunny. Enjoy the walk"],
    )
    emit = Recorder()

    async def look(call: ToolCall) -> ToolOutcome:
        return ToolOutcome(ok=True, result="sunny")

    spec = ToolSpec(name="look", description="Look outside.", parameters={"type": "object"})
    turn = Turn(_plan(llm, EspeakTTS("en-us"), tools=[spec], run_tool=look), [], emit)

    result = await _run(turn)

    assert not result.interrupted
    assert [c.text for c in emit.of(ReplyChunk)] == [
        "One moment.",
        "Let me look",
        "It is sunny.",
        "Enjoy the walk",
    ]
    usages = [i for i, e in enumerate(emit.events) if isinstance(e, UsageReported)]
    tool_start = emit.index(lambda e: isinstance(e, ToolStarted))
    chunks = {e.text: i for i, e in enumerate(emit.events) if isinstance(e, ReplyChunk)}
    assert len(usages) == 2
    assert chunks["One moment."] < chunks["Let me look"] < usages[0] < tool_start
    assert tool_start < chunks["It is sunny."] < chunks["Enjoy the walk"] < usages[1]


# -- streaming: speak the first sentence while the model still writes --------------------------


async def test_the_first_sentence_is_audio_before_the_model_writes_the_next() -> None:
    first_audio = trio.Event()
    # The model will not write its second sentence until the first one has been heard: an
    # engine that waited for the whole reply before speaking would stall here forever.
    llm = ScriptedLLM(
        ["Hello there, my friend. ", first_audio, "The second sentence is a little longer. ", "And a third."]
    )
    emit = Recorder()
    emit.hooks.append(lambda e: first_audio.set() if isinstance(e, AudioData) and e.chunk == 0 else None)
    turn = Turn(_plan(llm, EspeakTTS("en-us")), [], emit)

    result = await _run(turn)

    assert not result.interrupted and result.error_code is None
    assert result.text == "Hello there, my friend. The second sentence is a little longer. And a third."
    first_audio_at = emit.index(lambda e: isinstance(e, AudioData) and e.chunk == 0)
    second_text_at = emit.index(lambda e: isinstance(e, ReplyDelta) and e.text.startswith("The second"))
    assert first_audio_at < second_text_at
    assert [(c.chunk, c.text) for c in emit.of(ReplyChunk)] == [
        (0, "Hello there, my friend."),
        (1, "The second sentence is a little longer."),
        (2, "And a third."),
    ]
    assert [(s.chunk, s.sample_rate_hz) for s in emit.of(AudioStart)] == [
        (0, 22_050),
        (1, 22_050),
        (2, 22_050),
    ]
    ends = emit.of(AudioEnd)
    assert [e.chunk for e in ends] == [0, 1, 2]
    for end in ends:
        pcm = b"".join(d.pcm for d in emit.of(AudioData) if d.chunk == end.chunk)
        assert end.bytes == len(pcm) > 0
        assert math.isclose(end.audio_seconds, len(pcm) / 2 / 22_050)
    assert result.chunks_spoken == 3
    assert isinstance(emit.events[0], TurnStarted) and isinstance(emit.events[-1], TurnFinished)
    assert emit.events[-1].result == result
    assert (
        [u.usage for u in emit.of(UsageReported)]
        == list(result.usage)
        == [Usage(model="scripted-1", input_tokens=2, output_tokens=4)]
    )
    timings = result.timings
    assert timings.model_first_text_ms is not None and timings.first_audio_sent_ms is not None
    assert 0 <= timings.model_first_text_ms <= timings.first_audio_sent_ms <= timings.total_ms


async def test_a_reply_goes_into_the_history_with_the_users_words() -> None:
    history: list[ChatMessage] = [
        ChatMessage(role="user", content="Earlier."),
        ChatMessage(role="assistant", content="Before."),
    ]
    llm = ScriptedLLM(["Sure thing, here it is."])
    turn = Turn(_plan(llm, None), history, Recorder())
    await _run(turn, "Now please.")
    sent, _ = llm.requests[0]
    assert [(m.role, m.content) for m in sent] == [
        ("system", "You are a test."),
        ("user", "Earlier."),
        ("assistant", "Before."),
        ("user", "Now please."),
    ]
    assert [(m.role, m.content) for m in history[-2:]] == [
        ("user", "Now please."),
        ("assistant", "Sure thing, here it is."),
    ]


# -- cancel, mute ---------------------------------------------------------------------------------


async def test_cancel_mid_reply_ends_interrupted_with_the_text_so_far() -> None:
    llm = ScriptedLLM(["This part was already said. ", "And this ", FOREVER, "never comes."])
    emit = Recorder()
    history: list[ChatMessage] = []
    turn = Turn(_plan(llm, EspeakTTS("en-us")), history, emit)
    emit.hooks.append(lambda e: turn.cancel("barge_in") if isinstance(e, AudioEnd) and e.chunk == 0 else None)

    result = await _run(turn)

    assert result.interrupted is True
    assert result.reason == "barge_in"
    assert result.error_code is None
    assert result.text == "This part was already said. And this "
    assert result.chunks_spoken == 1
    assert result.usage == ()
    assert llm.closed == 1 and llm.finished == 0  # the model's stream was closed, not left open
    assert [e for e in emit.events if isinstance(e, TurnFinished)] == [emit.events[-1]]
    assert history[-1] == ChatMessage(role="assistant", content="This part was already said. And this ")


async def test_cancel_while_speaking_stops_the_audio_and_closes_it() -> None:
    llm = ScriptedLLM(["A first sentence that takes a while to say, with many words in it. ", FOREVER])
    emit = Recorder()
    turn = Turn(_plan(llm, EspeakTTS("en-us")), [], emit)
    emit.hooks.append(
        lambda e: turn.cancel("barge_in") if isinstance(e, AudioData) and e.chunk == 0 else None
    )

    result = await _run(turn)

    assert result.interrupted and result.reason == "barge_in"
    data = emit.of(AudioData)
    # Whole sentence would be dozens of chunks: the cancel lands at the next checkpoint.
    assert 1 <= len(data) <= 2
    (end,) = emit.of(AudioEnd)
    assert end.bytes == sum(len(d.pcm) for d in data)
    assert emit.index(lambda e: isinstance(e, AudioEnd)) < len(emit.events) - 1


async def test_mute_stops_speech_but_the_turn_finishes_with_muted_last() -> None:
    text = ["The first sentence is spoken. ", "The second one is only written. ", "So is the third."]
    full = await _full_speech_chunks(text[0].strip())
    llm = ScriptedLLM(text)
    emit = Recorder()
    turn = Turn(_plan(llm, EspeakTTS("en-us")), [], emit)
    muted_at: list[int] = []

    def mute_on_first_audio(event: TurnEvent) -> None:
        if isinstance(event, AudioData) and not muted_at:
            muted_at.append(len(emit.events) - 1)
            turn.mute()

    emit.hooks.append(mute_on_first_audio)
    result = await _run(turn)

    assert not result.interrupted and result.reason is None
    assert result.text == "".join(text)
    assert [c.chunk for c in emit.of(ReplyChunk)] == [0, 1, 2]
    assert [s.chunk for s in emit.of(AudioStart)] == [0]
    after_mute = [e for e in emit.events[muted_at[0] + 1 :] if isinstance(e, AudioData)]
    # The voice stops at the next piece of audio: the rest of the sentence is never sent.
    assert after_mute == [] and full > 2
    last_end = max(i for i, e in enumerate(emit.events) if isinstance(e, AudioEnd))
    muted = [i for i, e in enumerate(emit.events) if isinstance(e, Muted)]
    assert len(muted) == 1 and muted[0] > last_end
    assert isinstance(emit.events[-1], TurnFinished) and muted[0] == len(emit.events) - 2
    assert result.chunks_spoken == 1


async def _full_speech_chunks(sentence: str) -> int:
    return len([c async for c in EspeakTTS("en-us").synthesize(sentence)])


# -- failures -------------------------------------------------------------------------------------


async def test_a_voice_that_fails_gives_speech_failed_and_the_text_turn_carries_on() -> None:
    tts = FakeRemoteTTS(fail_on="broken")
    llm = ScriptedLLM(["This sentence is broken. ", "This one is fine to say."])
    emit = Recorder()
    result = await _run(Turn(_plan(llm, tts), [], emit))

    assert not result.interrupted and result.error_code is None
    assert result.text == "This sentence is broken. This one is fine to say."
    (failed,) = emit.of(SpeechFailed)
    assert (failed.chunk, failed.code) == (0, "provider_failed")
    assert "503" in failed.message
    assert [s.chunk for s in emit.of(AudioStart)] == [1]
    assert {d.chunk for d in emit.of(AudioData)} == {1}
    assert result.chunks_spoken == 1
    assert tts.texts == ["This sentence is broken.", "This one is fine to say."]


async def test_a_voice_that_fails_mid_sentence_closes_its_audio() -> None:
    tts = FakeRemoteTTS(fail_on="broken", after_bytes=1280)
    llm = ScriptedLLM(["This sentence is broken. ", "This one is fine to say."])
    emit = Recorder()
    result = await _run(Turn(_plan(llm, tts), [], emit))

    assert not result.interrupted
    (failed,) = emit.of(SpeechFailed)
    assert failed.chunk == 0
    assert [(e.chunk, e.bytes) for e in emit.of(AudioEnd)] == [(0, 1280), (1, 3200)]
    assert result.chunks_spoken == 2


async def test_a_model_that_fails_mid_reply_ends_interrupted_with_its_code() -> None:
    llm = ScriptedLLM(
        ["Half a reply. ", ProviderError("provider_failed", "OpenAI cut the connection (ReadError)")]
    )
    emit = Recorder()
    result = await _run(Turn(_plan(llm, None), [], emit))

    assert result.interrupted
    assert result.error_code == "provider_failed"
    assert result.reason is not None and result.reason.startswith("provider_failed")
    assert result.text == "Half a reply. "
    assert [c.text for c in emit.of(ReplyChunk)] == ["Half a reply."]
    assert isinstance(emit.events[-1], TurnFinished)


# -- tools ----------------------------------------------------------------------------------------

LOOKUP = ToolSpec(
    name="lookup",
    description="Look something up.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}},
)


async def test_tool_rounds_run_tools_and_feed_results_back() -> None:
    call = ToolCall(id="c1", name="lookup", arguments={"q": "opening hours"})
    llm = ScriptedLLM([call], ["We open at nine."])
    ran: list[ToolCall] = []

    async def run_tool(c: ToolCall) -> ToolOutcome:
        ran.append(c)
        return ToolOutcome(ok=True, result={"opens": "09:00"})

    emit = Recorder()
    result = await _run(Turn(_plan(llm, None, tools=[LOOKUP], run_tool=run_tool), [], emit))

    assert ran == [call]
    assert result.text == "We open at nine."
    (record,) = result.tool_calls
    assert (record.call_id, record.name, record.arguments, record.result, record.ok, record.round) == (
        "c1",
        "lookup",
        {"q": "opening hours"},
        {"opens": "09:00"},
        True,
        0,
    )
    assert [(e.name, e.arguments) for e in emit.of(ToolStarted)] == [("lookup", {"q": "opening hours"})]
    assert [(e.name, e.ok, e.result) for e in emit.of(ToolEnded)] == [("lookup", True, {"opens": "09:00"})]
    second, tools = llm.requests[1]
    assert [m.role for m in second] == ["system", "user", "assistant", "tool"]
    assert second[-1] == ChatMessage(role="tool", content='{"opens": "09:00"}', tool_call_id="c1")
    assert [t.name for t in tools] == ["lookup"]


async def test_a_tools_filler_line_is_said_while_it_runs() -> None:
    call = ToolCall(id="c1", name="lookup", arguments={"q": "opening hours"})
    # The model says something, then calls the tool before finishing a sentence.
    llm = ScriptedLLM(["Right", call], ["We open at nine."])
    filler_heard = trio.Event()
    emit = Recorder()
    emit.hooks.append(lambda e: filler_heard.set() if isinstance(e, AudioData) and e.chunk == 1 else None)

    async def run_tool(c: ToolCall) -> ToolOutcome:
        # The tool finishes only once the filler is being heard: said while it runs, not after.
        await filler_heard.wait()
        return ToolOutcome(ok=True, result={"opens": "09:00"})

    plan = attrs.evolve(
        _plan(llm, EspeakTTS("en-us"), tools=[LOOKUP], run_tool=run_tool),
        filler=lambda c: "One moment, let me look." if c.name == "lookup" else None,
    )
    result = await _run(Turn(plan, [], emit))

    assert result.text == "Right One moment, let me look. We open at nine."
    assert [(c.chunk, c.text) for c in emit.of(ReplyChunk)] == [
        (0, "Right"),
        (1, "One moment, let me look."),
        (2, "We open at nine."),
    ]
    started = emit.index(lambda e: isinstance(e, ToolStarted))
    filler_chunk = emit.index(lambda e: isinstance(e, ReplyChunk) and e.chunk == 1)
    ended = emit.index(lambda e: isinstance(e, ToolEnded))
    assert started < filler_chunk < ended
    assert "".join(d.text for d in emit.of(ReplyDelta)) == result.text
    assert result.chunks_spoken == 3
    # The model's own history keeps its words and the tool's result; the line is in the reply.
    second, _ = llm.requests[1]
    assert [m.role for m in second] == ["system", "user", "assistant", "tool"]


async def test_two_tool_rounds_then_an_answer() -> None:
    llm = ScriptedLLM(
        [ToolCall(id="c1", name="lookup", arguments={"q": "hotel"})],
        [ToolCall(id="c2", name="lookup", arguments={"q": "hotel address"})],
        ["It is at the harbour."],
    )
    ran: list[str] = []

    async def run_tool(c: ToolCall) -> ToolOutcome:
        ran.append(c.id)
        return ToolOutcome(ok=True, result=f"result of {c.id}")

    result = await _run(Turn(_plan(llm, None, tools=[LOOKUP], run_tool=run_tool), [], Recorder()))

    assert ran == ["c1", "c2"]
    assert [(c.call_id, c.round) for c in result.tool_calls] == [("c1", 0), ("c2", 1)]
    assert result.text == "It is at the harbour."
    assert not result.interrupted


@pytest.mark.parametrize("max_rounds", [0, 1, 3])
async def test_max_tool_rounds_bounds_the_tool_calls_a_model_can_make(max_rounds: int) -> None:
    # A model that asks for the tool every time it is called, even when offered none.
    rounds = [[ToolCall(id=f"c{i}", name="lookup", arguments={"q": str(i)})] for i in range(max_rounds + 3)]
    llm = ScriptedLLM(*rounds)
    ran: list[str] = []

    async def run_tool(c: ToolCall) -> ToolOutcome:
        ran.append(c.id)
        return ToolOutcome(ok=True, result="ok")

    result = await _run(
        Turn(_plan(llm, None, tools=[LOOKUP], run_tool=run_tool, max_tool_rounds=max_rounds), [], Recorder())
    )

    assert [len(tools) for _, tools in llm.requests] == [1] * max_rounds + [0]
    assert len(ran) <= max_rounds
    assert len(result.tool_calls) <= max_rounds
    assert all(c.round < max_rounds for c in result.tool_calls)
