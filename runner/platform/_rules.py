"""The platform's rules, as pure functions: ids, moods, summaries, what a turn costs."""

from __future__ import annotations

import re
import secrets
import uuid
from typing import TYPE_CHECKING

from journal import UsageRow, now_ms

from ..providers import ChatMessage
from ..voice.events import TurnResult

if TYPE_CHECKING:
    from ..agent import Agent

# The rate recordings are heard at when their frame names none.
HEARING_RATE_HZ = 16_000
# The platform's own tools, offered by the agent's options.
KNOWLEDGE_TOOL = "search_knowledge"
RELATION_TOOL = "record_relationship"
KNOWLEDGE_HITS = 3
MAX_NOTE_CHARS = 500
# What a turn costs, in credits: per 1,000 model tokens (input and output), and per minute
# of transcription and of speech.
CREDITS_PER_1K_TOKENS = 1.0
CREDITS_PER_TRANSCRIPTION_MINUTE = 1.0
CREDITS_PER_SPEECH_MINUTE = 1.0
_AGENT_NAMESPACE = uuid.UUID("5b0c7c3e-0e51-4c57-9f57-8f1f3c1a6e21")
_WORD = re.compile(r"[a-z0-9']+")


def agent_id_of(agent: Agent) -> str:
    """A stable id for the agent this runner serves, the same across restarts."""
    return str(uuid.uuid5(_AGENT_NAMESPACE, agent.name))


def new_session_id() -> str:
    """A time-ordered id (UUIDv7 layout), so conversations sort by creation."""
    value = (
        (now_ms() & ((1 << 48) - 1)) << 80
        | 0x7 << 76
        | secrets.randbits(12) << 64
        | 0b10 << 62
        | secrets.randbits(62)
    )
    return str(uuid.UUID(int=value))


def with_stop(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


# A small lexicon: the mood of a reply is the one whose words it uses most (ties: the
# earlier mood here); each word found adds 0.2 to its intensity, from 0.4, up to 1.
MOODS: tuple[tuple[str, frozenset[str]], ...] = (
    ("apologetic", frozenset({"sorry", "unfortunately", "afraid", "apologies", "cannot", "can't", "unable"})),
    (
        "cheerful",
        frozenset(
            {
                "welcome",
                "hello",
                "glad",
                "happy",
                "lovely",
                "great",
                "wonderful",
                "enjoy",
                "delighted",
                "sunny",
            }
        ),
    ),
    (
        "concerned",
        frozenset({"careful", "warning", "danger", "snowing", "storm", "late", "problem", "costs"}),
    ),
)
NEUTRAL_MOOD = ("calm", 0.2)


def mood_of(text: str) -> tuple[str, float]:
    """The mood a reply reports, and its intensity: deterministic, from :data:`MOODS`."""
    found_words = _WORD.findall(text.lower())
    best, count = NEUTRAL_MOOD[0], 0
    for mood, lexicon in MOODS:
        found = sum(1 for word in found_words if word in lexicon)
        if found > count:
            best, count = mood, found
    if count == 0:
        return NEUTRAL_MOOD
    return best, round(min(1.0, 0.2 + 0.2 * count), 2)


def summarise(previous: str | None, messages: list[ChatMessage]) -> str:
    """A conversation's summary: the one before it, then what each side said, one sentence each."""
    lines = [previous] if previous else ["Summary of the conversation so far."]
    for message in messages:
        text = " ".join(message.content.split())
        if not text or message.role not in ("user", "assistant"):
            continue
        who = "The person said:" if message.role == "user" else "You answered:"
        lines.append(f"{who} {with_stop(text)}")
    return "\n".join(lines)


def usage_rows(result: TurnResult, speech_seconds: float) -> list[UsageRow]:
    """A turn's usage rows: model tokens, transcription seconds, speech seconds (each when used)."""
    rows = []
    if result.usage:
        tokens_in = sum(u.input_tokens for u in result.usage)
        tokens_out = sum(u.output_tokens for u in result.usage)
        rows.append(
            UsageRow(
                kind="model",
                model=result.usage[-1].model,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                credits=(tokens_in + tokens_out) / 1000 * CREDITS_PER_1K_TOKENS,
            )
        )
    if result.heard_seconds:
        rows.append(transcription_row(result.heard_seconds))
    if speech_seconds > 0:
        rows.append(
            UsageRow(
                kind="speech",
                seconds=round(speech_seconds, 3),
                credits=speech_seconds / 60 * CREDITS_PER_SPEECH_MINUTE,
            )
        )
    return rows


def transcription_row(seconds: float) -> UsageRow:
    return UsageRow(
        kind="transcription",
        seconds=round(seconds, 3),
        credits=seconds / 60 * CREDITS_PER_TRANSCRIPTION_MINUTE,
    )
