"""Azure Speech recognition (REST API for short audio) against a local fake of the endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fake_servers import Reply, json_reply, open_fake_server
from fake_speech_servers import AZURE_PATH, FakeAzureSpeech, read_wav

from runner.providers import AzureSTT, OpenAISTT, ProviderError, Recognizer, make_stt

KEY = "az-test-Secret-0123456789abcdef"


@pytest.fixture
async def fake() -> AsyncIterator[FakeAzureSpeech]:
    service = FakeAzureSpeech(api_key=KEY)
    async with open_fake_server(service) as root:
        service.root = root
        yield service


def stt_for(fake: FakeAzureSpeech, language: str = "de-DE") -> AzureSTT:
    return AzureSTT(language, api_key=KEY, base_url=fake.base_url)


async def test_sends_a_16khz_wav_with_key_and_locale(fake: FakeAzureSpeech) -> None:
    stt = stt_for(fake, "de-de")
    assert isinstance(stt, Recognizer) and stt.language == "de-DE"
    pcm = b"\x01\x00" * 48_000  # one second at 48 kHz
    result = await stt.transcribe(pcm, 48_000)
    assert result.text == "heard 16000 frames at 16000 Hz in de-DE"
    assert result.audio_seconds == 1.0
    request = fake.requests[-1]
    assert request.path == AZURE_PATH
    assert fake.queries[-1] == {"language": "de-DE", "format": "simple"}
    assert request.headers["ocp-apim-subscription-key"] == KEY
    assert request.headers["content-type"] == "audio/wav; codecs=audio/pcm; samplerate=16000"
    wav = read_wav(request.body)
    assert (wav.frames, wav.rate, wav.width, wav.channels) == (16_000, 16_000, 2, 1)


async def test_16khz_audio_is_sent_as_is(fake: FakeAzureSpeech) -> None:
    result = await stt_for(fake, "en-US").transcribe(b"\x00\x00" * 8000, 16_000)
    assert result.text == "heard 8000 frames at 16000 Hz in en-US"
    assert result.audio_seconds == 0.5


async def test_display_text_is_returned(fake: FakeAzureSpeech) -> None:
    fake.enqueue(
        json_reply(
            200,
            {"RecognitionStatus": "Success", "DisplayText": " Guten Tag. ", "Offset": 100000,
             "Duration": 9000000},
        )
    )  # fmt: skip
    assert (await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)).text == "Guten Tag."


@pytest.mark.parametrize("status", ["NoMatch", "InitialSilenceTimeout", "BabbleTimeout"])
async def test_nothing_recognised_is_empty_text(fake: FakeAzureSpeech, status: str) -> None:
    fake.enqueue(json_reply(200, {"RecognitionStatus": status, "Offset": 0, "Duration": 0}))
    result = await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)
    assert result.text == "" and result.audio_seconds == 0.1


async def test_error_status_is_provider_failed(fake: FakeAzureSpeech) -> None:
    fake.enqueue(json_reply(200, {"RecognitionStatus": "Error"}))
    with pytest.raises(ProviderError) as caught:
        await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)
    assert caught.value.code == "provider_failed"


async def test_bad_key_is_unauthorized_without_the_key(fake: FakeAzureSpeech) -> None:
    stt = AzureSTT("en-US", api_key="az-wrong-Secret-zzz", base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        await stt.transcribe(b"\0\0" * 1600, 16_000)
    assert caught.value.code == "unauthorized"
    assert "az-wrong-Secret-zzz" not in str(caught.value)


async def test_rate_limited_and_server_errors(fake: FakeAzureSpeech) -> None:
    fake.enqueue(
        json_reply(429, {"error": {"code": "429", "message": "Too many requests"}},
                   headers=(("retry-after", "2"),)),
        json_reply(503, {"error": {"code": "503", "message": "Service unavailable"}}),
    )  # fmt: skip
    with pytest.raises(ProviderError) as caught:
        await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)
    assert caught.value.code == "rate_limited" and "retry after 2 s" in str(caught.value)
    with pytest.raises(ProviderError) as caught:
        await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)
    assert caught.value.code == "provider_failed" and caught.value.retryable


async def test_cut_answer_is_provider_failed(fake: FakeAzureSpeech) -> None:
    fake.enqueue(Reply(headers=(("content-type", "application/json"),),
                       chunks=(b'{"RecognitionStatus": "Succ',), cut=True))  # fmt: skip
    with pytest.raises(ProviderError) as caught:
        await stt_for(fake).transcribe(b"\0\0" * 1600, 16_000)
    assert caught.value.code == "provider_failed"


async def test_key_and_region_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_SPEECH_REGION", "WestEurope")
    monkeypatch.delenv("AZURE_SPEECH_KEY", raising=False)
    stt = AzureSTT("en-GB")
    assert stt.base_url == "https://westeurope.stt.speech.microsoft.com"
    with pytest.raises(ProviderError) as caught:
        await stt.transcribe(b"\0\0" * 160, 16_000)
    assert caught.value.code == "unauthorized" and "AZURE_SPEECH_KEY" in str(caught.value)
    monkeypatch.delenv("AZURE_SPEECH_REGION")
    with pytest.raises(ProviderError) as caught:
        AzureSTT("en-GB", api_key=KEY)
    assert caught.value.code == "invalid_settings"


@pytest.mark.parametrize(
    ("tag", "locale"),
    [("de-DE", "de-DE"), ("en_gb", "en-GB"), ("sr-latn-rs", "sr-Latn-RS"), ("es-419", "es-419"),
     ("fil-PH", "fil-PH"), ("de", "de-DE"), ("en", "en-US"), ("ja", "ja-JP")],
)  # fmt: skip
def test_supported_languages(tag: str, locale: str) -> None:
    assert AzureSTT.supports_language(tag)
    assert AzureSTT(tag, region="westeurope", api_key=KEY).language == locale


@pytest.mark.parametrize("tag", [None, "", "english", "xx", "de-DEU", "en-US-x"])
def test_unsupported_languages(tag: str | None) -> None:
    assert not AzureSTT.supports_language(tag)
    with pytest.raises(ProviderError) as caught:
        AzureSTT(tag, region="westeurope", api_key=KEY)
    assert caught.value.code == "invalid_settings"


def test_make_stt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_SPEECH_REGION", "eastus")
    azure = make_stt("azure", language="fr-FR")
    assert isinstance(azure, AzureSTT) and azure.language == "fr-FR"
    assert make_stt("azure").language == "en-US"
    openai = make_stt("openai", language="de-DE")
    assert isinstance(openai, OpenAISTT) and openai.language == "de"
    with pytest.raises(ValueError, match="unknown STT provider"):
        make_stt("kugelaudio")
