"""What the agent WebSocket's parts share: limits, close reasons, small helpers and setup."""

from __future__ import annotations

import logging
import re
import secrets
import uuid
from importlib import metadata
from typing import TYPE_CHECKING, Protocol

import attrs

from journal import RelationRow, UsageRow, now_ms

from ... import ino_wire as w
from ...errors import RunnerError
from ...providers import ChatMessage
from ...voice.engine import TurnResult

if TYPE_CHECKING:
    from ...agent import Agent

log = logging.getLogger("runner.websocket")

SCHEME = "ino"
AUTH_TIMEOUT_S = 10.0
DEFAULT_IDLE_SECONDS = 300
MAX_RECORDING_BYTES = 10_000_000
MAX_TRANSCRIBING = 3
MAX_CONNECTIONS_PER_END_USER = 3
HEARING_RATE_HZ = 16_000
# A recording quieter than this holds no speech (digital silence, a muted microphone).
SILENCE_DBFS = -70.0
DEFAULT_TTL_SECONDS = 600
MAX_TTL_SECONDS = 86_400
# Bounds on cleanup: a socket that leaves lets its turn unwind for this long.
_UNWIND_S = 10.0
_CLOSE_S = 5.0
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

CLOSE_REASONS = {
    4001: "No credentials were sent. Send auth as the first frame, within 10 seconds.",
    4002: "Invalid, revoked or expired credentials, or an API key instead of a token.",
    4003: "This token has expired. Mint another and reconnect.",
    4004: "This token was revoked, or has spent its credit limit.",
    4005: "Your organisation has no credits left.",
    4006: "Too many turns, or too many connections on one token. Slow down and reconnect.",
    4007: "Closed after a period with no activity. ping does not count as activity.",
    4008: "That conversation is not available: unknown, deleted, or its agent or person was deleted.",
    4009: "The frame could not be understood, or the session in the URL and the auth frame differ.",
    4010: "This capability is not available.",
    4011: "Unaccountable audio: too much for one turn, or no user_audio.start before it.",
    4013: "The connection failed on our side. Reconnect.",
    4014: "This end user already has 3 open connections.",
}


def edge_version() -> str:
    try:
        return metadata.version("curb-runner")
    except metadata.PackageNotFoundError:
        return "0.0.0"


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


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _with_stop(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def _wire_call_id(kind: w.ToolKind, call_id: str) -> str | None:
    """The platform's own calls carry no call_id on the wire."""
    return None if kind == "platform" else call_id


def relation_body(row: RelationRow) -> w.RelationBody:
    return w.RelationBody(
        agent_id=row.agent_id,
        end_user_id=row.end_user_id,
        conversations=row.conversations,
        first_at=w.rfc3339(row.first_at),
        last_at=w.rfc3339(row.last_at),
        notes=[w.RelationNoteBody(note=n.note, recorded_at=w.rfc3339(n.recorded_at)) for n in row.notes],
    )


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
    words = _WORD.findall(text.lower())
    best, count = NEUTRAL_MOOD[0], 0
    for mood, lexicon in MOODS:
        found = sum(1 for word in words if word in lexicon)
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
        lines.append(f"{who} {_with_stop(text)}")
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


class TurnRunning(RunnerError):
    """A conversation cannot be compacted while a turn of it runs."""

    status = 409
    code = "conflict"


class CloseSocket(Exception):
    """End the socket with ``code``; ``reason`` is the specific cause, else the code's own text."""

    def __init__(self, code: int, reason: str | None = None) -> None:
        self.code = code
        self.reason = (reason or CLOSE_REASONS.get(code, ""))[:120]
        super().__init__(f"{code} {self.reason}")


class SocketIO(Protocol):
    """What the driver needs from the server's WebSocket (Quart's, behind ``runner.api``)."""

    @property
    def requested_subprotocols(self) -> list[str]: ...

    async def accept(self, subprotocol: str | None) -> None: ...

    async def receive(self) -> str | bytes: ...

    async def send(self, data: str | bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@attrs.frozen(kw_only=True)
class AgentSocketSetup:
    """What a runner needs to serve the agent WebSocket on its public listener.

    Attributes:
        agent: The agent every conversation talks to.
        api_key: The key that mints ephemeral tokens (``CURB_API_KEY``); ``None``: none can be minted.
        idle_seconds: A socket with no activity for this long is closed with 4007.
        credit_pool: The runner's own credits (``CURB_CREDIT_POOL``); once every token's
            turns spent them, sockets close with 4005. ``None``: no pool.
        token_turns_per_minute: Turns one token may take a minute (4006 past it); ``None``: no limit.
        token_connections: Open sockets one token may hold (4006 past it); ``None``: no limit.
    """

    agent: Agent
    api_key: str | None
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    credit_pool: float | None = None
    token_turns_per_minute: int | None = None
    token_connections: int | None = None
