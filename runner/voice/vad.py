"""Energy-based voice activity detection with hysteresis and an adaptive noise floor.

Pure logic over 16-bit mono PCM: no Trio, no clock. Time is counted in the audio itself,
so the same input always gives the same events at the same stream offsets.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

import attrs

from .audio import rms_dbfs

__all__ = ["EnergyVad", "VadEvent"]

_FLOOR_DBFS = -100.0


@attrs.frozen(kw_only=True)
class VadEvent:
    """A change between silence and speech.

    Attributes:
        kind: ``"speech_started"`` or ``"speech_ended"``.
        at_ms: stream time of the change, in milliseconds from the first sample fed: the
            onset of the first loud frame for a start, the end of the last loud frame for
            an end. The event itself is reported later (``min_speech_ms`` after the onset,
            ``silence_ms`` after the end), when the detector is sure.
    """

    kind: Literal["speech_started", "speech_ended"]
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
