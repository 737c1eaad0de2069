"""The agent's voice: its speech resampled to 48 kHz, cut in 20 ms frames and played on the
track the agent publishes in the room; a barge-in drops what is queued."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any

import trio
from livekit import rtc

from ._loop import CALL_TIMEOUT_S, LoopThread

AUDIO_OUT_RATE_HZ = 48_000
AUDIO_OUT_FRAME_MS = 20
AUDIO_OUT_QUEUE_MS = 200  # how far publish_audio runs ahead of what the caller hears
RESAMPLER_FLUSH_IDLE_S = 0.06  # flush the resampler's tail once no more speech follows


class AgentVoice:
    """The agent's audio track. :meth:`publish` and :meth:`clear` are called from Trio; the
    ``a_*`` methods run on the session's loop.

    Args:
        thread: The session's loop thread.
        spawn: Starts a task on the loop that the session cancels when it leaves.
    """

    def __init__(self, thread: LoopThread, spawn: Callable[[Coroutine[Any, Any, Any]], object]) -> None:
        self._thread = thread
        self._spawn = spawn
        # Trio side.
        self._lock = trio.Lock()
        self._generation = 0
        # Loop side.
        self._source: rtc.AudioSource | None = None
        self._a_generation = 0
        self._a_resampler: tuple[int, rtc.AudioResampler] | None = None
        self._a_flush_timer: asyncio.TimerHandle | None = None
        self._a_play_lock: asyncio.Lock | None = None

    async def publish(self, pcm: bytes, sample_rate_hz: int) -> None:
        """Play agent speech; returns once it is queued no more than ~200 ms ahead of playout."""
        if not pcm:
            await trio.lowlevel.checkpoint()
            return
        if sample_rate_hz <= 0 or len(pcm) % 2:
            raise ValueError("publish_audio takes whole 16-bit samples at a positive rate")
        generation = self._generation
        seconds = len(pcm) / 2 / sample_rate_hz
        async with self._lock:
            if generation != self._generation:
                return  # cleared while it waited its turn
            await self._thread.run(
                lambda: self._a_play(pcm, sample_rate_hz, generation),
                timeout_s=seconds + CALL_TIMEOUT_S,
                what="play the agent's speech",
            )

    async def clear(self) -> None:
        """Drop the agent's speech still queued (a barge-in)."""
        self._generation += 1
        generation = self._generation
        await self._thread.run(
            lambda: self._a_clear(generation), timeout_s=CALL_TIMEOUT_S, what="clear the agent's speech"
        )

    async def a_open(self, local: rtc.LocalParticipant) -> None:
        """Publish the voice's track in the room ``local`` joined."""
        loop = asyncio.get_running_loop()
        self._a_play_lock = asyncio.Lock()
        source = rtc.AudioSource(AUDIO_OUT_RATE_HZ, 1, queue_size_ms=AUDIO_OUT_QUEUE_MS, loop=loop)
        self._source = source
        track = rtc.LocalAudioTrack.create_audio_track("agent-voice", source)
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        await local.publish_track(track, options)

    async def a_drain(self, *, connected: bool) -> None:
        """Let the last words out while the room is ``connected`` (what is queued is at most
        AUDIO_OUT_QUEUE_MS); then flush no more."""
        if self._source is not None and connected:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._a_drain_speech(), AUDIO_OUT_QUEUE_MS / 1000 + 0.3)
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()

    async def a_close(self) -> None:
        """Close the track's source (the room is left)."""
        if self._source is not None:
            await self._source.aclose()

    async def _a_drain_speech(self) -> None:
        assert self._source is not None
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()
            await self._a_flush(self._a_generation)
        await self._source.wait_for_playout()

    def _a_frames(self, pcm: bytes, rate: int) -> list[rtc.AudioFrame]:
        if rate != AUDIO_OUT_RATE_HZ:
            if self._a_resampler is None or self._a_resampler[0] != rate:
                self._a_resampler = (rate, rtc.AudioResampler(rate, AUDIO_OUT_RATE_HZ, num_channels=1))
            data = b"".join(bytes(f.data) for f in self._a_resampler[1].push(bytearray(pcm)))
        else:
            data = pcm
        return _split(data)

    async def _a_capture(self, frames: list[rtc.AudioFrame], generation: int) -> None:
        assert self._source is not None
        for frame in frames:
            if generation != self._a_generation:
                return
            await self._source.capture_frame(frame)

    async def _a_play(self, pcm: bytes, rate: int, generation: int) -> None:
        assert self._a_play_lock is not None
        async with self._a_play_lock:
            if self._a_flush_timer is not None:
                self._a_flush_timer.cancel()
                self._a_flush_timer = None
            if generation != self._a_generation:
                return
            await self._a_capture(self._a_frames(pcm, rate), generation)
            if self._a_resampler is not None:
                # A streaming resampler holds a few ms back; let them out once speech pauses.
                loop = asyncio.get_running_loop()
                self._a_flush_timer = loop.call_later(
                    RESAMPLER_FLUSH_IDLE_S, lambda: self._spawn(self._a_flush(generation))
                )

    async def _a_flush(self, generation: int) -> None:
        assert self._a_play_lock is not None
        self._a_flush_timer = None
        async with self._a_play_lock:
            if self._a_resampler is None or generation != self._a_generation:
                return
            data = b"".join(bytes(f.data) for f in self._a_resampler[1].flush())
            await self._a_capture(_split(data), generation)

    async def _a_clear(self, generation: int) -> None:
        self._a_generation = generation
        if self._a_flush_timer is not None:
            self._a_flush_timer.cancel()
            self._a_flush_timer = None
        self._a_resampler = None
        if self._source is not None:
            self._source.clear_queue()


def _split(data: bytes) -> list[rtc.AudioFrame]:
    step = AUDIO_OUT_RATE_HZ * AUDIO_OUT_FRAME_MS // 1000 * 2
    frames = []
    for start in range(0, len(data), step):
        chunk = data[start : start + step]
        frames.append(rtc.AudioFrame(chunk, AUDIO_OUT_RATE_HZ, 1, len(chunk) // 2))
    return frames
