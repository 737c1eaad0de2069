"""The two embedded voices bench/livekit_voice.py compares, as agents a runner serves.

``old``: the light options, the defaults before issue 18 (energy VAD, pocketsphinx,
espeak-ng). ``new``: the embedded defaults (Silero VAD with decoding at pauses and early
model requests, Whisper tiny.en, hibari, the end-of-turn model). Both think with the local
model; without the end-of-turn model a turn ends after 500 ms of quiet (``new_silence``: always).
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

NEW = {
    "instructions": INSTRUCTIONS,
    "llm": LLM(provider="local", model="local"),
    "tts": TTS(provider="hibari", voice="heart"),
    "stt": STT(provider="whisper", language="en"),
    "greeting": "Hello there.",
    "vad": "silero",
    "end_of_turn_silence_ms": 500,
}
new = Agent("voice-new", **NEW)
# The new agent with the fixed end of turn (500 ms of quiet) instead of the end-of-turn model:
# the rule livekit-agents' default endpointing follows (bench/peers.py: curb_silence).
new_silence = Agent("voice-new-silence", turn_detection="silence", **NEW)
