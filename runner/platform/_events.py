"""What a conversation reports to the people in it: the turn engine's events, and its own.

A transport turns these into whatever its callers read (the agent WebSocket: ``ino.v2``
frames). Nothing here knows a socket or a frame.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from journal import KnowledgeHit, RelationRow, Spent

from ..voice.engine import (
    AudioData,
    AudioEnd,
    AudioStart,
    Heard,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    Thought,
    ToolConfirmRequested,
    ToolRecord,
    TurnResult,
    UsageReported,
)

# Whose tool a call is: the platform's own, the app's (run on the caller's side), or the
# agent's (run by the runner, a webhook to the app's view).
ToolKind = Literal["platform", "app", "webhook"]
# Where a turn was when it failed.
Stage = Literal["transcription", "model", "speech"]


@attrs.frozen(kw_only=True)
class Joined:
    """The participant is in the conversation; ``greeting``: the opening turn starts next."""

    conversation_id: str
    agent_id: str
    end_user_id: str
    voice_rate_hz: int | None
    moods: bool
    relation: RelationRow | None
    greeting: bool


@attrs.frozen(kw_only=True)
class TurnOpened:
    turn: str
    conversation_id: str


@attrs.frozen(kw_only=True)
class NoVoice:
    """Speech was asked for, but the agent has none: the reply is text only."""

    turn: str


@attrs.frozen(kw_only=True)
class Refused:
    """A turn the participant asked for was not taken, and why.

    ``busy``: another turn runs; ``not_waiting``: the confirmed tool call waits no more;
    ``ending``: the call is ending.
    """

    reason: Literal["busy", "not_waiting", "ending"]


@attrs.frozen(kw_only=True)
class KnowledgeSearched:
    turn: str
    via: Literal["first", "tool"]
    outcome: Literal["found", "none", "failed"]
    hits: tuple[KnowledgeHit, ...]


@attrs.frozen(kw_only=True)
class MoodJudged:
    """How the agent feels in its reply so far: once its text is written, before the usage."""

    turn: str
    mood: str
    intensity: float


@attrs.frozen(kw_only=True)
class ToolOpened:
    turn: str
    call_id: str
    name: str
    kind: ToolKind


@attrs.frozen(kw_only=True)
class ToolClosed:
    """A tool call ended; one cut short by the turn's end closes with ``ok=False``."""

    turn: str
    call_id: str
    name: str
    kind: ToolKind
    ok: bool
    ms: int


@attrs.frozen(kw_only=True)
class AppToolCalled:
    """The model called a tool the participant's app runs; its answer goes to :meth:`app_result`."""

    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    action_only: bool
    timeout_ms: int


@attrs.frozen(kw_only=True)
class BargedIn:
    """A recording heard the person over the agent; their running turn (``turn``) is cancelled."""

    text: str
    recording_id: str | None
    turn: str | None


@attrs.frozen(kw_only=True)
class TurnFailed:
    """The turn failed on the runner's side; ``text`` is what the reply had said."""

    turn: str
    text: str


@attrs.frozen(kw_only=True)
class TurnClosed:
    """The turn's end: its result, its mood, and what it recorded about the person.

    Attributes:
        reason: For an interrupted turn, why (``cancel``, ``barge_in``, ``provider_failed``...).
        stage: Where an interrupted turn with an error was.
        tool_kinds: The kind of each tool call of the result, by call id.
    """

    turn: str
    conversation_id: str
    result: TurnResult
    mood: tuple[str, float] | None
    relation: RelationRow | None
    reason: str
    stage: Stage
    tool_kinds: dict[str, ToolKind]

    def reported_tools(self) -> list[tuple[ToolRecord, ToolKind]]:
        """The calls a person's side sees: every one but the platform's own."""
        return [
            (call, self.tool_kinds[call.call_id])
            for call in self.result.tool_calls
            if self.tool_kinds[call.call_id] != "platform"
        ]


@attrs.frozen(kw_only=True)
class Compacted:
    """The stored messages up to ``after_position`` were folded into the summary."""

    conversation_id: str
    after_position: int
    trigger: Literal["automatic", "manual"]


@attrs.frozen(kw_only=True)
class Charged:
    """A turn or a transcription of the participant was charged; ``spent`` is where the totals stand."""

    token_id: str
    spent: Spent


ConversationEvent = (
    Joined
    | TurnOpened
    | NoVoice
    | Refused
    | KnowledgeSearched
    | MoodJudged
    | ToolOpened
    | ToolClosed
    | AppToolCalled
    | BargedIn
    | TurnFailed
    | TurnClosed
    | Compacted
    | Charged
    | Heard
    | Thought
    | ReplyDelta
    | ReplyChunk
    | AudioStart
    | AudioData
    | AudioEnd
    | ToolConfirmRequested
    | UsageReported
    | SpeechFailed
    | Muted
)
