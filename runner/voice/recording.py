"""A turn whose boundaries the transport draws: the caller's audio between a start and an end.

The agent WebSocket's client says where its caller's turn starts and ends
(``user_audio.start`` / ``user_audio.end``: ino.v2 puts no voice detection on the server), so
the pipeline takes those boundaries instead of its own detector's. A :class:`Recording` keeps
the audio between them; a recognizer that streams hears it as it arrives (its words so far
go to ``on_partial``, for barge-in), and its ``finish`` is the turn's transcript, so the audio
is not decoded twice. One that does not stream decodes the whole recording at the end.

The voice pipeline records each utterance its own detector finds the same way, when the
call's recognizer streams (:class:`~.pipeline.VoicePipeline`): at a pause it takes the
stream's words so far (:meth:`Recording.words_so_far`), at the end its ``finish``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from ..providers import ProviderError, Recognizer, SpeechStream
from .audio import pcm_seconds, rms_dbfs

__all__ = ["SILENCE_DBFS", "Recording"]

log = logging.getLogger("runner.voice")

#: A recording quieter than this (RMS) is digital silence: no words, whatever a model makes of it.
SILENCE_DBFS = -70.0


class _StreamedWords:
    """What the recognizer stream heard in all of the recording, once it finished."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._text = ""
        self._error: ProviderError | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def set(self, text: str) -> None:
        if not self._done.is_set():
            self._text = text
            self._done.set()

    def fail(self, error: ProviderError) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> str:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._text


class Recording:
    """The caller's audio of one transport-delimited turn, recognized as it comes if it can be.

    Args:
        stt: The recognizer.
        rate_hz: The audio's sample rate.
    """

    def __init__(self, stt: Recognizer, rate_hz: int) -> None:
        self.stt = stt
        self.rate_hz = rate_hz
        self.audio = bytearray()
        self._feed: trio.MemorySendChannel[bytes] | None = None
        self._scope = trio.CancelScope()
        self._streamed: _StreamedWords | None = None
        # What the stream heard so far, and in how much of the audio (woken as it hears more).
        self._partial = ""
        self._heard_nbytes = 0
        self._progress = trio.Event()

    @property
    def streams(self) -> bool:
        """Whether the recording is heard as it comes (:meth:`start` found a stream)."""
        return self._streamed is not None

    def start(self, nursery: trio.Nursery, on_partial: Callable[[str], None] = lambda text: None) -> None:
        """Hear the audio as it comes, in ``nursery``, if the recognizer streams; its words so
        far go to ``on_partial`` as they change.

        Raises:
            ValueError: The recognizer cannot take audio at this rate.
        """
        stream = self.stt.open_stream(self.rate_hz)
        if stream is None:
            return
        send, receive = trio.open_memory_channel[bytes](math.inf)
        self._feed = send
        self._streamed = _StreamedWords()
        nursery.start_soon(self._recognize, stream, receive, on_partial)

    def add(self, pcm: bytes) -> None:
        """More of the caller's audio."""
        self.audio += pcm
        if self._feed is not None:
            self._feed.send_nowait(pcm)

    def close(self, *, hear: bool = False) -> None:
        """No more audio; ``hear``: its words are wanted (else the recognition stops at once)."""
        if self._feed is not None:
            self._feed.close()
        if not hear:
            self._scope.cancel()

    def pcm(self) -> bytes:
        return bytes(self.audio[: len(self.audio) // 2 * 2])

    async def words_so_far(self) -> str:
        """The stream's words in all the audio added so far, once it has heard that audio.

        Raises:
            ProviderError: The recognition stopped before it heard it all.
        """
        streamed = self._streamed
        assert streamed is not None, "only a recording that streams has words so far"
        wanted = len(self.audio) // 2 * 2
        while self._heard_nbytes < wanted and not streamed.done:
            await self._progress.wait()
        if self._heard_nbytes < wanted:
            return (await streamed.wait()).strip()
        await trio.lowlevel.checkpoint()
        return self._partial.strip()

    async def words(self) -> tuple[str, float]:
        """The whole recording's words and length.

        Raises:
            ProviderError: The recognizer failed (any failure of it is ``provider_failed``).
        """
        pcm = self.pcm()
        seconds = pcm_seconds(len(pcm), self.rate_hz)
        if rms_dbfs(pcm) < SILENCE_DBFS:
            await trio.lowlevel.checkpoint()
            return "", seconds
        try:
            if self._streamed is not None:
                return (await self._streamed.wait()).strip(), seconds
            transcript = await self.stt.transcribe(pcm, self.rate_hz)
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError("provider_failed", f"transcription failed: {exc}") from exc
        return str(transcript.text).strip(), seconds

    async def _recognize(
        self,
        stream: SpeechStream,
        chunks: trio.MemoryReceiveChannel[bytes],
        on_partial: Callable[[str], None],
    ) -> None:
        """Feed the stream as audio comes; once the recording ends, its ``finish`` is the recording's words."""
        streamed = self._streamed
        assert streamed is not None
        carry = b""
        try:
            with self._scope:
                async with stream:
                    async for first in chunks:
                        pieces = [carry, first]
                        while True:
                            try:
                                pieces.append(chunks.receive_nowait())
                            except (trio.WouldBlock, trio.EndOfChannel):
                                break
                        data = b"".join(pieces)
                        cut = len(data) // 2 * 2
                        data, carry = data[:cut], data[cut:]
                        # pocketsphinx holds the GIL while it decodes: feed it at most 100 ms
                        # at a time, so the runner's other tasks run between the pieces.
                        step = self.rate_hz * 2 // 10
                        text = None
                        for start in range(0, len(data), step):
                            text = await stream.feed(data[start : start + step]) or text
                        self._heard(cut, text)
                        if text:
                            on_partial(text)
                    streamed.set((await stream.finish()).text)
        except Exception as exc:  # noqa: BLE001 - any recognizer failure loses this recording, not the call
            log.warning("recognition stopped: %s", exc)
            streamed.fail(
                exc
                if isinstance(exc, ProviderError)
                else ProviderError("provider_failed", f"recognition failed: {exc}")
            )
        finally:
            # Cancelled (the recording was thrown away, the socket closed): nobody should wait.
            streamed.fail(
                ProviderError("provider_failed", "the recognition stopped before the recording ended")
            )
            self._heard(0, None)

    def _heard(self, nbytes: int, text: str | None) -> None:
        """The stream heard ``nbytes`` more of the audio; ``text``: its words so far, if they changed."""
        self._heard_nbytes += nbytes
        if text:
            self._partial = text
        self._progress.set()
        self._progress = trio.Event()
