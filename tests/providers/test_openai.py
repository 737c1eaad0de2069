"""OpenAI chat completions, speech and transcription against a local fake of the service."""

from __future__ import annotations

import math
import struct
import traceback
from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import pytest
import trio
import trio.lowlevel
from fake_servers import (
    FakeOpenAI,
    Reply,
    json_reply,
    open_fake_server,
    openai_chunk,
    openai_events,
    openai_text_chunks,
    openai_usage,
    sse_reply,
)

from runner.providers import (
    ChatMessage,
    ChatModel,
    LLMEvent,
    OpenAILLM,
    OpenAISTT,
    OpenAITTS,
    ProviderError,
    Recognizer,
    Synthesizer,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    make_llm,
)

KEY = "sk-test-Secret-0123456789abcdef"

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
async def fake() -> AsyncIterator[FakeOpenAI]:
    service = FakeOpenAI(api_key=KEY)
    async with open_fake_server(service) as root:
        service.root = root
        yield service


def llm_for(fake: FakeOpenAI, http: httpx.AsyncClient | None = None) -> OpenAILLM:
    return OpenAILLM("gpt-4o-mini", api_key=KEY, base_url=fake.base_url, http=http)


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


def text_of(events: list[LLMEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def assert_secret_free(error: BaseException, secret: str) -> None:
    rendered = "".join(traceback.format_exception(error))
    assert secret not in str(error)
    assert secret not in repr(error)
    assert secret not in rendered


async def test_streams_text_then_usage(fake: FakeOpenAI) -> None:
    usage = openai_usage(21, 3, cached=5, reasoning=1)
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["Hel", "lo", " there."], usage=usage))))
    events = await collect(llm_for(fake), HELLO)
    assert events == [
        TextDelta(text="Hel"),
        TextDelta(text="lo"),
        TextDelta(text=" there."),
        Usage(
            model="gpt-4o-mini-2024-07-18",
            input_tokens=21,
            output_tokens=3,
            cached_tokens=5,
            thought_tokens=1,
        ),
    ]
    [request] = fake.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello."},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_tool_call_arguments_split_across_deltas(fake: FakeOpenAI) -> None:
    def call_delta(index: int, **fields: object) -> dict[str, object]:
        return {"tool_calls": [{"index": index, **fields}]}

    chunks = [
        openai_chunk({"role": "assistant", "content": None}),
        openai_chunk({"content": "Checking."}),
        openai_chunk(
            call_delta(0, id="call_A", type="function", function={"name": "get_weather", "arguments": ""})
        ),
        openai_chunk(call_delta(0, function={"arguments": '{"ci'})),
        openai_chunk(
            call_delta(1, id="call_B", type="function", function={"name": "get_weather", "arguments": ""})
        ),
        openai_chunk(call_delta(0, function={"arguments": 'ty": "Par'})),
        openai_chunk(call_delta(1, function={"arguments": '{"city": "Oslo", "days": 3}'})),
        openai_chunk(call_delta(0, function={"arguments": 'is"}'})),
        openai_chunk({}, finish_reason="tool_calls"),
        openai_chunk(None, usage=openai_usage(40, 30)),
    ]
    fake.enqueue(sse_reply(openai_events(chunks)))
    events = await collect(llm_for(fake), HELLO, (WEATHER,))
    assert events == [
        TextDelta(text="Checking."),
        ToolCall(id="call_A", name="get_weather", arguments={"city": "Paris"}),
        ToolCall(id="call_B", name="get_weather", arguments={"city": "Oslo", "days": 3}),
        Usage(model="gpt-4o-mini-2024-07-18", input_tokens=40, output_tokens=30),
    ]
    assert fake.requests[0].json()["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Look up the current weather for a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]


async def test_tool_results_are_sent_back_in_the_wire_shape(fake: FakeOpenAI) -> None:
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["Sunny in Paris."], usage=openai_usage(60, 4)))))
    call = ToolCall(id="call_A", name="get_weather", arguments={"city": "Paris"})
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", tool_call_id="call_A", content="sunny, 21 C"),
    ]
    events = await collect(llm_for(fake), messages, (WEATHER,))
    assert text_of(events) == "Sunny in Paris."
    assert fake.requests[0].json()["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_A",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_A", "content": "sunny, 21 C"},
    ]


