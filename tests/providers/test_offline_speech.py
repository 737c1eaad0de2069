import itertools
import os
import sys
import time

import numpy as np
import pytest
import trio

from runner.providers import ProviderError, Recognizer, Synthesizer, Transcript
from runner.providers.espeak import EspeakTTS, UnsupportedVoice
from runner.providers.pocketsphinx import PocketsphinxSTT, UnsupportedLanguage
from runner.voice.audio import frames, pcm_seconds, resample_s16le

# espeak's US English with the f2 variant is the voice the wheel's US English model
# understands best; plain "en" or "en-us" male voices lose most words. espeak varies its
# output from call to call, so the sentence is one that survives that (measured: at
# least 5 of its 8 words in 8 of 8 runs, whole and streamed).
CLEAR_VOICE = "en-us+f2"
SENTENCE = "Thank you very much, my name is John."
WORDS = {"thank", "you", "very", "much", "my", "name", "is", "john"}


def silence(seconds: float, rate: int = 22_050) -> bytes:
    return bytes(2 * int(rate * seconds))


async def speak(tts: EspeakTTS, text: str) -> bytes:
    return b"".join([chunk async for chunk in tts.synthesize(text)])


def pitch_hz(pcm: bytes, rate: int) -> float:
    """Median autocorrelation pitch of the loud, periodic 40 ms frames."""
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    size = int(0.04 * rate)
    lo, hi = rate // 400, rate // 60
    found = []
    for start in range(0, x.size - size, size // 2):
        f = x[start : start + size]
        if np.sqrt(np.mean(f**2)) < 1_000:
            continue
        f = f - f.mean()
        ac = np.correlate(f, f, "full")[size - 1 :]
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.3 * ac[0]:
            found.append(rate / lag)
    assert len(found) > 10
    return float(np.median(found))


def overlap(heard: str) -> set[str]:
    return WORDS & set(heard.lower().split())


# --- espeak ---------------------------------------------------------------------------


async def test_espeak_speaks_a_sentence_as_22050_hz_pcm_in_chunks() -> None:
    tts = EspeakTTS("en-us")
    assert isinstance(tts, Synthesizer)
    assert (tts.provider, tts.voice, tts.sample_rate_hz) == ("espeak", "en-us", 22_050)

    chunks = [chunk async for chunk in tts.synthesize("The weather is sunny today.")]
    pcm = b"".join(chunks)

    assert len(chunks) > 5
    assert all(len(c) % 2 == 0 for c in chunks)
    assert 1.0 < pcm_seconds(len(pcm), 22_050) < 3.5
    level = np.sqrt(np.mean(np.frombuffer(pcm, "<i2").astype(np.float64) ** 2))
    assert level > 1_000  # audible, not silence


async def test_espeak_speaks_every_sentence_of_a_longer_text() -> None:
    tts = EspeakTTS("en")
    one = await speak(tts, "Good morning.")
    three = await speak(tts, "Good morning. How are you today? I am fine!")
    assert pcm_seconds(len(three), 22_050) > 2.5 * pcm_seconds(len(one), 22_050)
    assert await speak(tts, "   ") == b""


async def test_espeak_variants_differ_in_pitch() -> None:
    text = "The weather is sunny today."
    male = pitch_hz(await speak(EspeakTTS("en-us"), text), 22_050)
    female = pitch_hz(await speak(EspeakTTS("en-us+f3"), text), 22_050)
    assert 70 < male < 150
    assert female > 1.5 * male


async def test_espeak_instances_with_different_voices_can_run_at_once() -> None:
    results: dict[str, float] = {}

    async def one(voice: str) -> None:
        pcm = await speak(EspeakTTS(voice), "Sunny today, rainy tomorrow.")
        results[voice] = pitch_hz(pcm, 22_050)

    async with trio.open_nursery() as nursery:
        for voice in ("en", "en+f4", "en", "en+f4"):
            nursery.start_soon(one, voice)
    assert results["en+f4"] > 1.5 * results["en"]


@pytest.mark.parametrize(
    "voice",
    [
        "en",
        "en-us",
        "EN-US",
        "de",
        "fr",
        "en+f3",
        "en-us+klatt3",
        "English (America)",
        "gmw/en-US",
        "en-gb",
    ],
)
def test_espeak_accepts_its_voices(voice: str) -> None:
    assert EspeakTTS.supports_voice(voice)
    assert EspeakTTS(voice).voice == voice


@pytest.mark.parametrize("voice", ["xx", "zz-yy", "en+nosuchvariant", "f3", "+f3", "en+", ""])
def test_espeak_refuses_unknown_voices_at_construction(voice: str) -> None:
    assert not EspeakTTS.supports_voice(voice)
    with pytest.raises(UnsupportedVoice) as caught:
        EspeakTTS(voice)
    assert caught.value.code == "invalid_settings"
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ProviderError)


