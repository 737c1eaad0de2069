"""What the runner sends: each field written (``null`` where it does not apply).

A turn's events whose frame says just what the event says (``text.delta``, ``heard``,
``audio.end``, ``tool.confirm``...) are written as they are, with the frame's type from the
socket's table (``runner.transports.websocket``): their fields are declared once, in the
vocabulary of turn events (``runner.voice.events``). The frames here say something more or
other than an event: the socket's own (``ready``, ``transcript``, ``error``), a turn's
beginning and end as the socket tells them, and those whose fields the page names otherwise.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal

import attrs

from ._limits import CODEC, PROTOCOL

# -- What the runner sends -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AudioFormat:
    codec: str = CODEC
    sample_rate: int
    channels: int = 1


@attrs.frozen(kw_only=True)
class RelationNoteBody:
    note: str
    recorded_at: str


@attrs.frozen(kw_only=True)
class RelationBody:
    """The standing relationship of the agent with a person (``ready.relation``, ``GET /v1/agent/relations``)."""

    agent_id: str
    end_user_id: str
    conversations: int
    first_at: str
    last_at: str
    notes: list[RelationNoteBody]


@attrs.frozen(kw_only=True)
class Ready:
    TYPE: ClassVar[str] = "ready"
    protocol: str = PROTOCOL
    session_id: str
    agent_id: str
    end_user_id: str
    speaks: bool
    audio: AudioFormat
    hearing: AudioFormat
    emotion: bool
    relation: RelationBody | None
    greeting: bool
    idle_seconds: int
    edge_version: str


@attrs.frozen(kw_only=True)
class TurnStart:
    TYPE: ClassVar[str] = "turn.start"
    turn: str
    session_id: str


@attrs.frozen(kw_only=True)
class HeardPartial:
    TYPE: ClassVar[str] = "heard.partial"
    text: str


@attrs.frozen(kw_only=True)
class Transcript:
    TYPE: ClassVar[str] = "transcript"
    text: str
    audio_seconds: float
    request_id: str
    recording_id: str | None


@attrs.frozen(kw_only=True)
class KnowledgeEntry:
    entry_id: str
    title: str
    score: float


@attrs.frozen(kw_only=True)
class Knowledge:
    TYPE: ClassVar[str] = "knowledge"
    turn: str
    via: Literal["first", "tool"]
    outcome: Literal["found", "none", "failed"]
    entries: list[KnowledgeEntry]


# Whose tool a call is: the platform's own, the app's (run on the person's side), or the
# agent's (run by the runner: a webhook, in the app's view).
ToolKind = Literal["platform", "webhook", "app"]


@attrs.frozen(kw_only=True)
class ToolStart:
    TYPE: ClassVar[str] = "tool.start"
    turn: str
    name: str
    kind: ToolKind
    call_id: str | None


@attrs.frozen(kw_only=True)
class ToolEnd:
    TYPE: ClassVar[str] = "tool.end"
    turn: str
    name: str
    kind: ToolKind
    call_id: str | None
    ok: bool
    ms: int


@attrs.frozen(kw_only=True)
class AudioStart:
    TYPE: ClassVar[str] = "audio.start"
    turn: str
    chunk: int
    codec: str = CODEC
    sample_rate: int
    channels: int = 1


@attrs.frozen(kw_only=True)
class UsageFrame:
    TYPE: ClassVar[str] = "usage"
    turn: str
    model: str
    input_tokens: int
    output_tokens: int
    thought_tokens: int
    cached_tokens: int
    generation_seconds: float


@attrs.frozen(kw_only=True)
class ToolCallRecord:
    """One call of the app's or the agent's tools, as ``turn.done`` lists it."""

    call_id: str | None
    name: str
    kind: ToolKind
    arguments: dict[str, Any]
    result: Any
    ok: bool
    error: str | None
    ms: int
    round: int


@attrs.frozen(kw_only=True)
class Source:
    url: str
    retrieved: bool


@attrs.frozen(kw_only=True)
class TurnTimings:
    """How long a turn took: to the model's first text, to its first audio sent, in all."""

    model_first_text_ms: int | None
    first_audio_sent_ms: int | None
    total_ms: int


@attrs.frozen(kw_only=True)
class TurnDone:
    TYPE: ClassVar[str] = "turn.done"
    turn: str
    session_id: str
    message: str
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    mood: str | None
    mood_intensity: float | None
    truncated: bool
    chunks_spoken: int
    heard: str | None
    heard_seconds: float | None
    tool_calls: list[ToolCallRecord]
    sources: list[Source]
    timings: TurnTimings


@attrs.frozen(kw_only=True)
class Interrupted:
    TYPE: ClassVar[str] = "interrupted"
    turn: str
    message: str
    mood: str | None
    mood_intensity: float | None
    reason: str


@attrs.frozen(kw_only=True)
class Relation:
    """The relationship moved on this turn: its new fields, just after ``turn.done``."""

    TYPE: ClassVar[str] = "relation"
    turn: str
    agent_id: str
    end_user_id: str
    conversations: int
    first_at: str
    last_at: str
    notes: list[RelationNoteBody]


@attrs.frozen(kw_only=True)
class Compacted:
    TYPE: ClassVar[str] = "compacted"
    session_id: str
    after_seq: int
    trigger: Literal["automatic", "manual"]


ErrorCode = Literal[
    "conflict",
    "not_found",
    "invalid_request",
    "validation_failed",
    "rate_limited",
    "unavailable",
    "provider_failed",
    "insufficient_credits",
    "internal",
]
Stage = Literal["speech", "transcription", "model"]


@attrs.frozen(kw_only=True)
class Error:
    TYPE: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    turn: str | None = None
    stage: Stage | None = None
    chunk: int | None = None
    request_id: str | None = None
    recording_id: str | None = None


Event = (
    Ready
    | TurnStart
    | HeardPartial
    | Transcript
    | Knowledge
    | ToolStart
    | ToolEnd
    | AudioStart
    | UsageFrame
    | TurnDone
    | Interrupted
    | Compacted
    | Error
)
EVENTS: dict[str, type[Any]] = {cls.TYPE: cls for cls in typing.get_args(Event)}
# The turn's events written as they are are not here (see the socket's table). ``relation`` (:class:`Relation`) is sent but kept out of ``EVENTS``: its schema requires only
# ``turn`` (the page names the rest "the relationship's new fields"); ``pong`` has no seq.
PONG = '{"type":"pong"}'
