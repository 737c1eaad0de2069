"""The caller's audio: one caller's microphone track at a time, read on the session's loop
and reported frame by frame."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from livekit import rtc

from ...sessions import AudioFrame, TransportEvent

# The caller's audio at the rate the recognizers and Silero work at: WebRTC's sink resamples
# Opus's 48 kHz as it hands each frame over, where a streaming resampler in the runner would
# cost CPU per frame and could hold audio back (soxr's high quality: 20 ms on average).
AUDIO_IN_RATE_HZ = 16_000
# The frames WebRTC's playout clock makes: a longer one would wait for its second half.
AUDIO_IN_FRAME_MS = 10


class CallerAudio:
    """Listens to one caller track (on the loop).

    Args:
        spawn: Starts a task on the loop that the session cancels when it leaves.
        emit: Reports an event to the session (in Trio).
    """

    def __init__(
        self,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        emit: Callable[[TransportEvent], None],
    ) -> None:
        self._spawn = spawn
        self._emit = emit
        self._task: asyncio.Task[None] | None = None
        self.listening_to: str | None = None
        """The identity of the caller whose track is read."""

    def listen(self, track: rtc.Track, identity: str) -> None:
        """Read ``track`` of ``identity``, unless a caller's track is read already."""
        if self._task is not None and not self._task.done():
            return  # one caller track at a time
        self.listening_to = identity
        self._task = self._spawn(self._read(track))

    def stop(self) -> None:
        """Stop reading the caller's track."""
        if self._task is not None:
            self._task.cancel()
        self._task = None
        self.listening_to = None

    async def _read(self, track: rtc.Track) -> None:
        stream = rtc.AudioStream(
            track, sample_rate=AUDIO_IN_RATE_HZ, num_channels=1, frame_size_ms=AUDIO_IN_FRAME_MS
        )
        try:
            async for event in stream:
                frame = event.frame
                self._emit(AudioFrame(pcm=bytes(frame.data), sample_rate_hz=frame.sample_rate))
        finally:
            await stream.aclose()