def test_espeak_lists_voices_and_variants() -> None:
    voices = {v.short_name for v in EspeakTTS.list_voices()}
    variants = {v.short_name for v in EspeakTTS.list_variants()}
    assert {"en", "en-US", "de", "fr"} <= voices
    assert {"f3", "m3", "klatt"} <= variants
    assert not voices & variants
    with pytest.raises(ValueError):
        EspeakTTS("en", rate_wpm=20)


# --- pocketsphinx ---------------------------------------------------------------------


async def test_pocketsphinx_transcribes_espeak_speech() -> None:
    stt = PocketsphinxSTT()
    assert isinstance(stt, Recognizer)
    assert (stt.provider, stt.language) == ("pocketsphinx", None)
    pcm = await speak(EspeakTTS(CLEAR_VOICE), SENTENCE)
    padded = silence(0.5) + pcm + silence(0.5)

    heard = await stt.transcribe(padded, 22_050)

    assert len(overlap(heard.text)) >= 4, heard.text
    assert heard.audio_seconds == pytest.approx(pcm_seconds(len(padded), 22_050))


async def test_pocketsphinx_takes_44100_hz() -> None:
    pcm = resample_s16le(await speak(EspeakTTS(CLEAR_VOICE), SENTENCE), 22_050, 44_100)
    heard = await PocketsphinxSTT("en").transcribe(pcm, 44_100)
    assert len(overlap(heard.text)) >= 4, heard.text


async def test_pocketsphinx_takes_telephone_audio() -> None:
    # 8 kHz audio has nothing above 4 kHz where this wideband model looks, so words are
    # often wrong (measured: about a quarter right); it is still heard as speech.
    pcm = resample_s16le(await speak(EspeakTTS(CLEAR_VOICE), SENTENCE), 22_050, 8_000)
    heard = await PocketsphinxSTT().transcribe(pcm, 8_000)
    assert heard.text
    assert heard.audio_seconds == pytest.approx(pcm_seconds(len(pcm), 8_000))


async def test_pocketsphinx_streams_partials_then_a_final_transcript() -> None:
    stt = PocketsphinxSTT()
    pcm = silence(0.2) + await speak(EspeakTTS(CLEAR_VOICE), SENTENCE) + silence(0.5)

    # An abandoned stream hands its decoder back mid-utterance; the next must not mind.
    async with stt.open_stream(22_050) as abandoned:
        for frame in list(frames(pcm, 22_050, 20))[:60]:
            await abandoned.feed(frame)

    partials: list[str] = []
    async with stt.open_stream(22_050) as stream:
        for frame in frames(pcm, 22_050, 20):
            partial = await stream.feed(frame)
            if partial is not None:
                partials.append(partial)
        final = await stream.finish()
        with pytest.raises(trio.ClosedResourceError):
            await stream.feed(bytes(640))

    assert partials, "no partial hypothesis while audio arrived"
    assert all(a != b for a, b in itertools.pairwise(partials))  # only when changed
    assert isinstance(final, Transcript)
    assert len(overlap(final.text)) >= 4, final.text
    assert final.audio_seconds == pytest.approx(pcm_seconds(len(pcm), 22_050), abs=0.02)


