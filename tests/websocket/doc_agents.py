"""The agent of docs/agent-websocket.md's complete exchange (``tests/websocket/test_ino_exchange.py``)."""

from __future__ import annotations

from runner.agent import TTS, Agent

pizzeria = Agent(
    "pizzeria",
    instructions="You take orders for Luigi's pizzeria. We open at noon.",
    greeting="Luigi's, hello!",
    tts=TTS(provider="espeak", voice="en"),
)
