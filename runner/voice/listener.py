"""Hearing the caller: voice activity detection decides when they stopped, then STT.

Feed the caller's PCM frames; get :class:`SpeechStarted` as soon as they talk (a
barge-in) and a :class:`SpeechEnded` with the utterance's audio once they stop. In between,
a detector that reports pauses (Silero) gives :class:`SpeechPaused` with the utterance so
far at each short pause, and :class:`SpeechResumed` if the caller goes on: the moments to
decode speculatively. Feeding never waits on the recognizer: :meth:`Listener.transcribe`
is for a task of its own.
"""

from __future__ import annotations

import attrs

from ..providers import STT
from .vad import Vad, make_vad

# Keep a little audio from before the detector was sure, so the first syllable is heard.
_PREROLL_MS = 300
#: A pause this long inside speech is reported (:class:`SpeechPaused`).
PAUSE_MS = 100


@attrs.frozen(kw_only=True)
class SpeechStarted:
    at_ms: float


@attrs.frozen(kw_only=True)
class SpeechEnded:
    pcm: bytes
    sample_rate_hz: int


@attrs.frozen(kw_only=True)
class SpeechPaused:
    """A short pause: ``pcm`` is the utterance so far (the caller may go on)."""

    pcm: bytes
    sample_rate_hz: int


@attrs.frozen(kw_only=True)
class SpeechResumed:
    """The caller went on after a pause: what was decoded at the pause is stale."""

    at_ms: float


@attrs.frozen(kw_only=True)
class Utterance:
    text: str
    audio_seconds: float


Heard = SpeechStarted | SpeechPaused | SpeechResumed | SpeechEnded


class Listener:
    """One caller's ear. ``silence_ms`` of quiet ends an utterance.

    Args:
        stt: The recognizer.
        vad: The detector, by name (see :data:`~runner.voice.vad.VAD_KINDS`).
        silence_ms: The end-of-turn silence.
        pause_ms: The pause reported as :class:`SpeechPaused` (``None``: none); only a
            pause shorter than ``silence_ms`` is one.
    """

    def __init__(
        self, stt: STT, *, vad: str = "silero", silence_ms: int = 500, pause_ms: int | None = PAUSE_MS
    ) -> None:
        self._stt = stt
        self._vad_kind = vad
        self._silence_ms = silence_ms
        self._pause_ms = pause_ms if pause_ms is not None and pause_ms < silence_ms else None
        self._vad: Vad | None = None
        self._rate = 0
        self._recent = b""
        self._speech = bytearray()

    def use(self, stt: STT) -> None:
        """Recognize the next utterances with ``stt`` (a live language change)."""
        self._stt = stt

    def feed(self, pcm: bytes, sample_rate_hz: int) -> list[Heard]:
        """Take one frame; return what it completed (a start, and or an utterance)."""
        if self._vad is None or sample_rate_hz != self._rate:
            if self._vad is not None:
                self._vad.close()
            self._vad = make_vad(
                self._vad_kind, sample_rate_hz, silence_ms=self._silence_ms, pause_ms=self._pause_ms
            )
            self._rate = sample_rate_hz
            self._recent = b""
            self._speech.clear()
        vad = self._vad
        was_speaking = vad.in_speech
        if was_speaking:
            self._speech += pcm
        else:
            preroll = sample_rate_hz * 2 * _PREROLL_MS // 1000
            self._recent = (self._recent + pcm)[-preroll:]
        heard: list[Heard] = []
        for event in vad.feed(pcm):
            if event.kind == "speech_started":
                self._speech = bytearray(self._recent)
                self._recent = b""
                heard.append(SpeechStarted(at_ms=event.at_ms))
            elif event.kind == "speech_ended":
                heard.append(self._finish())
            elif event.kind == "pause":
                heard.append(SpeechPaused(pcm=bytes(self._speech), sample_rate_hz=self._rate))
            else:
                heard.append(SpeechResumed(at_ms=event.at_ms))
        return heard

    def flush(self) -> list[Heard]:
        """The caller's audio ended: finish an utterance in progress."""
        if self._vad is not None and self._vad.flush():
            return [self._finish()]
        return []

    def close(self) -> None:
        """The call ended: give the detector's model back."""
        if self._vad is not None:
            self._vad.close()
            self._vad = None

    def _finish(self) -> SpeechEnded:
        audio, self._speech = bytes(self._speech), bytearray()
        return SpeechEnded(pcm=audio, sample_rate_hz=self._rate)

    async def transcribe(self, speech: SpeechEnded) -> Utterance:
        transcript = await self._stt.transcribe(speech.pcm, speech.sample_rate_hz)
        return Utterance(text=transcript.text.strip(), audio_seconds=transcript.audio_seconds)
