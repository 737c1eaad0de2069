"""Hearing the caller: voice activity detection decides when they stopped, then STT.

Feed the caller's PCM frames; get :class:`SpeechStarted` as soon as they talk (a
barge-in) and a :class:`SpeechEnded` with the utterance's audio once they stop. In between,
a detector that reports pauses (Silero) gives :class:`SpeechPaused` with the utterance so
far at each short pause, and :class:`SpeechResumed` if the caller goes on: the moments to
decode speculatively. Feeding never waits on the recognizer: :meth:`Listener.transcribe`
is for a task of its own.

With turn taking by the end-of-turn model (:mod:`runner.voice.turn_taking`, the default), the
detector waits up to ``max_silence_ms``; each pause is judged by :meth:`Listener.judge` (a
task of its own, started at :class:`SpeechPaused`) and by the words decoded at it
(:meth:`Listener.heard_at`), and a frame fed once the pause is judged finished ends the turn.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ..providers import Recognizer
from . import smart_turn
from .turn_taking import EndOfTurn, TurnTaking
from .vad import Vad, make_vad

log = logging.getLogger("runner.voice")

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
    """A short pause: ``pcm`` is the utterance so far (the caller may go on).

    ``pause`` numbers it for :meth:`Listener.judge` and :meth:`Listener.heard_at`; ``at_ms`` is
    where the voice stopped, in stream time."""

    pcm: bytes
    sample_rate_hz: int
    pause: int = 0
    at_ms: float = 0.0


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
    """One caller's ear: ``turn`` says when an utterance ends.

    Args:
        stt: The recognizer.
        vad: The detector, by name (see :data:`~runner.voice.vad.VAD_KINDS`).
        turn: The turn-taking settings; ``None``: a fixed silence of ``silence_ms``.
        silence_ms: The end-of-turn silence when ``turn`` is ``None``.
        pause_ms: The pause reported as :class:`SpeechPaused` (``None``: none); only a
            pause shorter than the end-of-turn silence is one.
    """

    def __init__(
        self,
        stt: Recognizer,
        *,
        vad: str = "silero",
        turn: TurnTaking | None = None,
        silence_ms: int = 500,
        pause_ms: int | None = PAUSE_MS,
    ) -> None:
        turn = turn or TurnTaking(detection="silence", silence_ms=silence_ms)
        self._stt = stt
        self._vad_kind = vad
        self._model_path = smart_turn.model_path() if turn.detection == "smart_turn" else None
        if turn.detection == "smart_turn" and self._model_path is None:
            log.warning(
                "the end-of-turn model is not installed (pipecat-ai 1.14.0, see docs/speech.md): "
                "turns end after %d ms of silence",
                turn.silence_ms,
            )
        #: Whether the end-of-turn model judges this caller's pauses.
        self.judges = self._model_path is not None
        self._endpointer = EndOfTurn(turn) if self.judges else None
        self._silence_ms = turn.max_silence_ms if self.judges else turn.silence_ms
        self._pause_ms = pause_ms if pause_ms is not None and pause_ms < self._silence_ms else None
        self._vad: Vad | None = None
        self._rate = 0
        self._fed = 0
        self._paused = False
        self._recent = b""
        self._speech = bytearray()

    @property
    def speaking(self) -> bool:
        """Whether the caller is speaking now: an utterance is open and not in a pause."""
        return self._vad is not None and self._vad.in_speech and not self._paused

    def speech_after(self, nbytes: int) -> bytes:
        """The audio of the utterance in progress (its preroll included) after its first ``nbytes``."""
        return bytes(self._speech[nbytes:])

    def use(self, stt: Recognizer) -> None:
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
            self._fed = 0
            self._recent = b""
            self._speech.clear()
        vad = self._vad
        was_speaking = vad.in_speech
        if was_speaking:
            self._speech += pcm
        else:
            preroll = sample_rate_hz * 2 * _PREROLL_MS // 1000
            self._recent = (self._recent + pcm)[-preroll:]
        self._fed += len(pcm)
        heard: list[Heard] = []
        ending = self._endpointer
        for event in vad.feed(pcm):
            if event.kind == "speech_started":
                self._speech = bytearray(self._recent)
                self._recent = b""
                heard.append(SpeechStarted(at_ms=event.at_ms))
            elif event.kind == "speech_ended":
                heard.append(self._finish())
            elif event.kind == "pause":
                self._paused = True
                pause = ending.paused(event.at_ms) if ending is not None else 0
                heard.append(
                    SpeechPaused(
                        pcm=bytes(self._speech), sample_rate_hz=self._rate, pause=pause, at_ms=event.at_ms
                    )
                )
            else:
                self._paused = False
                if ending is not None:
                    ending.resumed()
                heard.append(SpeechResumed(at_ms=event.at_ms))
        return heard + self._end_if_due()

    def _end_if_due(self) -> list[Heard]:
        """The utterance's end, if its pause was judged the turn's end (not the detector's cap)."""
        vad, ending = self._vad, self._endpointer
        if vad is None or ending is None or not vad.in_speech or not ending.due(self._fed * 500 / self._rate):
            return []
        vad.flush()
        return [self._finish()]

    async def judge(self, paused: SpeechPaused, *, words_coming: bool = False) -> list[Heard]:
        """Have the end-of-turn model rate ``paused`` (in a worker thread). Returns the turn's
        end if the pause is long enough already; else a frame fed later may end it. Nothing
        when the model does not judge. ``words_coming``: the words up to the pause are being
        decoded, and the turn waits for them (:meth:`heard_at`)."""
        if self._endpointer is None or self._model_path is None:
            return []
        if words_coming:
            self._endpointer.expect_words(paused.pause)
        model = await trio.to_thread.run_sync(smart_turn.load, self._model_path)
        assert model is not None
        probability = await model.rate(paused.pcm, paused.sample_rate_hz)
        self._endpointer.judged(paused.pause, probability)
        return self._end_if_due()

    def heard_at(self, paused: SpeechPaused, words: str) -> list[Heard]:
        """The recognizer heard ``words`` up to ``paused``: words that stop mid-sentence hold the
        turn; others may end it now (returned), if the model judged the pause finished."""
        if self._endpointer is None:
            return []
        self._endpointer.heard(paused.pause, words)
        return self._end_if_due()

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
        self._paused = False
        if self._endpointer is not None:
            self._endpointer.resumed()
        audio, self._speech = bytes(self._speech), bytearray()
        return SpeechEnded(pcm=audio, sample_rate_hz=self._rate)

    async def transcribe(self, speech: SpeechEnded, *, prompt: str = "") -> Utterance:
        """The words of ``speech``; ``prompt``: words it likely holds (the recognizer's hint)."""
        transcript = await self._stt.transcribe(speech.pcm, speech.sample_rate_hz, prompt=prompt)
        return Utterance(text=transcript.text.strip(), audio_seconds=transcript.audio_seconds)
