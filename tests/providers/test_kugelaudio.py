"""KugelAudio streaming TTS and voice listing against a local fake of its WebSocket and REST API."""

from __future__ import annotations

import math
import struct
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
import trio
from fake_servers import json_reply, open_fake_server
from fake_speech_servers import (
    FakeKugelAudio,
    WsScript,
    kugel_audio_frame,
    kugel_final,
)

from runner.providers import KugelAudioTTS, KugelAudioVoice, ProviderError, Synthesizer, make_tts

KEY = "kg-test-Secret-0123456789abcdef"
VOICES = [
    {"id": 268, "name": "Max", "supported_languages": ["de", "en"], "is_public": True},
    {"id": 1001, "name": "Mine", "supported_languages": ["en"]},
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeKugelAudio]:
    service = FakeKugelAudio(api_key=KEY, voices=VOICES)
    async with open_fake_server(service) as root:
        service.root = root
        yield service


def tts_for(fake: FakeKugelAudio, voice: int | str = 268, **kwargs: object) -> KugelAudioTTS:
    return KugelAudioTTS(voice, api_key=KEY, base_url=fake.base_url, **kwargs)


def tone(n: int, rate: int = 24_000) -> bytes:
    return struct.pack(f"<{n}h", *(int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(n)))


async def collect_until_error(tts: KugelAudioTTS, text: str) -> tuple[list[bytes], ProviderError]:
    chunks: list[bytes] = []
    with pytest.raises(ProviderError) as caught:
        async with aclosing(tts.synthesize(text)) as stream:
            async for chunk in stream:
                chunks.append(chunk)
    return chunks, caught.value


async def test_request_carries_voice_model_and_key(fake: FakeKugelAudio) -> None:
    tts = tts_for(fake, "268", model="kugel-2-turbo", language="de")
    assert isinstance(tts, Synthesizer)
    assert tts.voice == 268 and tts.sample_rate_hz == 24_000
    audio = b"".join([c async for c in tts.synthesize("Hallo Welt")])
    session = fake.sessions[-1]
    assert session.path == "/ws/tts"
    assert session.query["api_key"] == KEY
    assert session.query["model_id"] == "kugel-2-turbo"
    assert session.request["voice_id"] == 268
    assert session.request["text"] == "Hallo Welt"
    assert session.request["model_id"] == "kugel-2-turbo"
    assert session.request["sample_rate"] == 24_000
    assert session.request["language"] == "de"
    # The default script answers the text's bytes, split in two chunks (each padded to 8).
    assert audio == b"Hallo".ljust(8, b"\0") + b" Welt".ljust(8, b"\0")


async def test_audio_arrives_before_the_stream_ends(fake: FakeKugelAudio) -> None:
    gate = trio.Event()
    first, second = tone(480), tone(960)[960:]
    fake.script(
        WsScript(
            frames=(kugel_audio_frame(first, 0), kugel_audio_frame(second, 1), kugel_final(2)),
            gate=gate,
        )
    )
    chunks = []
    with trio.fail_after(5):
        async with aclosing(tts_for(fake).synthesize("Hello there.")) as stream:
            async for chunk in stream:
                chunks.append(chunk)
                # The server holds the rest until it is told the first chunk arrived.
                gate.set()
    assert chunks == [first, second]


async def test_odd_sized_chunks_are_yielded_as_whole_samples(fake: FakeKugelAudio) -> None:
    pcm = tone(100)
    fake.script(
        WsScript(frames=(kugel_audio_frame(pcm[:51], 0), kugel_audio_frame(pcm[51:], 1), kugel_final(2)))
    )
    chunks = [c async for c in tts_for(fake).synthesize("Hi.")]
    assert all(len(c) % 2 == 0 for c in chunks)
    assert b"".join(chunks) == pcm


async def test_audio_at_another_rate_is_resampled(fake: FakeKugelAudio) -> None:
    pcm = tone(4800, 48_000)
    fake.script(WsScript(frames=(kugel_audio_frame(pcm, 0, sr=48_000), kugel_final(1))))
    audio = b"".join([c async for c in tts_for(fake).synthesize("Hi.")])
    assert len(audio) // 2 == 2400


