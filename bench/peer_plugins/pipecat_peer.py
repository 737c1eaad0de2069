"""The Pipecat peer: one bot process per call, as Pipecat's docs run one in production.

    python pipecat_peer.py --url URL --token TOKEN --room ROOM     (in the peer's venv)

A Pipecat 1.14 pipeline on its LiveKit transport: the caller's audio in, the recognizer below,
the user aggregator (Silero VAD with its defaults, stop after 0.2 s, and Smart Turn v3.2 deciding
the end of the turn: both inside Pipecat's wheel), the local model, the voice, the audio out,
the assistant aggregator. It greets with the runner's agent's greeting (bench/_voice_agents.py:
``new``) once the caller is in, and ends when the caller leaves.

The plugins, each through the interface Pipecat's docs give a service:

* ``WhisperSTT``: a ``SegmentedSTTService`` (one decode per VAD segment of raw 16 kHz PCM, as
  Pipecat's own Whisper service runs), whose ``run_stt`` yields a ``TranscriptionFrame``.
* ``HibariTTS``: a ``TTSService`` whose ``run_tts`` yields ``TTSAudioRawFrame``s at 24 kHz;
  Pipecat aggregates the reply into sentences for it.
* ``LocalLLM``: an ``LLMService`` answering each ``LLMContextFrame`` with the runner's local
  model, in ``LLMTextFrame``s of three words, as that model streams.

What it heard and its metrics go to ``$CURB_PEER_LOG``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import peer_speech
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.services.tts_service import TTSService
from pipecat.transports.livekit.transport import LiveKitParams, LiveKitTransport
from pipecat.utils.time import time_now_iso8601


class WhisperSTT(SegmentedSTTService):
    def __init__(self, recognizer: peer_speech.Recognizer, room: str, **kwargs: Any) -> None:
        super().__init__(sample_rate=peer_speech.RATE_HZ, **kwargs)
        self.recognizer = recognizer
        self.room = room

    @property
    def wants_wav_segments(self) -> bool:
        return False  # the model reads raw 16-bit PCM

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        await self.start_processing_metrics()
        text = await asyncio.to_thread(self.recognizer.decode_pcm, audio)
        await self.stop_processing_metrics()
        peer_speech.note("heard", room=self.room, text=text)
        if text:
            yield TranscriptionFrame(text, self._user_id, time_now_iso8601())


class HibariTTS(TTSService):
    def __init__(self, voice: peer_speech.Voice, **kwargs: Any) -> None:
        super().__init__(
            sample_rate=peer_speech.VOICE_RATE_HZ, push_start_frame=True, push_stop_frames=True, **kwargs
        )
        self.voice = voice

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        phrases = self.voice.speak(text)
        while (pcm := await asyncio.to_thread(next, phrases, None)) is not None:
            await self.stop_ttfb_metrics()
            yield TTSAudioRawFrame(
                audio=pcm, sample_rate=peer_speech.VOICE_RATE_HZ, num_channels=1, context_id=context_id
            )


class LocalLLM(LLMService):
    def can_generate_metrics(self) -> bool:
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        history = [
            (m["role"], m["content"] if isinstance(m["content"], str) else "")
            for m in frame.context.get_messages()
            if isinstance(m, dict) and m.get("role") in ("user", "assistant")
        ]
        await self.push_frame(LLMFullResponseStartFrame())
        await self.start_processing_metrics()
        await self.start_ttfb_metrics()
        words = peer_speech.reply(history).split()
        for start in range(0, len(words), 3):
            await self.stop_ttfb_metrics()
            piece = " ".join(words[start : start + 3]) + (" " if start + 3 < len(words) else "")
            await self.push_frame(LLMTextFrame(piece))
        await self.stop_processing_metrics()
        await self.push_frame(LLMFullResponseEndFrame())


class MetricsNote(FrameProcessor):
    """Writes each ``MetricsFrame`` to the bench's log, and passes every frame on."""

    def __init__(self, room: str) -> None:
        super().__init__()
        self.room = room

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, MetricsFrame):
            for data in frame.data:
                metrics = data.model_dump(mode="json") | {"type": type(data).__name__}
                peer_speech.note("metrics", room=self.room, metrics=metrics)
        await self.push_frame(frame, direction)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--room", required=True)
    args = parser.parse_args()

    recognizer, voice = peer_speech.Recognizer(), peer_speech.Voice()
    recognizer.decode(np.zeros(peer_speech.RATE_HZ, dtype=np.float32))
    list(voice.speak("Ready."))

    transport = LiveKitTransport(
        url=args.url,
        token=args.token,
        room_name=args.room,
        params=LiveKitParams(
            audio_in_enabled=True,
            audio_in_sample_rate=peer_speech.RATE_HZ,
            audio_out_enabled=True,
            audio_out_sample_rate=peer_speech.VOICE_RATE_HZ,
        ),
    )
    context = LLMContext([{"role": "system", "content": peer_speech.INSTRUCTIONS}])
    aggregators = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
    )
    pipeline = Pipeline(
        [
            transport.input(),
            WhisperSTT(recognizer, args.room),
            aggregators.user(),
            LocalLLM(),
            HibariTTS(voice),
            transport.output(),
            aggregators.assistant(),
            MetricsNote(args.room),
        ]
    )
    task = PipelineTask(pipeline, params=PipelineParams(enable_metrics=True))

    @transport.event_handler("on_first_participant_joined")
    async def on_first_participant_joined(_transport: Any, participant_id: str) -> None:
        peer_speech.note("joined", room=args.room)
        await task.queue_frames([TTSSpeakFrame(peer_speech.GREETING)])

    @transport.event_handler("on_participant_disconnected")
    async def on_participant_disconnected(_transport: Any, participant_id: str) -> None:
        await task.cancel()

    await PipelineRunner(handle_sigint=True).run(task)


if __name__ == "__main__":
    asyncio.run(main())
