"""The deterministic local model's thinking summaries: one fixed sentence naming the rule it
followed, before its reply, only when asked."""

from __future__ import annotations

from runner.providers import (
    ChatMessage,
    LocalLLM,
    TextDelta,
    ThoughtDelta,
    ToolCall,
    ToolSpec,
    Usage,
    reports_thoughts,
)

WEATHER = ToolSpec(
    name="weather",
    description="Tell the weather forecast for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SYSTEM = ChatMessage(role="system", content="Breakfast is served from seven to eleven. Checkout is at noon.")


async def _events(
    messages: list[ChatMessage], tools: tuple[ToolSpec, ...] = (), **options: bool
) -> list[object]:
    return [event async for event in LocalLLM().stream(messages, tools, **options)]


async def test_a_tool_match_is_explained_before_the_call() -> None:
    events = await _events(
        [SYSTEM, ChatMessage(role="user", content="What is the weather in Oslo?")], (WEATHER,), thoughts=True
    )
    assert events[0] == ThoughtDelta(text="Looking at the tools: weather matches 'weather'.")
    assert isinstance(events[1], ToolCall) and events[1].arguments == {"city": "Oslo"}
    assert isinstance(events[-1], Usage) and events[-1].thought_tokens == 7


async def test_an_answer_is_explained_and_the_text_is_unchanged() -> None:
    messages = [SYSTEM, ChatMessage(role="user", content="When is checkout?")]
    asked = await _events(messages, (WEATHER,), thoughts=True)
    plain = await _events(messages, (WEATHER,))
    assert asked[0] == ThoughtDelta(
        text="Looking at the tools: none matches. The instructions speak of 'checkout': I answer with that sentence."
    )
    assert [e for e in asked if isinstance(e, TextDelta)] == [e for e in plain if isinstance(e, TextDelta)]
    assert "".join(e.text for e in plain if isinstance(e, TextDelta)) == "Checkout is at noon."
    assert not any(isinstance(e, ThoughtDelta) for e in plain)
    assert isinstance(plain[-1], Usage) and plain[-1].thought_tokens == 0


async def test_greeting_and_fallback_thoughts() -> None:
    greeting = await _events([SYSTEM], thoughts=True)
    assert greeting[0] == ThoughtDelta(text="No one has spoken yet: I open with a greeting.")
    echo = await _events([SYSTEM, ChatMessage(role="user", content="Zebras gallop.")], thoughts=True)
    assert echo[0] == ThoughtDelta(text="Nothing in the instructions matches: I say back what I heard.")


def test_the_local_model_reports_thoughts() -> None:
    assert reports_thoughts(LocalLLM())
    assert LocalLLM().decide([SYSTEM]) == "Hello! How can I help you today?"
