"""Thinking summaries through the turn engine: reported as ``Thought``, in order, and never
part of the reply, the history or what is spoken."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

import trio
from test_engine import Recorder, ScriptedLLM

from runner.providers import (
    ChatMessage,
    LLMEvent,
    LocalLLM,
    TextDelta,
    ThoughtDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from runner.voice.engine import ToolOutcome, Turn, TurnPlan
from runner.voice.events import ReplyChunk, ReplyDelta, Thought, UsageReported

WEATHER = ToolSpec(
    name="weather",
    description="Tell the weather forecast for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class ThinkingLLM:
    """Reports thoughts: yields them (when asked) before its text; records what it was asked."""

    provider = "thinking"
    model = "thinking-1"
    reports_thoughts = True

    def __init__(self) -> None:
        self.asked: list[bool] = []

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (), *, thoughts: bool = False
    ) -> AsyncGenerator[LLMEvent, None]:
        self.asked.append(thoughts)
        await trio.lowlevel.checkpoint()
        if thoughts:
            yield ThoughtDelta(text="They greet me, ")
            yield ThoughtDelta(text="so I greet back.")
        yield TextDelta(text="Hello there.")
        yield Usage(model=self.model, thought_tokens=7 if thoughts else 0)


async def _no_tool(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(ok=True, result="Sunny in Lisbon.")


def _plan(llm: object, tools: Sequence[ToolSpec] = ()) -> TurnPlan:
    return TurnPlan(
        llm=llm,
        tts=None,
        instructions=lambda: "You are a test.",
        tools=lambda: list(tools),
        run_tool=_no_tool,
    )


async def test_thoughts_come_before_the_text_and_are_not_the_reply() -> None:
    llm = ThinkingLLM()
    history: list[ChatMessage] = []
    recorder = Recorder()
    with trio.fail_after(10):
        result = await Turn(_plan(llm), history, recorder).run("Hi.", thoughts=True)
    assert llm.asked == [True]
    assert [e.text for e in recorder.of(Thought)] == ["They greet me, ", "so I greet back."]
    first_text = recorder.index(lambda e: isinstance(e, ReplyDelta))
    assert all(recorder.events.index(t) < first_text for t in recorder.of(Thought))
    assert result.text == "Hello there."
    assert [c.text for c in recorder.of(ReplyChunk)] == ["Hello there."]
    assert history == [
        ChatMessage(role="user", content="Hi."),
        ChatMessage(role="assistant", content="Hello there."),
    ]
    assert recorder.of(UsageReported)[0].usage.thought_tokens == 7


async def test_no_thoughts_unless_the_turn_asks() -> None:
    llm = ThinkingLLM()
    recorder = Recorder()
    with trio.fail_after(10):
        result = await Turn(_plan(llm), [], recorder).run("Hi.")
    assert llm.asked == [False]
    assert recorder.of(Thought) == []
    assert result.text == "Hello there."


async def test_a_provider_without_thoughts_is_called_as_before() -> None:
    # ScriptedLLM's stream takes no ``thoughts`` keyword: passing one would fail the turn.
    llm = ScriptedLLM(["Plain answer."])
    recorder = Recorder()
    with trio.fail_after(10):
        result = await Turn(_plan(llm), [], recorder).run("Hi.", thoughts=True)
    assert not result.interrupted
    assert result.text == "Plain answer."
    assert recorder.of(Thought) == []


async def test_local_model_thoughts_through_tool_rounds() -> None:
    recorder = Recorder()
    history: list[ChatMessage] = []
    with trio.fail_after(10):
        result = await Turn(_plan(LocalLLM(), (WEATHER,)), history, recorder).run(
            "What is the weather in Lisbon?", thoughts=True
        )
    assert [e.text for e in recorder.of(Thought)] == [
        "Looking at the tools: weather matches 'weather'.",
        "The tool results are in: I pass them on.",
    ]
    assert result.text == "Sunny in Lisbon."
    assert all("Looking at the tools" not in m.content for m in history)