async def test_unauthorized_never_shows_the_key(fake: FakeOpenAI) -> None:
    wrong = "sk-wrong-DoNotLeak-987654321"
    llm = OpenAILLM("gpt-4o-mini", api_key=wrong, base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        await collect(llm, HELLO)
    assert caught.value.code == "unauthorized"
    assert not caught.value.retryable
    assert "401" in str(caught.value)
    assert_secret_free(caught.value, wrong)
    assert wrong not in repr(llm)
    assert fake.requests[0].headers["authorization"] == f"Bearer {wrong}"


async def test_rate_limited_is_retryable_and_notes_retry_after(fake: FakeOpenAI) -> None:
    fake.enqueue(
        json_reply(
            429,
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o-mini",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
            headers=[("retry-after", "7")],
        )
    )
    with pytest.raises(ProviderError) as caught:
        await collect(llm_for(fake), HELLO)
    assert caught.value.code == "rate_limited"
    assert caught.value.retryable
    assert "retry after 7 s" in str(caught.value)
    assert "Rate limit reached" in str(caught.value)
    assert_secret_free(caught.value, KEY)


async def test_server_error_is_retryable_provider_failed(fake: FakeOpenAI) -> None:
    fake.enqueue(json_reply(500, {"error": {"message": "The server had an error", "type": "server_error"}}))
    with pytest.raises(ProviderError) as caught:
        await collect(llm_for(fake), HELLO)
    assert (caught.value.code, caught.value.retryable) == ("provider_failed", True)
    assert "HTTP 500" in str(caught.value)
    assert "The server had an error" in str(caught.value)


async def test_bad_request_is_not_retryable(fake: FakeOpenAI) -> None:
    # An assistant message answering a tool call that was never made: the service refuses it.
    messages = [*HELLO, ChatMessage(role="tool", tool_call_id="call_nowhere", content="x")]
    with pytest.raises(ProviderError) as caught:
        await collect(llm_for(fake), messages)
    assert (caught.value.code, caught.value.retryable) == ("provider_failed", False)
    assert "HTTP 400" in str(caught.value)
    assert "preceeding message with 'tool_calls'" in str(caught.value)


async def test_connection_cut_mid_reply_yields_then_raises(fake: FakeOpenAI) -> None:
    chunks = openai_text_chunks(["Hello, ", "wor"], usage=None)[:3]
    fake.enqueue(sse_reply(openai_events(chunks, done=False), cut=True))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hello, "), TextDelta(text="wor")]
    assert (error.code, error.retryable) == ("provider_failed", True)
    assert_secret_free(error, KEY)


async def test_stream_ending_without_done_is_a_cut(fake: FakeOpenAI) -> None:
    chunks = openai_text_chunks(["Hello, ", "wor"], usage=None)[:3]
    fake.enqueue(sse_reply(openai_events(chunks, done=False)))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hello, "), TextDelta(text="wor")]
    assert error.code == "provider_failed"
    assert "[DONE]" in str(error)


async def test_malformed_chunk_mid_reply_yields_then_raises(fake: FakeOpenAI) -> None:
    chunks = [
        *openai_text_chunks(["Hi"], usage=None)[:2],
        '{"choices": [{"index": 0, "delta": {"con',
    ]
    fake.enqueue(sse_reply(openai_events(chunks)))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hi")]
    assert error.code == "provider_failed"
    assert "malformed" in str(error)


async def test_error_object_inside_the_stream(fake: FakeOpenAI) -> None:
    chunks = [
        *openai_text_chunks(["Hi"], usage=None)[:2],
        {"error": {"message": "The model is overloaded", "type": "server_error"}},
    ]
    fake.enqueue(sse_reply(openai_events(chunks, done=False)))
    seen, error = await collect_until_error(llm_for(fake), HELLO)
    assert seen == [TextDelta(text="Hi")]
    assert (error.code, error.retryable) == ("provider_failed", True)
    assert "overloaded" in str(error)


async def test_listener_leaving_early_closes_the_stream(fake: FakeOpenAI) -> None:
    # A barge-in: the caller stops listening after the first delta while the service is
    # still mid-reply (the fake stalls), by leaving the loop or by being cancelled.
    chunks = openai_text_chunks(["First ", "second"], usage=None)[:2]
    fake.enqueue(sse_reply(openai_events(chunks, done=False), stall=True))
    fake.enqueue(sse_reply(openai_events(chunks, done=False), stall=True))
    llm = llm_for(fake)
    with trio.fail_after(5):
        async with aclosing(llm.stream(HELLO)) as events:
            async for event in events:
                assert event == TextDelta(text="First ")
                break
        seen = []
        with trio.CancelScope() as scope:
            async with aclosing(llm.stream(HELLO)) as events:
                async for event in events:
                    seen.append(event)
                    scope.cancel()
                    await trio.lowlevel.checkpoint()
    assert seen == [TextDelta(text="First ")]
    assert scope.cancelled_caught
    assert len(fake.requests) == 2


async def test_connect_failure_is_unavailable() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = sock.getsockname()[1]
        llm = OpenAILLM("gpt-4o-mini", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1")
        with pytest.raises(ProviderError) as caught:
            await collect(llm, HELLO)
    assert (caught.value.code, caught.value.retryable) == ("unavailable", True)
    assert_secret_free(caught.value, KEY)


async def test_key_from_the_environment(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["ok"], usage=openai_usage(1, 1)))))
    llm = OpenAILLM("gpt-4o-mini", base_url=fake.base_url)
    assert text_of(await collect(llm, HELLO)) == "ok"
    assert KEY not in repr(llm)


