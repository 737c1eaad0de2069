"""The livekit-agents peer: its worker with its process pool, as its docs run one in production.

    python lk_agents_peer.py start        (in the peer's venv; LIVEKIT_URL, _API_KEY, _API_SECRET)

An ``AgentServer`` (livekit-agents 1.8) registers with the LiveKit server under the agent name
``peers-bench`` and is dispatched to each call's room (explicit dispatch); each job runs in a
process of its pool (forkserver, idle processes kept warm), where an ``AgentSession`` hears the
caller with Silero VAD (``livekit-plugins-silero``) and the thin plugins below, and answers with
the same greeting and instructions as the runner's agent (bench/_voice_agents.py: ``new``).

The plugins, each through the interface livekit-agents' docs give a plugin:

* ``WhisperSTT``: a non-streaming ``stt.STT`` (``_recognize_impl`` on one utterance); the
  session wraps it in its ``StreamAdapter`` with the VAD, as it does any batch recognizer.
* ``HibariTTS``: a non-streaming ``tts.TTS`` whose ``ChunkedStream`` pushes 24 kHz PCM; the
  session splits the reply into sentences for it (its own ``tts.StreamAdapter``).
* ``LocalLLM``: an ``llm.LLM`` whose ``LLMStream`` sends the runner's local model's answer in
  chunks of three words, as that model streams.

The session's settings: turn detection by the VAD, endpointing ``min_delay`` 0.5 s (its
default, and the runner's end of turn), preemptive generation on with preemptive TTS (the
faster of its settings; off by default), interruptions by the VAD, audio in at 16 kHz (what
both VAD and recognizer take). What it heard and its per-turn metrics go to ``$CURB_PEER_LOG``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import numpy as np
import peer_speech
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    Agent,
    AgentServer,
    AgentSession,
    APIConnectOptions,
    JobContext,
    JobProcess,
    cli,
    llm,
    room_io,
    stt,
    tts,
    utils,
)
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.plugins import silero

_recognizer: peer_speech.Recognizer | None = None
_voice: peer_speech.Voice | None = None


def _models() -> tuple[peer_speech.Recognizer, peer_speech.Voice]:
    global _recognizer, _voice
    if _recognizer is None or _voice is None:
        _recognizer, _voice = peer_speech.Recognizer(), peer_speech.Voice()
    return _recognizer, _voice


class WhisperSTT(stt.STT):
    def __init__(self, room: str) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=False, interim_results=False))
        self.room = room

    async def _recognize_impl(
        self,
        buffer: utils.AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> stt.SpeechEvent:
        frame = rtc.combine_audio_frames(buffer)
        if frame.sample_rate != peer_speech.RATE_HZ:
            resampler = rtc.AudioResampler(frame.sample_rate, peer_speech.RATE_HZ)
            frame = rtc.combine_audio_frames([*resampler.push(frame), *resampler.flush()])
        recognizer, _ = _models()
        text = await asyncio.to_thread(recognizer.decode_pcm, bytes(frame.data))
        peer_speech.note("heard", room=self.room, text=text)
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT,
            alternatives=[stt.SpeechData(language="en", text=text)],
        )


class _Spoken(tts.ChunkedStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=uuid.uuid4().hex,
            sample_rate=peer_speech.VOICE_RATE_HZ,
            num_channels=1,
            mime_type="audio/pcm",
        )
        _, voice = _models()
        phrases = voice.speak(self.input_text)
        while (pcm := await asyncio.to_thread(next, phrases, None)) is not None:
            output_emitter.push(pcm)
        output_emitter.flush()


class HibariTTS(tts.TTS):
    def __init__(self) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=False),
            sample_rate=peer_speech.VOICE_RATE_HZ,
            num_channels=1,
        )

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return _Spoken(tts=self, input_text=text, conn_options=conn_options)


class _Answer(llm.LLMStream):
    async def _run(self) -> None:
        history = [
            (item.role, item.text_content or "")
            for item in self.chat_ctx.items
            if item.type == "message" and item.role in ("user", "assistant")
        ]
        words = peer_speech.reply(history).split()
        request = uuid.uuid4().hex
        for start in range(0, len(words), 3):
            piece = " ".join(words[start : start + 3]) + (" " if start + 3 < len(words) else "")
            self._event_ch.send_nowait(
                llm.ChatChunk(id=request, delta=llm.ChoiceDelta(role="assistant", content=piece))
            )


class LocalLLM(llm.LLM):
    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[Any] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        **_: Any,
    ) -> llm.LLMStream:
        return _Answer(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


def prewarm(proc: JobProcess) -> None:
    """Each pool process loads its models before it takes a job (livekit-agents' ``setup_fnc``)."""
    proc.userdata["vad"] = silero.VAD.load()
    recognizer, voice = _models()
    recognizer.decode(np.zeros(peer_speech.RATE_HZ, dtype=np.float32))
    list(voice.speak("Ready."))


def no_load(_server: AgentServer) -> float:
    """The worker's load as the bench reports it: none, so it never turns a call away."""
    return 0.0


server = AgentServer(
    setup_fnc=prewarm,
    # By default the worker measures the whole machine's CPU and takes no job above 0.7 of it
    # (0.99 at most in production); on a machine shared with the caller and the server (and
    # pinned to one core) it refused every call. The bench measures when latency doubles
    # instead, so the worker reports no load.
    load_fnc=no_load,
    # Its default (10 s) is shorter than loading the three models takes in a new pool process
    # on one busy core: the pool killed each one before it was ready and started it again.
    initialize_process_timeout=120.0,
    port=0,
)


# Explicit dispatch: the bench sends it to its own calls' rooms only (automatic dispatch would
# send it into every new room of the server, the other agents' too).
@server.rtc_session(agent_name="peers-bench")
async def entrypoint(ctx: JobContext) -> None:
    session = AgentSession(
        vad=ctx.proc.userdata["vad"],
        stt=WhisperSTT(ctx.room.name),
        llm=LocalLLM(),
        tts=HibariTTS(),
        turn_handling={
            "turn_detection": "vad",
            "endpointing": {"mode": "fixed", "min_delay": 0.5},
            "interruption": {"mode": "vad"},
            "preemptive_generation": {"enabled": True, "preemptive_tts": True},
        },
    )

    @session.on("metrics_collected")
    def _metrics(event: Any) -> None:
        peer_speech.note("metrics", room=ctx.room.name, metrics=event.metrics.model_dump(mode="json"))

    await session.start(
        agent=Agent(instructions=peer_speech.INSTRUCTIONS),
        room=ctx.room,
        room_options=room_io.RoomOptions(audio_input=room_io.AudioInputOptions(sample_rate=16_000)),
    )
    peer_speech.note("joined", room=ctx.room.name, pid=os.getpid())
    await session.say(peer_speech.GREETING)


if __name__ == "__main__":
    cli.run_app(server)
