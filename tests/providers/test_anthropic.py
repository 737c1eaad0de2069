"""Anthropic Messages streaming against a local fake of the service."""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
import trio
import trio.lowlevel
from fake_servers import (
    FakeAnthropic,
    anthropic_events,
    anthropic_message,
    json_reply,
    open_fake_server,
    sse_reply,
)

from runner.providers import (
    AnthropicLLM,
    ChatMessage,
    ChatModel,
    LLMEvent,
    ProviderError,
    TextDelta,
    ThoughtDelta,
    ToolCall,
    ToolSpec,
    Usage,
    make_llm,
    reports_thoughts,
)

KEY = "sk-ant-test-Secret-0123456789"
MODEL = "claude-sonnet-4-5-20250929"

WEATHER = ToolSpec(
    name="get_weather",
    description="Look up the current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
HELLO = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content="Say hello."),
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    service = FakeAnthropic(api_key=KEY)
    async with open_fake_server(service) as root:
        service.root = root
        yield service


def llm_for(fake: FakeAnthropic, key: str = KEY) -> AnthropicLLM:
    return AnthropicLLM("claude-sonnet-4-5", api_key=key, base_url=fake.base_url, max_tokens=256)


async def collect(
    llm: ChatModel, messages: list[ChatMessage], tools: tuple[ToolSpec, ...] = ()
) -> list[LLMEvent]:
    return [event async for event in llm.stream(messages, tools)]


async def collect_until_error(
    llm: ChatModel, messages: list[ChatMessage]
) -> tuple[list[LLMEvent], ProviderError]:
    seen: list[LLMEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in llm.stream(messages):
            seen.append(event)
    return seen, caught.value


def assert_secret_free(error: BaseException, secret: str) -> None:
    assert secret not in str(error)
    assert secret not in repr(error)
    assert secret not in "".join(traceback.format_exception(error))


async def test_streams_text_then_usage(fake: FakeAnthropic) -> None:
    fake.enqueue(
        sse_reply(
            anthropic_events(
                anthropic_message(
                    text_pieces=["Hel", "lo", " there."],
                    input_tokens=12,
                    cache_read=30,
                    output_tokens=4,
                )
            )
        )
    )
    events = await collect(llm_for(fake), HELLO)
    assert events == [
        TextDelta(text="Hel"),
        TextDelta(text="lo"),
        TextDelta(text=" there."),
        Usage(model=MODEL, input_tokens=42, output_tokens=4, cached_tokens=30),
    ]
    [request] = fake.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.json() == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "stream": True,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
    }


async def test_tool_use_input_split_across_deltas(fake: FakeAnthropic) -> None:
    message = anthropic_message(
        text_pieces=["Let me check."],
        tool_uses=[
            ("toolu_01A", "get_weather", ['{"ci', 'ty": "Par', 'is", "da', 'ys": 2}']),
            ("toolu_01B", "get_weather", ["", '{"city": "Oslo"}']),
        ],
        input_tokens=300,
        output_tokens=60,
    )
    fake.enqueue(sse_reply(anthropic_events(message)))
    events = await collect(llm_for(fake), HELLO, (WEATHER,))
    assert events == [
        TextDelta(text="Let me check."),
        ToolCall(id="toolu_01A", name="get_weather", arguments={"city": "Paris", "days": 2}),
        ToolCall(id="toolu_01B", name="get_weather", arguments={"city": "Oslo"}),
        Usage(model=MODEL, input_tokens=300, output_tokens=60),
    ]
    assert fake.requests[0].json()["tools"] == [
        {
            "name": "get_weather",
            "description": "Look up the current weather for a city.",
            "input_schema": WEATHER.parameters,
        }
    ]


