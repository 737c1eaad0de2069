"""Thinking summaries through the socket of a real runner: ``thought.delta`` only for a frame
that asked (``thoughts: true``) on an agent whose ``thinking_summaries`` is ``auto``; never in
``turn.done.message`` nor the stored transcript. The local model's summaries are the rule it
followed (see ``LocalLLM``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .ino_client import connect, start_ino_runner

pytestmark = pytest.mark.slow

CHECKOUT = "Checkout is at noon, and late checkout costs twenty euros."


def _types(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


async def test_thoughts_when_asked_and_allowed_and_never_in_the_reply(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "4", agent="thinking") as (_, addresses):
        api = addresses.api()
        token, session_id = await api.person("eu-thinker")
        async with connect(addresses, token, session_id) as sock:
            frames = await sock.say("When is checkout?", thoughts=True)
            kinds = _types(frames)
            assert kinds.index("thought.delta") < kinds.index("text.delta")
            [thought] = [f for f in frames if f["type"] == "thought.delta"]
            turn = frames[0]["turn"]
            assert thought["turn"] == turn and isinstance(thought["seq"], int)
            assert thought["text"] == (
                "Looking at the tools: none matches. The instructions speak of 'checkout': I answer with that sentence."
            )
            done = frames[-1]
            assert done["type"] == "turn.done" and done["message"] == CHECKOUT
            usage = next(f for f in frames if f["type"] == "usage")
            assert usage["thought_tokens"] == len(thought["text"].split())

            # A tool round: a thought for each model call, each before that call's output.
            frames = await sock.say("What is the weather in Lisbon?", thoughts=True)
            thoughts = [f["text"] for f in frames if f["type"] == "thought.delta"]
            assert thoughts == [
                "Looking at the tools: weather matches 'weather'.",
                "The tool results are in: I pass them on.",
            ]
            kinds = _types(frames)
            assert kinds.index("thought.delta") < kinds.index("tool.start")
            assert frames[-1]["message"] == "In Lisbon it is sunny and 24 degrees."

            # Allowed but not asked: none.
            sock.checker.thoughts_allowed = False
            frames = await sock.say("When is checkout?")
            assert "thought.delta" not in _types(frames)
            assert frames[-1]["message"] == CHECKOUT
            frames = await sock.say("When is checkout?", thoughts=False)
            assert "thought.delta" not in _types(frames)
        stored = json.dumps(await api.messages(session_id, token))
        assert CHECKOUT in stored
        for text in ("Looking at the tools", "instructions speak of", "The tool results are in"):
            assert text not in stored


async def test_no_thoughts_when_the_agent_does_not_allow_them(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "4", agent="text_only") as (
        _,
        addresses,
    ):
        api = addresses.api()
        token, session_id = await api.person("eu-curious")
        async with connect(addresses, token, session_id) as sock:
            sock.checker.thoughts_allowed = False
            frames = await sock.say("When is checkout?", thoughts=True)
            assert "thought.delta" not in _types(frames)
            assert frames[-1]["type"] == "turn.done" and frames[-1]["message"] == CHECKOUT
            usage = next(f for f in frames if f["type"] == "usage")
            assert usage["thought_tokens"] == 0
