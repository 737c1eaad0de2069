"""The deterministic local model, the ``make_llm`` registry and the package's public names."""

from __future__ import annotations

import types

import pytest
import trio

import runner.providers as providers
from runner.providers import (
    ChatMessage,
    ChatModel,
    LLMEvent,
    LocalLLM,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    make_llm,
)
from runner.providers.local import FIXED_GREETING

INSTRUCTIONS = (
    "Hello, this is Acme Cycles. "
    "Our opening hours are 9 to 5 on weekdays. "
    "We sell bicycles and spare parts. "
    "Keep answers short."
)
SYSTEM = ChatMessage(role="system", content=INSTRUCTIONS)
WEATHER = ToolSpec(
    name="get_weather",
    description="Look up the current weather forecast for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
)
ORDER = ToolSpec(
    name="track-order",
    description="Find where a customer's parcel is.",
    parameters={
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
)
TOOLS = (WEATHER, ORDER)


async def collect(
    llm: ChatModel, messages: list[ChatMessage], tools: tuple[ToolSpec, ...] = TOOLS
) -> list[LLMEvent]:
    return [event async for event in llm.stream(messages, tools)]


def text_of(events: list[LLMEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def user(text: str) -> list[ChatMessage]:
    return [SYSTEM, ChatMessage(role="user", content=text)]


async def test_is_an_llm_named_as_local() -> None:
    llm = LocalLLM()
    assert isinstance(llm, ChatModel)
    assert (llm.provider, llm.model) == ("local", "local")
    assert "not a language model" in (LocalLLM.__doc__ or "")


async def test_greets_with_the_first_sentence_of_the_instructions() -> None:
    events = await collect(LocalLLM(), [SYSTEM])
    assert text_of(events) == "Hello, this is Acme Cycles."
    assert events[-1] == Usage(model="local", input_tokens=len(INSTRUCTIONS.split()), output_tokens=5)


async def test_greets_with_a_fixed_greeting_when_the_instructions_do_not_open_with_one() -> None:
    system = ChatMessage(role="system", content="You are a support agent. Be kind.")
    assert text_of(await collect(LocalLLM(), [system])) == FIXED_GREETING
    assert text_of(await collect(LocalLLM(), [])) == FIXED_GREETING
    history = ChatMessage(role="system", content="History buffs welcome. Be kind.")
    assert text_of(await collect(LocalLLM(), [history])) == FIXED_GREETING
    short = ChatMessage(role="system", content="Hi! I am Bo, the Acme bot. Be kind.")
    assert text_of(await collect(LocalLLM(), [short])) == "Hi! I am Bo, the Acme bot."


async def test_streams_a_few_words_per_delta_then_usage() -> None:
    events = await collect(LocalLLM(words_per_delta=2), user("When are your opening hours?"))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.text for d in deltas] == ["Our opening ", "hours are ", "9 to ", "5 on ", "weekdays."]
    assert events[-1] == Usage(model="local", input_tokens=len(INSTRUCTIONS.split()) + 5, output_tokens=9)
    assert len(events) == len(deltas) + 1


async def test_calls_a_tool_then_answers_with_its_result() -> None:
    llm = LocalLLM()
    messages = user("What will the weather be in Paris for 3 days?")
    events = await collect(llm, messages)
    assert events[:-1] == [
        ToolCall(id="call_local_2", name="get_weather", arguments={"city": "Paris", "days": 3})
    ]
    assert isinstance(events[-1], Usage)
    [call] = events[:-1]
    assert isinstance(call, ToolCall)

    messages += [
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", tool_call_id=call.id, content="Sunny and 21 degrees"),
    ]
    answer = await collect(llm, messages)
    assert not any(isinstance(e, ToolCall) for e in answer)
    assert "Sunny and 21 degrees" in text_of(answer)


async def test_matches_a_word_of_the_name_or_a_description_keyword() -> None:
    by_name_word = await collect(LocalLLM(), user("Please track order A-1734, thanks"))
    assert by_name_word[0] == ToolCall(
        id="call_local_2", name="track-order", arguments={"order_id": "A-1734"}
    )
    by_description = await collect(LocalLLM(), user("Where is my parcel 88-123?"))
    assert by_description[0] == ToolCall(
        id="call_local_2", name="track-order", arguments={"order_id": "88-123"}
    )


PIZZA = ToolSpec(
    name="order_pizza",
    description="Order a pizza for delivery.",
    parameters={
        "type": "object",
        "properties": {
            "kind": {"type": "string", "description": "The pizza, as the person named it"},
            "size": {"type": "string", "enum": ["small", "large"], "default": "large"},
        },
        "required": ["kind"],
    },
)
QUOTE = ToolSpec(
    name="delivery_price",
    description="What delivery costs.",
    parameters={
        "type": "object",
        "properties": {"postcode": {"type": "string"}, "pizzas": {"type": "integer", "minimum": 1}},
        "required": ["postcode", "pizzas"],
    },
)


async def test_parameters_are_filled_by_type_from_the_schema() -> None:
    # The first-hour report: this became order_pizza(kind='how much is delivery to ...').
    question = user("how much is delivery to postcode 10115 for 3 pizzas")
    [called, *_] = await collect(LocalLLM(), question, (PIZZA, QUOTE))
    assert called == ToolCall(
        id="call_local_2", name="delivery_price", arguments={"postcode": "10115", "pizzas": 3}
    )
    # A number beside its parameter's name is that parameter's, wherever it stands.
    [called, *_] = await collect(LocalLLM(), user("the price for 2 pizzas to zip 80331"), (QUOTE,))
    assert called.arguments == {"postcode": "80331", "pizzas": 2}
    # A choice said is taken (an optional one too), and its word stays out of the free text.
    [called, *_] = await collect(LocalLLM(), user("I would like to order a small pizza margherita"), (PIZZA,))
    assert called.arguments == {"kind": "pizza margherita", "size": "small"}
    [called, *_] = await collect(LocalLLM(), user("I would like to order a pizza margherita"), (PIZZA,))
    assert called.arguments == {"kind": "pizza margherita"}


async def test_a_required_parameter_the_words_do_not_give_is_asked_for_not_guessed() -> None:
    events = await collect(LocalLLM(), user("how much is delivery to postcode 10115 for 3 pizzas"), (PIZZA,))
    assert not any(isinstance(e, ToolCall) for e in events)
    assert text_of(events) == (
        "To order a pizza for delivery, I need the kind (the pizza, as the person named it). What is it?"
    )
    sized = ToolSpec(
        name="resize",
        description="Change the size of the order.",
        parameters={
            "type": "object",
            "properties": {"size": {"enum": ["small", "large"]}},
            "required": ["size"],
        },
    )
    assert text_of(await collect(LocalLLM(), user("please resize it"), (sized,))) == (
        "To change the size of the order, I need the size. Which one: small or large?"
    )
    days = await collect(LocalLLM(), user("what is the weather in Oslo"), (WEATHER,))
    assert text_of(days) == "To look up the current weather forecast for a city, I need the days. What is it?"


def answer_to(content: str) -> str:
    call = ToolCall(id="c1", name="order_pizza", arguments={"kind": "margherita"})
    return LocalLLM().decide(
        [
            SYSTEM,
            ChatMessage(role="user", content="A margherita."),
            ChatMessage(role="assistant", content="", tool_calls=[call]),
            ChatMessage(role="tool", content=content, tool_call_id="c1"),
        ]
    )


async def test_a_tool_result_is_said_as_words_never_as_json() -> None:
    assert answer_to("One large margherita is in the oven.") == "One large margherita is in the oven."
    assert answer_to('{"eta_minutes": 30, "paid": true, "toppings": ["basil", "olives"]}') == (
        "Eta minutes: 30; paid: yes; toppings: basil, olives."
    )
    # A failed call, as the pipeline sends it: said plainly, without braces or the error's type.
    assert (
        answer_to('{"error": "ValueError: out of dough"}') == "Sorry, I could not order pizza: out of dough."
    )
    assert answer_to("") == "Order pizza returned nothing."
    for content in ('{"a": {"b": [1, {"c": null}]}}', "[1, 2]", '{"error": {"why": "closed"}}'):
        assert not set('{}[]"') & set(answer_to(content)), content


async def test_answers_from_the_instructions_or_echoes() -> None:
    assert text_of(await collect(LocalLLM(), user("Do you sell spare parts?"))) == (
        "We sell bicycles and spare parts."
    )
    assert text_of(await collect(LocalLLM(), user("Quantum chromodynamics"))) == (
        "You said: Quantum chromodynamics."
    )
    # Without tools on offer, a tool's keyword is just words.
    assert text_of(await collect(LocalLLM(), user("weather in Oslo"), ())) == "You said: weather in Oslo."


async def test_same_input_same_output() -> None:
    conversations = [
        [SYSTEM],
        user("What is the weather in Rome?"),
        user("When are you open?"),
        user("Tell me a story"),
    ]
    for messages in conversations:
        first = await collect(LocalLLM(), messages)
        second = await collect(LocalLLM(), list(messages))
        assert first == second


async def test_delay_per_delta_paces_the_reply(autojump_clock: trio.abc.Clock) -> None:
    llm = LocalLLM(delay_per_delta_s=0.25, words_per_delta=3)
    start = trio.current_time()
    arrivals = []
    async for _event in llm.stream(user("When are your opening hours?")):
        arrivals.append(trio.current_time() - start)
    # 9 words -> 3 deltas, each after its delay; the usage follows the last one at once.
    assert arrivals == [0.25, 0.5, 0.75, 0.75]


async def test_a_slow_reply_can_be_cancelled(autojump_clock: trio.abc.Clock) -> None:
    llm = LocalLLM(delay_per_delta_s=1.0, words_per_delta=1)
    seen = []
    with trio.move_on_after(2.5):
        async for event in llm.stream(user("When are your opening hours?")):
            seen.append(event)
    assert seen == [TextDelta(text="Our "), TextDelta(text="opening ")]


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        LocalLLM(delay_per_delta_s=-1)
    with pytest.raises(ValueError):
        LocalLLM(words_per_delta=0)


def test_make_llm_local_and_unknown() -> None:
    llm = make_llm("local", "local-v1")
    assert isinstance(llm, LocalLLM)
    assert (llm.provider, llm.model) == ("local", "local-v1")
    with pytest.raises(ValueError, match="unknown LLM provider 'gemini'"):
        make_llm("gemini", "gemini-pro")


def test_the_offline_engines_load_on_first_use_and_every_public_name_is_exported() -> None:
    from runner.providers.espeak import EspeakTTS
    from runner.providers.pocketsphinx import PocketsphinxSTT

    # The offline speech engines load on first use, then stay.
    assert providers.EspeakTTS is EspeakTTS
    assert providers.PocketsphinxSTT is PocketsphinxSTT
    # Once every name of the face is loaded, nothing else is public (the face's exact names are
    # held in tests/test_public_names.py).
    for name in providers.__all__:
        getattr(providers, name)
    public = {
        name
        for name, value in vars(providers).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(providers.__all__)
    assert public <= set(dir(providers))
    assert providers.LLM_PROVIDERS == ("openai", "anthropic", "openai-compatible", "kugelaudio", "local")