async def test_missing_key_is_unauthorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError) as caught:
        await collect(OpenAILLM("gpt-4o-mini"), HELLO)
    assert caught.value.code == "unauthorized"
    assert "OPENAI_API_KEY" in str(caught.value)


async def test_compatible_endpoint_uses_only_its_own_key(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-travel")
    monkeypatch.setenv("LOCAL_LLM_KEY", KEY)
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["ok"], usage=openai_usage(1, 1)))))
    llm = make_llm("openai-compatible", "llama-3", base_url=fake.base_url, api_key_env="LOCAL_LLM_KEY")
    assert (llm.provider, llm.model) == ("openai-compatible", "llama-3")
    assert text_of(await collect(llm, HELLO)) == "ok"
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"

    keyless = make_llm("openai-compatible", "llama-3", base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        await collect(keyless, HELLO)
    assert caught.value.code == "unauthorized"
    assert "authorization" not in fake.requests[1].headers


async def test_shared_client_is_reused_and_left_open(fake: FakeOpenAI) -> None:
    fake.enqueue(
        *(sse_reply(openai_events(openai_text_chunks([f"r{i}"], usage=openai_usage(1, 1)))) for i in range(2))
    )
    async with httpx.AsyncClient() as http:
        llm = llm_for(fake, http=http)
        assert text_of(await collect(llm, HELLO)) == "r0"
        assert text_of(await collect(llm, HELLO)) == "r1"
        assert not http.is_closed
    first, second = fake.requests
    assert first.client_port == second.client_port  # one connection served both


async def test_reply_ends_at_done_even_if_the_body_does_not(fake: FakeOpenAI) -> None:
    chunks = openai_text_chunks(["ok"], usage=openai_usage(2, 1))
    fake.enqueue(sse_reply(openai_events(chunks), stall=True))
    with trio.fail_after(2):
        events = await collect(llm_for(fake), HELLO)
    assert events == [
        TextDelta(text="ok"),
        Usage(model="gpt-4o-mini-2024-07-18", input_tokens=2, output_tokens=1),
    ]


def test_make_llm_openai_and_errors() -> None:
    llm = make_llm("openai", "gpt-4o-mini")
    assert isinstance(llm, OpenAILLM)
    assert (llm.provider, llm.model, llm.base_url) == (
        "openai",
        "gpt-4o-mini",
        "https://api.openai.com/v1",
    )
    with pytest.raises(ValueError, match="base_url"):
        make_llm("openai-compatible", "llama-3")
    with pytest.raises(ValueError, match="unknown LLM provider"):
        make_llm("openia", "gpt-4o-mini")


# ------------------------------------------------------------------------------------------
# Speech
# ------------------------------------------------------------------------------------------


def tone(samples: int) -> bytes:
    return b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 24_000))) for i in range(samples)
    )


