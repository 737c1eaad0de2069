"""Offline neural text to speech with hibari (``hibari-tts``): English, 24 kHz, ONNX on the CPU.

Only the voices inside the wheel are offered ("heart", American English): hibari fetches
its other voices from the network on first use, and this runner downloads nothing at run
time, so naming one is refused when the provider is built, which is at warm-up for an
agent's own voice. One engine per voice is loaded per process (about 0.5 s, plus about
0.9 s for its spelling-to-sound tables on the first sentence, both done at warm-up) and
shared by every call; each sentence is synthesized in a Trio worker thread (about 30 ms
for a 3 s sentence on one core) and yielded as soon as it is ready.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import trio

from ._once import LoadedOnce
from ._registry import SynthesizerProvider
from ._types import ProviderError

__all__ = ["HibariTTS", "UnsupportedVoice"]

SAMPLE_RATE_HZ = 24_000
DEFAULT_VOICE = "heart"
# Audio is yielded in pieces of this length, so a mute stops the voice within one.
_PIECE_MS = 60
# hibari starts every phrase with about 300 ms of quiet (200 ms of digital zero, then a
# fade-in of breath that stays below -50 dBFS for up to 60 ms): a reply would start that
# late. Its start is cut to _LEAD_MS before the first _WINDOW_MS louder than -50 dBFS (below
# that nothing is heard over a call), and the kept lead is ramped in so the cut makes no
# click. Its end (about 450 ms of quiet) stays, as the pause before the next sentence.
_LEAD_MS = 5
_WINDOW_MS = 5
_HEARD = 10 ** (-50 / 20)


class UnsupportedVoice(ProviderError, ValueError):
    """The voice is not one inside the hibari wheel (code ``invalid_settings``)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_settings", message)


def _registry() -> dict[str, Any]:
    from hibari.voices import VOICES

    return dict(VOICES)


def bundled_voices() -> Sequence[str]:
    """The voices inside the wheel: the only ones this runner offers."""
    return tuple(name for name, v in _registry().items() if v.get("bundled"))


def _voice_file(voice: str) -> str:
    import hibari.voices

    registry = _registry()
    if voice not in registry:
        raise UnsupportedVoice(
            f"hibari has no voice {voice!r}; this runner offers {', '.join(bundled_voices())}"
        )
    if not registry[voice].get("bundled"):
        raise UnsupportedVoice(
            f"hibari voice {voice!r} is not inside the package (hibari would download it on first "
            "use, and this runner downloads nothing at run time); this runner offers "
            + ", ".join(bundled_voices())
        )
    return os.path.join(str(hibari.voices.ASSETS), str(registry[voice]["file"]))


def _from_first_sound(wav: np.ndarray) -> np.ndarray:
    """``wav`` from _LEAD_MS before its first audible window, the lead ramped in from zero."""
    window = SAMPLE_RATE_HZ * _WINDOW_MS // 1000
    energy = np.concatenate(([0.0], np.cumsum(np.square(wav, dtype=np.float64))))
    mean_square = (energy[window:] - energy[:-window]) / window
    loud = np.flatnonzero(mean_square > _HEARD**2)
    if not loud.size:
        return wav
    lead = SAMPLE_RATE_HZ * _LEAD_MS // 1000
    start = max(0, int(loud[0]) - lead)
    wav = wav[start:].copy()
    ramp = min(lead, wav.size)
    wav[:ramp] *= np.linspace(0.0, 1.0, ramp, endpoint=False, dtype=np.float32)
    return wav


class _Engine:
    """One loaded voice; ``synthesize`` is called from worker threads, one at a time."""

    def __init__(self, voice: str) -> None:
        from hibari import Hibari

        # The model path is passed in, so hibari never looks for (or fetches) a voice itself.
        self.hibari = Hibari(voice=voice, model=_voice_file(voice), threads=1)
        self.lock = threading.Lock()

    def synthesize(self, phonemes: str) -> bytes:
        with self.lock:
            wav = np.asarray(self.hibari.from_phonemes(phonemes), dtype=np.float32)
        wav = _from_first_sound(wav)
        pcm: bytes = np.clip(np.rint(wav * 32767.0), -32768, 32767).astype("<i2").tobytes()
        return pcm

    def phonemize(self, text: str) -> list[str]:
        """The text's sentences as phoneme strings (hibari splits long ones at clauses)."""
        with self.lock:
            return [p for p in self.hibari.phonemize(text) if p]


_engines: LoadedOnce[str, _Engine] = LoadedOnce(_Engine)


class HibariTTS:
    """Text to speech with hibari's bundled neural voice; no network, no download.

    Output is 16-bit mono PCM at 24 kHz, one sentence at a time.

    Args:
        voice: a voice inside the wheel (``None`` means ``"heart"``); see :meth:`list_voices`.

    Raises:
        UnsupportedVoice: any other voice, including hibari's downloadable ones (code
            ``invalid_settings``).
    """

    provider = "hibari"
    sample_rate_hz = SAMPLE_RATE_HZ

    def __init__(self, voice: str | int | None = None) -> None:
        if voice is None:
            voice = DEFAULT_VOICE
        if not isinstance(voice, str):
            raise UnsupportedVoice(f"hibari voices are named by strings, got {voice!r}")
        _voice_file(voice)
        self.voice: str | int | None = voice
        self._voice = voice

    def __repr__(self) -> str:
        return f"HibariTTS(voice={self.voice!r})"

    @staticmethod
    def list_voices() -> Sequence[str]:
        """The voices this runner offers: those inside the wheel."""
        return bundled_voices()

    @staticmethod
    def supports_voice(voice: object) -> bool:
        """Whether ``HibariTTS(voice)`` would accept ``voice`` (for validating settings)."""
        return isinstance(voice, str) and voice in bundled_voices()

    async def warm_up(self) -> None:
        """Load the voice and its spelling-to-sound tables, and say one word."""
        async for _ in self.synthesize("Ready."):
            pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """Yield the audio of ``text``, sentence by sentence, in pieces of about 60 ms.

        Raises:
            ProviderError: hibari failed (code ``provider_failed``).
        """
        try:
            engine = _engines.loaded(self._voice)
            if engine is None:
                engine = await trio.to_thread.run_sync(_engines.get, self._voice)
            phrases = await trio.to_thread.run_sync(engine.phonemize, text)
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError("provider_failed", f"hibari could not read the text: {exc}") from exc
        piece = SAMPLE_RATE_HZ * _PIECE_MS // 1000 * 2
        for phonemes in phrases:
            try:
                pcm = await trio.to_thread.run_sync(engine.synthesize, phonemes)
            except Exception as exc:
                raise ProviderError("provider_failed", f"hibari failed to synthesize: {exc}") from exc
            for start in range(0, len(pcm), piece):
                yield pcm[start : start + piece]


def _build(voice: str | int | None, *, model: str | None) -> HibariTTS:
    return HibariTTS(voice)  # one model: ``model`` chooses nothing


def _voice_problem(voice: str | int | float) -> str | None:
    if HibariTTS.supports_voice(voice):
        return None
    return f"hibari has no voice {voice!r} here; this runner offers {', '.join(HibariTTS.list_voices())}"


PROVIDES = (SynthesizerProvider(name="hibari", build=_build, voice_problem=_voice_problem, has_models=False),)
