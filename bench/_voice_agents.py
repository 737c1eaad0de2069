"""The two embedded voices bench/livekit_voice.py compares, as agents a runner serves.

``old``: the light options, the defaults before issue 18 (energy VAD, pocketsphinx,
espeak-ng). ``new``: the embedded defaults (Silero VAD with decoding at pauses and early
model requests, Whisper tiny.en, hibari). Both think with the local model and end a turn
after 500 ms of quiet.
"""

from __future__ import annotations

from runner.agent import LLM, STT, TTS, Agent

INSTRUCTIONS = "Thank you very much, my name is Mary. The garden room serves breakfast from seven to eleven."

old = Agent(
    "voice-old",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en"),
    stt=STT(provider="pocketsphinx", language="en"),
    greeting="Hello there.",
    vad="energy",
    end_of_turn_silence_ms=500,
)

new = Agent(
    "voice-new",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting="Hello there.",
    vad="silero",
    end_of_turn_silence_ms=500,
)