async def test_pocketsphinx_on_silence_and_nothing() -> None:
    stt = PocketsphinxSTT()
    assert await stt.transcribe(b"", 16_000) == Transcript(text="", audio_seconds=0.0)
    async with stt.open_stream(16_000) as stream:
        assert await stream.finish() == Transcript(text="", audio_seconds=0.0)


def test_pocketsphinx_takes_only_english_and_known_rates() -> None:
    assert PocketsphinxSTT.supports_language(None)
    assert PocketsphinxSTT.supports_language("en")
    assert PocketsphinxSTT.supports_language("en-US")
    assert not PocketsphinxSTT.supports_language("de")
    with pytest.raises(UnsupportedLanguage) as caught:
        PocketsphinxSTT("de")
    assert caught.value.code == "invalid_settings"
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ValueError, match="11025"):
        PocketsphinxSTT().open_stream(11_025)


async def test_pocketsphinx_decodes_a_long_utterance_without_stalling_the_event_loop() -> None:
    # The decoder holds the GIL while it decodes; in a thread, this decode stopped every
    # other task of the runner for over a second. Off the process, it costs this process no
    # CPU: counted in CPU time, which (unlike the loop's gaps) a loaded machine does not move.
    stt = PocketsphinxSTT()
    await stt.warm_up()
    pcm = await speak(EspeakTTS(CLEAR_VOICE), " ".join([SENTENCE] * 3))
    cpu = time.process_time()
    heard = await stt.transcribe(pcm, 22_050)
    spent = time.process_time() - cpu
    assert len(overlap(heard.text)) >= 4, heard.text
    # The decode itself costs about 4 s of CPU (3.9 s measured in this process).
    assert spent < 0.5, f"{spent:.2f} s of this process's CPU during the decode"


async def test_pocketsphinx_streams_at_16000_hz() -> None:
    stt = PocketsphinxSTT()
    pcm = resample_s16le(
        silence(0.2) + await speak(EspeakTTS(CLEAR_VOICE), SENTENCE) + silence(0.5),
        22_050,
        16_000,
    )
    async with stt.open_stream(16_000) as stream:
        for frame in frames(pcm, 16_000, 20):
            await stream.feed(frame)
        final = await stream.finish()
    assert len(overlap(final.text)) >= 4, final.text
    assert final.audio_seconds == pytest.approx(pcm_seconds(len(pcm), 16_000), abs=0.02)


@pytest.mark.parametrize("rate", [16_000, 22_050])
async def test_pocketsphinx_hears_nothing_in_digital_silence(rate: int) -> None:
    # Unchecked, the decoder hears a word in it ("it", "dog").
    stt = PocketsphinxSTT()
    quiet = silence(2.0, rate)
    assert await stt.transcribe(quiet, rate) == Transcript(text="", audio_seconds=2.0)
    async with stt.open_stream(rate) as stream:
        partials = [await stream.feed(frame) for frame in frames(quiet, rate, 20)]
        assert await stream.finish() == Transcript(text="", audio_seconds=2.0)
    assert partials == [None] * len(partials)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="looks in /proc")
async def test_pocketsphinx_worker_process_ends_with_the_runner() -> None:
    script = (
        "import os, trio, trio_parallel\n"
        "from runner.providers.pocketsphinx import PocketsphinxSTT\n"
        "async def main():\n"
        "    heard = await PocketsphinxSTT().transcribe(bytes(32_000) + b'\\x10\\x27' * 8_000, 16_000)\n"
        "    print(await trio_parallel.run_sync(os.getpid), os.getpid(), repr(heard.text))\n"
        "trio.run(main)\n"
    )
    done = await trio.run_process([sys.executable, "-c", script], capture_stdout=True, capture_stderr=True)
    worker, runner, _ = done.stdout.decode().split(maxsplit=2)
    assert worker != runner  # decoded in another process...
    assert done.stderr == b""
    assert not os.path.exists(f"/proc/{worker}")  # ...which is gone with the runner
