"""What every recognizer stream shares: one utterance, fed by one task at a time, closed once.

A recognizer's ``open_stream`` returns a subclass; the subclass decodes, this keeps the
rules: ``feed`` and ``finish`` refuse a second task (``trio.BusyResourceError``) and a
finished or closed stream (``trio.ClosedResourceError``), and whatever the stream holds (a
decoder, a VAD model) is given back exactly once, when it is closed and no task is inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Self

import trio

from ..telemetry import current_metrics
from ..voice.audio import pcm_seconds
from ._types import Transcript

__all__ = ["RecognizerStream", "count_decode"]


def count_decode(provider: str) -> None:
    """One pass of a recognizer's model over audio (``curb_stt_decodes``)."""
    metrics = current_metrics()
    if metrics is not None:
        metrics.decoded(provider)


class RecognizerStream:
    """The base of a recognizer's stream: ``async with stt.open_stream(rate) as stream``.

    Subclasses run each ``feed`` and ``finish`` inside ``with self._inside()`` (``finish``
    with ``finishing=True``), count the caller's audio with :meth:`_took`, and put what they
    hold back in :meth:`_release`.
    """

    def __init__(self, sample_rate_hz: int) -> None:
        self.sample_rate_hz = sample_rate_hz
        self._nbytes = 0
        self._busy = False
        self._closed = False
        self._released = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _enter(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is finished or closed")
        if self._busy:
            raise trio.BusyResourceError("another task is feeding this stream")
        self._busy = True

    @contextmanager
    def _inside(self, *, finishing: bool = False) -> Iterator[None]:
        """One task inside at a time, on a stream not yet finished; ``finishing`` finishes it."""
        self._enter()
        try:
            yield
        finally:
            if finishing:
                self._closed = True
            self._leave()

    def _leave(self) -> None:
        self._busy = False
        if self._closed and not self._released:
            # Finished, or abandoned while a task was inside: give back what it holds now.
            self._released = True
            self._release()

    def _took(self, pcm: bytes) -> None:
        """Count ``pcm`` as the caller's audio (for the transcript's length)."""
        if len(pcm) % 2:
            raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
        self._nbytes += len(pcm)

    def _transcript(self, text: str) -> Transcript:
        return Transcript(text=text, audio_seconds=pcm_seconds(self._nbytes, self.sample_rate_hz))

    def _release(self) -> None:
        """Give back what the stream holds; called once, with no task inside."""

    async def aclose(self) -> None:
        """Abandon the utterance, if unfinished, and give back what the stream holds."""
        self._closed = True
        if not self._busy:
            self._leave()
        await trio.lowlevel.checkpoint()
