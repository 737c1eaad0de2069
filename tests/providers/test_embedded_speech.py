"""The embedded default speech engines: hibari's neural voice and Whisper tiny.en.

Whisper is CPU-heavy and the suite runs on two shared cores, so these tests decode as little
as they can: one sentence, one noise clip, one stream with a pause.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from runner.agent import LLM, TTS
from runner.agent._settings_live import check_update
from runner.errors import InvalidSettings
from runner.providers import Recognizer, Synthesizer, make_stt, make_tts
from runner.providers.hibari import HibariTTS, UnsupportedVoice
from runner.providers.whisper import MODEL_SHA256, ModelRefused, WhisperSTT, drop_reread, model_dir
from runner.voice.audio import resample_s16le

SENTENCE = "Thank you very much, my name is John."
WORDS = {"thank", "you", "very", "much", "my", "name", "is", "john"}
REPO = Path(__file__).resolve().parents[2]


def words(text: str) -> set[str]:
    return {w.strip(".,!?").lower() for w in text.split()} - {""}


async def speak(tts: HibariTTS, text: str) -> list[bytes]:
    return [chunk async for chunk in tts.synthesize(text)]


async def test_hibari_speaks_sentence_by_sentence_and_whisper_hears_every_word() -> None:
    tts = make_tts("hibari")
    stt = make_stt("whisper", language="en")
    assert isinstance(tts, Synthesizer) and isinstance(stt, Recognizer)
    assert (tts.provider, tts.voice, tts.sample_rate_hz) == ("hibari", "heart", 24_000)
    assert (stt.provider, stt.language) == ("whisper", "en")
    chunks = await speak(tts, SENTENCE)
    # 60 ms pieces, so a mute stops the voice within one.
    assert max(len(c) for c in chunks) == 24_000 * 60 // 1000 * 2
    pcm = b"".join(chunks)
    assert 1.5 < len(pcm) / 2 / 24_000 < 4.0
    heard = await stt.transcribe(pcm, 24_000)
    assert words(heard.text) == WORDS, heard.text
    assert heard.audio_seconds == pytest.approx(len(pcm) / 2 / 24_000)


async def test_hibari_starts_speaking_at_once() -> None:
    # hibari leads every phrase with about 300 ms of quiet, then up to 60 ms of breath below
    # -50 dBFS: a reply would start that late.
    pcm = np.frombuffer(b"".join(await speak(HibariTTS(), SENTENCE)), "<i2")
    frame = 24_000 * 10 // 1000
    levels = [
        np.sqrt(np.mean(np.square(pcm[i : i + frame], dtype=np.float64))) for i in range(0, 30 * frame, frame)
    ]
    first_sound_ms = 10 * next(i for i, level in enumerate(levels) if level > 32768 * 10 ** (-45 / 20))
    assert first_sound_ms <= 30  # was 310; 70 from the first sample over -60 dBFS, 90 with 30 ms more


async def test_whisper_takes_a_prompt_as_the_text_before_the_speech() -> None:
    tts = HibariTTS()
    pcm = b"".join([chunk async for chunk in tts.synthesize("Uh-huh.")])
    stt = WhisperSTT()
    plain = await stt.transcribe(pcm, tts.sample_rate_hz)
    hinted = await stt.transcribe(pcm, tts.sample_rate_hz, prompt="Mm-hm. Uh-huh. Yeah.")
    assert "uh-huh" not in plain.text.lower()  # tiny.en alone hears "It's hot."
    assert hinted.text.lower().strip(".") == "uh-huh"


async def test_whisper_hears_no_words_in_silence_or_noise() -> None:
    stt = WhisperSTT()
    rng = np.random.default_rng(7)
    for clip, rate in (
        (bytes(2 * 16_000), 16_000),  # digital silence
        (
            np.clip(rng.normal(0, 3000, 48_000), -32768, 32767).astype("<i2").tobytes(),
            16_000,
        ),  # -21 dBFS hiss
    ):
        heard = await stt.transcribe(clip, rate)
        assert heard.text == ""
        assert heard.audio_seconds == pytest.approx(len(clip) / 2 / rate)


async def test_a_stream_decodes_at_the_pause_and_its_end_reuses_that_decode() -> None:
    tts = HibariTTS()
    sentence = resample_s16le(b"".join(await speak(tts, SENTENCE)), 24_000, 16_000)
    clip = bytes(16_000) + sentence + bytes(16_000)  # 0.5 s of quiet each side
    stt = WhisperSTT()
    partials: list[str] = []
    async with stt.open_stream(16_000) as stream:
        for start in range(0, len(clip), 3_200):
            text = await stream.feed(clip[start : start + 3_200])
            if text:
                partials.append(text)
        transcript = await stream.finish()
    assert len(partials) == 1 and words(partials[0]) == WORDS, partials
    # Nothing was said after the pause's decode: the end needs none of its own.
    assert stream.decodes == 1
    assert transcript.text == partials[0]
    assert transcript.audio_seconds == pytest.approx(len(clip) / 2 / 16_000)


async def test_a_stream_of_silence_decodes_nothing() -> None:
    async with WhisperSTT().open_stream(48_000) as stream:
        for _ in range(50):
            assert await stream.feed(bytes(1_920)) is None
        transcript = await stream.finish()
    assert (transcript.text, stream.decodes) == ("", 0)
    assert transcript.audio_seconds == pytest.approx(1.0)


async def test_whisper_reads_a_window_as_long_as_the_utterance_and_30_s_at_most() -> None:
    from runner.providers.whisper import PAD_S, _models

    tts = HibariTTS()
    sentence = resample_s16le(b"".join(await speak(tts, SENTENCE)), 24_000, 16_000)
    model = _models.get(model_dir())
    audio = np.frombuffer(sentence, "<i2").astype(np.float32) / 32768.0
    # About 2.4 s of speech: one window of the speech and PAD_S of silence (in 10 ms
    # frames, whole seconds), not Whisper's 3,000.
    [(features, frames)] = model.encoder_inputs(audio)
    assert frames == audio.size // 160
    assert features.shape == (1, 80, 100 * math.ceil(frames / 100 + PAD_S))
    # 35 s with a sentence at each end: two windows (30 s, then the rest), both heard.
    clip = sentence + bytes(2 * 16_000 * 35 - 2 * len(sentence)) + sentence
    assert [f.shape[-1] for f, _ in model.encoder_inputs(np.frombuffer(clip, "<i2") / 32768.0)] == [
        3_000,
        100 * math.ceil(len(clip) // 2 // 160 / 100 - 30 + PAD_S),
    ]
    heard = await WhisperSTT().transcribe(clip, 16_000)
    assert heard.text.lower().count("john") == 2, heard.text


def test_a_transcript_that_starts_over_keeps_its_first_reading() -> None:
    assert drop_reread("Please call a taxi. please call a") == "Please call a taxi."
    assert drop_reread("Where is it? Where is it? Where is") == "Where is it?"
    # Speech that repeats a word or two, or repeats later on, is kept.
    for said in ("No, no.", "Thank you. Thank you.", "I said I said it", "Yes. Call a taxi, call a taxi."):
        assert drop_reread(said) == said


def _model_copy(tmp_path: Path, *, change: str | None = None, drop: str | None = None) -> Path:
    # The big weights are linked, not copied; the one file a test changes is a real copy.
    copy = tmp_path / "model"
    copy.mkdir()
    for name in MODEL_SHA256:
        if name == drop:
            continue
        source = model_dir() / name
        if name == change:
            data = bytearray(source.read_bytes())
            data[len(data) // 2] ^= 0x01  # one bit
            (copy / name).write_bytes(bytes(data))
        else:
            os.symlink(source, copy / name)
    return copy


async def test_whisper_refuses_a_model_file_whose_hash_differs(tmp_path: Path) -> None:
    changed = _model_copy(tmp_path, change="model.bin")
    with pytest.raises(ModelRefused) as refused:
        await WhisperSTT(directory=changed).warm_up()
    assert refused.value.code == "unavailable"
    assert "model.bin" in str(refused.value) and MODEL_SHA256["model.bin"] in str(refused.value)
    with pytest.raises(ModelRefused) as refused:
        await WhisperSTT(directory=changed).transcribe(bytes(3200), 16_000)
    # A missing file is refused the same way.
    missing = tmp_path / "missing"
    missing.mkdir()
    with pytest.raises(ModelRefused, match=r"no tokenizer\.json"):
        await WhisperSTT(directory=_model_copy(missing, drop="tokenizer.json")).warm_up()


def test_the_packaged_model_is_the_recorded_one() -> None:
    from runner.providers.whisper import check_model

    check_model(model_dir())


def test_whisper_takes_the_languages_it_knows() -> None:
    # Other languages than English: tests/providers/test_multilingual.py.
    for language in (None, "en", "en-US", "EN-gb"):
        assert WhisperSTT(language).language == language
    with pytest.raises(ValueError, match="no language 'klingon'"):
        make_stt("whisper", language="klingon")


def test_only_voices_inside_the_wheel_are_offered() -> None:
    assert HibariTTS.list_voices() == ("heart",)
    assert HibariTTS.supports_voice("heart") and not HibariTTS.supports_voice("emma")
    with pytest.raises(UnsupportedVoice, match="'emma' is not inside the package") as refused:
        make_tts("hibari", voice="emma")
    assert refused.value.code == "invalid_settings"
    with pytest.raises(UnsupportedVoice, match="no voice 'nobody'"):
        HibariTTS("nobody")
    with pytest.raises(UnsupportedVoice):
        HibariTTS(3)


def test_a_live_voice_change_to_a_downloadable_voice_is_invalid_settings() -> None:
    current = (LLM(provider="local", model="local"), TTS(provider="hibari", voice="heart"), None)
    with pytest.raises(InvalidSettings) as refused:
        check_update(
            {"tts": {"voice": "emma"}},
            origin="host",
            adjustable=("tts.voice",),
            current=current,
            author_llm=current[0],
        )
    assert refused.value.issues[0].path == ["tts", "voice"]
    assert "offers heart" in refused.value.issues[0].message
    accepted = check_update(
        {"tts": {"voice": "heart"}},
        origin="host",
        adjustable=("tts.voice",),
        current=current,
        author_llm=current[0],
    )
    assert accepted.voice == "heart"


def test_a_runner_whose_agent_names_a_downloadable_voice_refuses_at_warm_up(tmp_path: Path) -> None:
    agent = tmp_path / "far_voice.py"
    agent.write_text(
        textwrap.dedent(
            """
            from runner.agent import LLM, TTS, Agent

            agent = Agent(
                "far", llm=LLM(provider="local", model="local"), tts=TTS(provider="hibari", voice="emma")
            )
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "runner", "serve", f"{agent}:agent", "--address", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 1, done.stderr
    assert "curb-hosted" not in done.stdout  # never ready
    assert "hibari voice 'emma' is not inside the package" in done.stderr
    assert "Traceback" not in done.stderr