async def test_tool_results_go_back_as_tool_result_blocks(fake: FakeAnthropic) -> None:
    fake.enqueue(sse_reply(anthropic_events(anthropic_message(text_pieces=["Sunny."]))))
    calls = [
        ToolCall(id="toolu_01A", name="get_weather", arguments={"city": "Paris"}),
        ToolCall(id="toolu_01B", name="get_weather", arguments={"city": "Oslo"}),
    ]
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="system", content="Use metric units."),
        ChatMessage(role="user", content="Weather in Paris and Oslo?"),
        ChatMessage(role="assistant", content="Checking.", tool_calls=calls),
        ChatMessage(role="tool", tool_call_id="toolu_01A", content="sunny, 21 C"),
        ChatMessage(role="tool", tool_call_id="toolu_01B", content="rain, 9 C"),
    ]
    events = await collect(llm_for(fake), messages, (WEATHER,))
    assert events[0] == TextDelta(text="Sunny.")
    body = fake.requests[0].json()
    assert body["system"] == "Be brief.\n\nUse metric units."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_01B",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "sunny, 21 C"},
                {"type": "tool_result", "tool_use_id": "toolu_01B", "content": "rain, 9 C"},
            ],
        },
    ]


async def test_unauthorized_never_shows_the_key(fake: FakeAnthropic) -> None:
    wrong = "sk-ant-wrong-DoNotLeak-42"
    llm = llm_for(fake, key=wrong)
    with pytest.raises(ProviderError) as caught:
        await collect(llm, HELLO)
    assert (caught.value.code, caught.value.retryable) == ("unauthorized", False)
    assert "401" in str(caught.value)
    assert_secret_free(caught.value, wrong)
    assert wrong not in repr(llm)
    assert fake.requests[0].headers["x-api-key"] == wrong


@pytest.mark.parametrize(
    ("status", "kind", "code", "retryable"),
    [
        (429, "rate_limit_error", "rate_limited", True),
        (500, "api_error", "provider_failed", True),
        (529, "overloaded_error", "provider_failed", True),
        (400, "invalid_request_error", "provider_failed", False),
    ],
)
async def test_http_errors_are_mapped(
    fake: FakeAnthropic, status: int, kind: str, code: str, retryable: bool
) -> None:
    headers = [("retry-after", "3")] if status == 429 else []
    fake.enqueue(
        json_reply(
            status,
            {"type": "error", "error": {"type": kind, "message": f"{kind} happened"}},
            headers,
        )
    )
    with pytest.raises(ProviderError) as caught:
        await collect(llm_for(fake), HELLO)
    assert (caught.value.code, caught.value.retryable) == (code, retryable)
    assert f"HTTP {status}" in str(caught.value)
    assert f"{kind} happened" in str(caught.value)
    if status == 429:
        assert "retry after 3 s" in str(caught.value)
    assert_secret_free(caught.value, KEY)