async def test_tts_streams_whole_samples(fake: FakeOpenAI) -> None:
    pcm = tone(1000)
    pieces = (pcm[:3], pcm[3:8], pcm[8:1001], pcm[1001:])
    fake.enqueue(Reply(headers=(("content-type", "audio/pcm"),), chunks=pieces))
    tts = OpenAITTS("gpt-4o-mini-tts", voice="coral", api_key=KEY, base_url=fake.base_url)
    assert isinstance(tts, Synthesizer)
    assert tts.sample_rate_hz == 24_000
    chunks = [chunk async for chunk in tts.synthesize("Hello there.")]
    assert b"".join(chunks) == pcm
    assert all(len(chunk) % 2 == 0 for chunk in chunks)
    [request] = fake.requests
    assert request.path == "/v1/audio/speech"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json() == {
        "model": "gpt-4o-mini-tts",
        "input": "Hello there.",
        "voice": "coral",
        "response_format": "pcm",
    }


async def test_tts_cut_mid_body_yields_then_raises(fake: FakeOpenAI) -> None:
    pcm = tone(100)
    fake.enqueue(Reply(headers=(("content-type", "audio/pcm"),), chunks=(pcm[:40], pcm[40:81]), cut=True))
    tts = OpenAITTS(api_key=KEY, base_url=fake.base_url)
    received = []
    with pytest.raises(ProviderError) as caught:
        async for chunk in tts.synthesize("Hi"):
            received.append(chunk)
    assert b"".join(received) == pcm[:80]
    assert (caught.value.code, caught.value.retryable) == ("provider_failed", True)


async def test_tts_errors_are_mapped(fake: FakeOpenAI) -> None:
    fake.enqueue(json_reply(503, {"error": {"message": "busy", "type": "server_error"}}))
    tts = OpenAITTS(api_key=KEY, base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        async for _ in tts.synthesize("Hi"):
            pass
    assert (caught.value.code, caught.value.retryable) == ("provider_failed", True)


async def test_stt_sends_a_wav_of_the_pcm(fake: FakeOpenAI) -> None:
    stt = OpenAISTT("whisper-1", language="en", api_key=KEY, base_url=fake.base_url)
    assert isinstance(stt, Recognizer)
    transcript = await stt.transcribe(tone(16_000), 16_000)
    assert transcript.text == "heard 16000 frames at 16000 Hz, 16 bit, 1 channel"
    assert transcript.audio_seconds == 1.0
    [request] = fake.requests
    assert request.path == "/v1/audio/transcriptions"
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert b'name="model"\r\n\r\nwhisper-1' in request.body
    assert b'name="language"\r\n\r\nen' in request.body
    assert b'name="prompt"' not in request.body


async def test_stt_sends_a_prompt_as_the_services_prompt(fake: FakeOpenAI) -> None:
    stt = OpenAISTT("whisper-1", api_key=KEY, base_url=fake.base_url)
    await stt.transcribe(tone(16_000), 16_000, prompt="Mm-hm. Uh-huh.")
    [request] = fake.requests
    assert b'name="prompt"\r\n\r\nMm-hm. Uh-huh.' in request.body


async def test_stt_unauthorized(fake: FakeOpenAI) -> None:
    stt = OpenAISTT(api_key="sk-wrong-stt-key-000", base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        await stt.transcribe(tone(100), 16_000)
    assert caught.value.code == "unauthorized"
    assert_secret_free(caught.value, "sk-wrong-stt-key-000")


async def test_stt_reads_the_text_field(fake: FakeOpenAI) -> None:
    fake.enqueue(json_reply(200, {"text": "  What is the weather?  "}))
    stt = OpenAISTT(api_key=KEY, base_url=fake.base_url)
    transcript = await stt.transcribe(tone(8_000), 16_000)
    assert transcript.text == "What is the weather?"
    assert transcript.audio_seconds == 0.5
