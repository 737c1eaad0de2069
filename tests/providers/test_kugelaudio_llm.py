"""KugelAudio's chat model: an OpenAI-compatible client of its API base, against a local fake
speaking the Chat Completions wire format (streamed server-sent events)."""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator

import pytest
from fake_servers import (
    FakeOpenAI,
    open_fake_server,
    openai_events,
    openai_text_chunks,
    openai_usage,
    sse_reply,
)

from runner.agent import LLM, Agent, WarmUpFailed, warm_up
from runner.providers import ChatMessage, KugelAudioLLM, ProviderError, TextDelta, Usage, make_llm

KEY = "kg-test-Secret-0123456789abcdef"
HELLO = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi.")]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    service = FakeOpenAI(api_key=KEY)
    async with open_fake_server(service) as root:
        service.root = root
        monkeypatch.setenv("KUGELAUDIO_API_KEY", KEY)
        monkeypatch.setenv("KUGELAUDIO_LLM_BASE_URL", service.base_url)
        yield service


async def test_the_protocols_example_streams_from_the_base_the_environment_names(fake: FakeOpenAI) -> None:
    usage = openai_usage(7, 2)
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["Hal", "lo."], usage=usage))))
    llm = make_llm("kugelaudio", "qwen3.8-27b")
    events = [event async for event in llm.stream(HELLO)]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hal", "lo."]
    assert isinstance(events[-1], Usage) and events[-1].output_tokens == 2
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json()["model"] == "qwen3.8-27b" and request.json()["stream"] is True
    assert llm.provider == "kugelaudio" and llm.missing_key is None


async def test_a_region_prefix_is_stripped_from_the_key_and_picks_the_host(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUGELAUDIO_API_KEY", f"eu-{KEY}")
    fake.enqueue(sse_reply(openai_events(openai_text_chunks(["Ja."], usage=None))))
    [_ async for _ in KugelAudioLLM().stream(HELLO)]
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    monkeypatch.delenv("KUGELAUDIO_LLM_BASE_URL")
    assert KugelAudioLLM().base_url == "https://api.eu.kugelaudio.com/v1"
    assert KugelAudioLLM(api_key=KEY).base_url == "https://api.kugelaudio.com/v1"
    assert KugelAudioLLM(api_key=KEY).model == "qwen3.8-27b"


async def test_a_missing_key_is_named_and_a_refused_one_never_shown(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUGELAUDIO_API_KEY")
    keyless = KugelAudioLLM()
    assert keyless.missing_key == "KUGELAUDIO_API_KEY"
    with pytest.raises(ProviderError) as caught:
        [_ async for _ in keyless.stream(HELLO)]
    assert caught.value.code == "unauthorized" and "KUGELAUDIO_API_KEY" in str(caught.value)
    assert fake.requests == []  # nothing was sent without a key
    wrong = "kg-wrong-Secret-999999999999"
    with pytest.raises(ProviderError) as caught:
        [_ async for _ in KugelAudioLLM(api_key=wrong).stream(HELLO)]
    assert caught.value.code == "unauthorized"
    assert wrong not in "".join(traceback.format_exception(caught.value))


async def test_a_base_that_is_not_http_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUGELAUDIO_LLM_BASE_URL", "ftp://example.invalid/v1")
    with pytest.raises(ProviderError) as caught:
        KugelAudioLLM(api_key=KEY)
    assert caught.value.code == "invalid_settings"


async def test_an_agent_on_kugelaudio_warms_up_with_its_key_only(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent("k", llm=LLM(provider="kugelaudio", model="qwen3.8-27b"))
    monkeypatch.setenv("KUGELAUDIO_API_KEY", KEY)
    await warm_up(agent)
    monkeypatch.delenv("KUGELAUDIO_API_KEY")
    with pytest.raises(WarmUpFailed, match="LLM provider 'kugelaudio' needs KUGELAUDIO_API_KEY"):
        await warm_up(agent)