async def test_error_event_mid_stream_yields_then_raises(fake: FakeAnthropic) -> None:
    events = anthropic_message(text_pieces=["Hello, ", "wor"], stop=False)[:6]
    events.append({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    fake.enqueue(sse_reply(anthropic_events(events)))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hello, "), TextDelta(text="wor")]
    assert (error.code, error.retryable) == ("provider_failed", True)
    assert "overloaded_error" in str(error)


async def test_connection_cut_mid_reply_yields_then_raises(fake: FakeAnthropic) -> None:
    events = anthropic_message(text_pieces=["Hello, ", "wor", "ld"], stop=False)[:5]
    fake.enqueue(sse_reply(anthropic_events(events), cut=True))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hello, "), TextDelta(text="wor")]
    assert (error.code, error.retryable) == ("provider_failed", True)
    assert_secret_free(error, KEY)


async def test_stream_ending_without_message_stop_is_a_cut(fake: FakeAnthropic) -> None:
    events = anthropic_message(
        text_pieces=["Hi"], tool_uses=[("toolu_1", "get_weather", ['{"city"'])], stop=False
    )
    fake.enqueue(sse_reply(anthropic_events(events[:-3])))  # cut inside the tool_use block
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hi")]
    assert error.code == "provider_failed"
    assert "message_stop" in str(error)


async def test_malformed_event_mid_reply_yields_then_raises(fake: FakeAnthropic) -> None:
    events = anthropic_events(anthropic_message(text_pieces=["Hi"])[:4])
    events.append(b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n')
    fake.enqueue(sse_reply(events))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hi")]
    assert error.code == "provider_failed"
    assert "malformed" in str(error)


async def test_listener_leaving_early_closes_the_stream(fake: FakeAnthropic) -> None:
    events = anthropic_message(text_pieces=["First ", "second"], stop=False)[:4]
    fake.enqueue(sse_reply(anthropic_events(events), stall=True))
    seen: list[LLMEvent] = []
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            async with aclosing(llm_for(fake).stream(HELLO)) as stream:
                async for event in stream:
                    seen.append(event)
                    scope.cancel()
                    await trio.lowlevel.checkpoint()
    assert seen == [TextDelta(text="First ")]


async def test_key_from_the_environment(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    fake.enqueue(sse_reply(anthropic_events(anthropic_message(text_pieces=["ok"]))))
    llm = make_llm("anthropic", "claude-sonnet-4-5", base_url=fake.base_url)
    assert isinstance(llm, AnthropicLLM)
    assert (llm.provider, llm.model) == ("anthropic", "claude-sonnet-4-5")
    events = await collect(llm, HELLO)
    assert events[0] == TextDelta(text="ok")
    assert KEY not in repr(llm)


async def test_missing_key_is_unauthorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError) as caught:
        await collect(AnthropicLLM("claude-sonnet-4-5"), HELLO)
    assert caught.value.code == "unauthorized"
    assert "ANTHROPIC_API_KEY" in str(caught.value)


# -- Thinking summaries ----------------------------------------------------------------------


async def test_thoughts_enable_thinking_and_stream_thought_deltas(fake: FakeAnthropic) -> None:
    fake.enqueue(
        sse_reply(
            anthropic_events(
                anthropic_message(
                    thinking_pieces=["The user greets me", "; a short hello fits."],
                    text_pieces=["Hello."],
                    input_tokens=10,
                    output_tokens=40,
                )
            )
        )
    )
    llm = llm_for(fake)
    assert reports_thoughts(llm)
    events = [event async for event in llm.stream(HELLO, thoughts=True)]
    assert events == [
        ThoughtDelta(text="The user greets me"),
        ThoughtDelta(text="; a short hello fits."),
        TextDelta(text="Hello."),
        Usage(model=MODEL, input_tokens=10, output_tokens=40),
    ]
    body = fake.requests[0].json()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["max_tokens"] == 256 + 1024


async def test_thinking_is_dropped_when_thoughts_were_not_asked(fake: FakeAnthropic) -> None:
    fake.enqueue(
        sse_reply(anthropic_events(anthropic_message(thinking_pieces=["hidden"], text_pieces=["Hi."])))
    )
    events = await collect(llm_for(fake), HELLO)
    assert [e for e in events if not isinstance(e, Usage)] == [TextDelta(text="Hi.")]
    body = fake.requests[0].json()
    assert "thinking" not in body
    assert body["max_tokens"] == 256


async def test_thoughts_after_a_tool_round_do_not_enable_thinking(fake: FakeAnthropic) -> None:
    fake.enqueue(sse_reply(anthropic_events(anthropic_message(text_pieces=["Sunny."]))))
    call = ToolCall(id="toolu_01A", name="get_weather", arguments={"city": "Paris"})
    messages = [
        *HELLO,
        ChatMessage(role="assistant", content="", tool_calls=(call,)),
        ChatMessage(role="tool", content="sunny", tool_call_id="toolu_01A"),
    ]
    events = [e async for e in llm_for(fake).stream(messages, (WEATHER,), thoughts=True)]
    assert events[0] == TextDelta(text="Sunny.")
    assert "thinking" not in fake.requests[0].json()


def test_thinking_budget_has_the_api_minimum() -> None:
    with pytest.raises(ValueError):
        AnthropicLLM("claude-sonnet-4-5", api_key=KEY, thinking_budget_tokens=1000)
    body = AnthropicLLM(
        "claude-sonnet-4-5", api_key=KEY, max_tokens=500, thinking_budget_tokens=2000
    ).request_body(HELLO, thoughts=True)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert body["max_tokens"] == 2500