async def test_bad_key_on_the_upgrade_is_unauthorized(fake: FakeKugelAudio) -> None:
    tts = KugelAudioTTS(268, api_key="kg-wrong-Secret-zzz", base_url=fake.base_url)
    chunks, error = await collect_until_error(tts, "Hello.")
    assert chunks == []
    assert error.code == "unauthorized"
    assert "kg-wrong-Secret-zzz" not in str(error)


async def test_rate_limited_upgrade(fake: FakeKugelAudio) -> None:
    fake.script(
        WsScript(
            reject=429,
            reject_headers=(("retry-after", "3"), ("content-type", "application/json")),
            reject_body=b'{"detail": "Too many requests"}',
        )
    )
    _, error = await collect_until_error(tts_for(fake), "Hello.")
    assert error.code == "rate_limited" and error.retryable
    assert "retry after 3 s" in str(error)


async def test_error_frame_quoting_the_key_is_redacted(fake: FakeKugelAudio) -> None:
    fake.script(
        WsScript(
            frames=(
                kugel_audio_frame(tone(10), 0),
                {"error": f"generation failed for {KEY}", "error_code": "INTERNAL_ERROR",
                 "code": 500},
            )
        )
    )  # fmt: skip
    chunks, error = await collect_until_error(tts_for(fake), "Hello.")
    assert chunks == [tone(10)]
    assert error.code == "provider_failed" and error.retryable
    assert "INTERNAL_ERROR" in str(error)
    assert KEY not in str(error) and "[redacted]" in str(error)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"error": "slow down", "error_code": "RATE_LIMITED", "code": 429}, "rate_limited"),
        ({"error": "bad key", "error_code": "UNAUTHORIZED", "code": 401}, "unauthorized"),
        ({"error": "no voice", "error_code": "MISSING_VOICE_ID", "code": 400}, "provider_failed"),
    ],
)
async def test_error_frames_are_mapped(fake: FakeKugelAudio, frame: dict[str, object], code: str) -> None:
    fake.script(WsScript(frames=(frame,)))
    _, error = await collect_until_error(tts_for(fake), "Hello.")
    assert error.code == code


@pytest.mark.parametrize(
    ("close_code", "code"),
    [(4001, "unauthorized"), (4029, "rate_limited"), (4003, "provider_failed")],
)
async def test_close_codes_are_mapped(fake: FakeKugelAudio, close_code: int, code: str) -> None:
    fake.script(WsScript(close_code=close_code, close_reason="closing"))
    _, error = await collect_until_error(tts_for(fake), "Hello.")
    assert error.code == code
    assert f"close {close_code}" in str(error)


async def test_stream_closed_before_final_yields_then_raises(fake: FakeKugelAudio) -> None:
    fake.script(WsScript(frames=(kugel_audio_frame(tone(20), 0),), close_code=1000))
    chunks, error = await collect_until_error(tts_for(fake), "Hello.")
    assert chunks == [tone(20)]
    assert error.code == "provider_failed" and error.retryable
    assert "before it ended" in str(error)


async def test_stream_cut_mid_reply_yields_then_raises(fake: FakeKugelAudio) -> None:
    fake.script(WsScript(frames=(kugel_audio_frame(tone(20), 0),), crash=True))
    chunks, error = await collect_until_error(tts_for(fake), "Hello.")
    assert chunks == [tone(20)]
    assert error.code == "provider_failed"


async def test_malformed_audio_frame(fake: FakeKugelAudio) -> None:
    fake.script(WsScript(frames=({"audio": "%%%not base64", "idx": 0, "sr": 24000},)))
    _, error = await collect_until_error(tts_for(fake), "Hello.")
    assert error.code == "provider_failed" and "base64" in str(error)


async def test_silent_server_times_out(fake: FakeKugelAudio) -> None:
    fake.script(WsScript(frames=(kugel_audio_frame(tone(4), 0),)))
    chunks, error = await collect_until_error(tts_for(fake, idle_timeout_s=0.2), "Hello.")
    assert chunks == [tone(4)]
    assert error.code == "provider_failed" and "stopped sending" in str(error)


