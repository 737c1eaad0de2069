"""Spoken turns for the turn-taking tests and bench: whole sentences, and the same sentences cut
at a word boundary with a pause inserted (a hesitation).

A fragment synthesized on its own ("I would like to book a table for") is spoken with a
sentence's final fall and sounds finished; the same words cut out of the whole sentence keep
the rising, unfinished pitch a caller's mid-sentence pause has. Word boundaries come from
Whisper's word timestamps (faster-whisper on the packaged tiny.en), moved to the quietest
10 ms nearby so the cut falls between sounds.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import soxr

from runner.providers.espeak import EspeakTTS
from runner.providers.hibari import HibariTTS
from runner.providers.whisper import model_dir


async def say(text: str, voice: str = "hibari") -> tuple[bytes, int]:
    """``text`` spoken by ``voice`` (``"hibari"``, ``"hibari:<voice>"`` or ``"espeak:<voice>"``)."""
    engine, _, name = voice.partition(":")
    tts = HibariTTS(name or None) if engine == "hibari" else EspeakTTS(name or "en-us")
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    return pcm, tts.sample_rate_hz


@functools.cache
def _aligner() -> object:
    from faster_whisper import WhisperModel

    return WhisperModel(str(model_dir()), device="cpu", compute_type="int8", cpu_threads=1)


def word_ends_s(pcm: bytes, rate: int) -> list[tuple[str, float]]:
    """Each word Whisper hears in ``pcm`` and the time it ends, in seconds."""
    x = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    x16 = soxr.resample(x, rate, 16_000).astype(np.float32)
    segments, _ = _aligner().transcribe(x16, language="en", word_timestamps=True, beam_size=1)
    return [(re.sub(r"[^\w']", "", w.word.lower()), float(w.end)) for s in segments for w in s.words or ()]


def cut_after(pcm: bytes, rate: int, word: int) -> int:
    """The byte offset that ends the ``word``-th word (from 0): the quietest 10 ms of the last
    100 ms Whisper gives that word. Whisper tiny's word ends run late, often into the next
    word's first sound ("for f-"), which alone makes a fragment sound finished; a cut a little
    early only trims the word's fading end."""
    end_s = word_ends_s(pcm, rate)[word][1]
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    step = rate // 100
    lo = max(0, int((end_s - 0.10) * rate))
    hi = min(x.size - step, int(end_s * rate))
    starts = np.arange(lo, max(lo + 1, hi), step // 2)
    energy = [float(np.mean(x[s : s + step] ** 2)) for s in starts]
    return 2 * int(starts[int(np.argmin(energy))] + step // 2)


def silence(ms: float, rate: int) -> bytes:
    return bytes(2 * int(rate * ms / 1000))


def hum(seconds: float, rate: int) -> bytes:
    """A closed-mouth hum ("mmm", 120 Hz falling to 100): a voice the detector hears, with no words."""
    n = int(seconds * rate)
    f0 = np.linspace(132.0, 108.0, n)
    phase = np.cumsum(f0 / rate)
    x = (np.diff(np.floor(phase), prepend=0.0) > 0).astype(np.float64)  # glottal pulses
    for centre_hz, width_hz in ((250.0, 60.0), (1000.0, 200.0), (2200.0, 200.0)):
        r = np.exp(-np.pi * width_hz / rate)
        a1, a2 = 2 * r * np.cos(2 * np.pi * centre_hz / rate), -r * r
        y = np.zeros(n)
        y1 = y2 = 0.0
        for i in range(n):
            y1, y2 = (1 - r) * x[i] + a1 * y1 + a2 * y2, y1
            y[i] = y1
        x = y
    x *= np.hanning(n)
    return (x / np.abs(x).max() * 12000).astype("<i2").tobytes()