async def test_leaving_early_closes_the_session(fake: FakeKugelAudio) -> None:
    gate = trio.Event()  # never set: the server would wait forever
    fake.script(WsScript(frames=(kugel_audio_frame(tone(8), 0), kugel_audio_frame(tone(8), 1)), gate=gate))
    with trio.fail_after(5):
        async with aclosing(tts_for(fake).synthesize("Hello.")) as stream:
            async for chunk in stream:
                assert chunk == tone(8)
                break
    # The service still answers the next request.
    audio = b"".join([c async for c in tts_for(fake).synthesize("ab")])
    assert audio == b"a".ljust(8, b"\0") + b"b".ljust(8, b"\0")


async def test_connect_failure_is_unavailable() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tts = KugelAudioTTS(268, api_key=KEY, base_url=f"http://127.0.0.1:{port}")
    _, error = await collect_until_error(tts, "Hello.")
    assert error.code == "unavailable"


async def test_key_from_the_environment_and_missing_key(
    fake: FakeKugelAudio, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUGELAUDIO_API_KEY", KEY)
    audio = [c async for c in KugelAudioTTS(268, base_url=fake.base_url).synthesize("xy")]
    assert audio and fake.sessions[-1].query["api_key"] == KEY
    monkeypatch.delenv("KUGELAUDIO_API_KEY")
    _, error = await collect_until_error(KugelAudioTTS(268, base_url=fake.base_url), "xy")
    assert error.code == "unauthorized" and "KUGELAUDIO_API_KEY" in str(error)


def test_region_prefix_of_the_key_picks_the_eu_host() -> None:
    tts = KugelAudioTTS(268, api_key="eu-" + KEY)
    assert tts.base_url == "https://api.eu.kugelaudio.com"
    assert KEY not in repr(tts)


@pytest.mark.parametrize("voice", ["alloy", "12a", "", -1, True, 1.5])
def test_voice_must_be_numeric(voice: object) -> None:
    with pytest.raises(ProviderError) as caught:
        KugelAudioTTS(voice, api_key=KEY)
    assert caught.value.code == "invalid_settings"


async def test_list_voices(fake: FakeKugelAudio) -> None:
    voices = await tts_for(fake).list_voices(language="de")
    assert voices == (
        KugelAudioVoice(id=268, name="Max", supported_languages=("de", "en"), is_public=True),
        KugelAudioVoice(id=1001, name="Mine", supported_languages=("en",)),
    )
    request = fake.requests[-1]
    assert request.path == "/v1/voices"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["x-api-key"] == KEY


async def test_list_voices_errors(fake: FakeKugelAudio) -> None:
    bad = KugelAudioTTS(268, api_key="kg-wrong-Secret-zzz", base_url=fake.base_url)
    with pytest.raises(ProviderError) as caught:
        await bad.list_voices()
    assert caught.value.code == "unauthorized" and "kg-wrong" not in str(caught.value)
    fake.enqueue(json_reply(429, {"detail": "Too many requests"}))
    with pytest.raises(ProviderError) as caught:
        await tts_for(fake).list_voices()
    assert caught.value.code == "rate_limited"


def test_make_tts_kugelaudio() -> None:
    tts = make_tts("kugelaudio", voice="268", model="kugel-2-turbo")
    assert isinstance(tts, KugelAudioTTS) and tts.voice == 268 and tts.model == "kugel-2-turbo"
    with pytest.raises(ProviderError) as caught:
        make_tts("kugelaudio")
    assert caught.value.code == "invalid_settings"
    with pytest.raises(ProviderError):
        make_tts("kugelaudio", voice="Max")


def test_make_tts_other_providers() -> None:
    openai = make_tts("openai", voice="nova")
    assert openai.provider == "openai" and openai.voice == "nova"
    assert make_tts("espeak", voice="de").voice == "de"
    with pytest.raises(ValueError, match="unknown TTS provider"):
        make_tts("azure")
